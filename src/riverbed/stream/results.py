"""The result table: one Parquet directory per batch under ``<output>/batch_id=<id>/``
(written atomically, replaced whole by a re-run), one schema whichever path wrote a
batch, and the compaction that folds old batch directories together."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa

from riverbed.stream.aggregation import Aggregation

log = logging.getLogger(__name__)


def output_schema(spec: Aggregation) -> str:
    cols = ["window_start timestamp", "window_end timestamp", "key string"]
    for name, metric in spec.metrics.items():
        kind = type(metric).__name__
        if kind == "Count":
            cols.append(f"{name} long")
        elif kind == "Distinct":
            cols += [f"{name} long", f"{name}_is_exact boolean", f"{name}_error double"]
        else:
            cols.append(f"{name} double")
    cols += ["batch_id long"]
    return ", ".join(cols)


def output_arrow_schema(spec: Aggregation) -> pa.Schema:
    types = {
        "timestamp": pa.timestamp("us", tz="UTC"),
        "string": pa.string(),
        "long": pa.int64(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
    }
    return pa.schema(
        [(name, types[kind]) for name, kind in (c.split() for c in output_schema(spec).split(", "))]
    )


def empty_rows(spec: Aggregation) -> pd.DataFrame:
    """A batch that emitted nothing, with the output's columns and types."""
    return output_arrow_schema(spec).empty_table().to_pandas()


def write_output(
    output: str, spec: Aggregation, batch_id: int, rows: pd.DataFrame | pa.Table
) -> pa.Table:
    """Replace ``<output>/batch_id=<id>/`` with ``rows`` (atomic per batch directory);
    returns what was written. Both paths write through here, so the table has one
    Parquet schema (timestamps as UTC microseconds) whichever path wrote a batch."""
    import shutil

    import pyarrow.parquet as pq

    schema = output_arrow_schema(spec)
    if isinstance(rows, pa.Table):
        table = rows.select(schema.names).cast(schema)
    else:
        table = pa.Table.from_pandas(rows, schema=schema, preserve_index=False)
    root = Path(output)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".batch_id={batch_id}.{uuid.uuid4().hex}"
    tmp.mkdir()
    pq.write_table(table, tmp / "part-00000.parquet")
    target = root / f"batch_id={batch_id}"
    if target.exists():  # a re-run replaces its own output (never what compaction put there)
        for carried in target.glob("compacted-*.parquet"):
            carried.rename(tmp / carried.name)
        shutil.rmtree(target)
    tmp.rename(target)
    return table


COMPACT_AFTER = 100  # batch directories of the result table before they are folded


def _batch_dirs(root: Path) -> list[int]:
    return sorted(
        int(p.name.split("=", 1)[1])
        for p in root.glob("batch_id=*")
        if p.is_dir() and p.name.split("=", 1)[1].isdigit()
    )


def compact_output(output: str, spec: Aggregation, upto: int) -> int:
    """Fold the result table's batch directories before ``upto`` into ``batch_id=upto``
    once there are ``COMPACT_AFTER`` of them; returns how many were folded.

    ``upto`` must be a batch Spark has committed (it is never re-run). The latest row
    per (window_start, key) among the older batches -- except the keys ``upto`` wrote
    itself, which are newer -- is written as ``compacted-*.parquet`` into
    ``batch_id=upto`` with ``batch_id = upto`` (so every reader, including Spark's
    directory-based one, agrees), then the older directories are deleted. A crash in
    between leaves older rows that lose to the compacted ones: readers that keep the
    highest ``batch_id`` per (window_start, key) see the same table at every step.
    """
    import shutil

    import pyarrow.parquet as pq

    root = Path(output)
    older = [b for b in _batch_dirs(root) if b < upto]
    target = root / f"batch_id={upto}"
    if len(older) < COMPACT_AFTER or not target.is_dir():
        return 0
    schema = output_arrow_schema(spec)

    def read(directory: Path) -> list[pa.Table]:
        # Spark-written batches of older versions: INT96, naive UTC -- cast reads them
        return [
            pq.read_table(f).select(schema.names).cast(schema)
            for f in sorted(directory.glob("*.parquet"))
        ]

    old = pa.concat_tables([t for b in older for t in read(root / f"batch_id={b}")])
    own = pa.concat_tables(read(target) or [schema.empty_table()])
    frame = old.to_pandas().sort_values("batch_id", kind="stable")
    frame = frame.drop_duplicates(["window_start", "key"], keep="last")
    mine = pd.MultiIndex.from_frame(own.select(["window_start", "key"]).to_pandas())
    frame = frame[~pd.MultiIndex.from_frame(frame[["window_start", "key"]]).isin(mine)]
    frame["batch_id"] = upto
    name = f"compacted-{uuid.uuid4().hex}.parquet"
    pq.write_table(
        pa.Table.from_pandas(frame, schema=schema, preserve_index=False), target / f".{name}.tmp"
    )
    (target / f".{name}.tmp").rename(target / name)
    for b in older:
        shutil.rmtree(root / f"batch_id={b}", ignore_errors=True)
    log.info("compacted %d result batches of %s into batch %d", len(older), spec.name, upto)
    return len(older)
