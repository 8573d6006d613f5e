"""The aggregation engine: one micro-batch = one ``batch_id`` = one state version.

For each micro-batch (``foreachBatch``):

1. **batch metadata** — the watermark this batch uses is derived from earlier batches
   only and recorded under ``<checkpoint>/riverbed/batches/<batch_id>.json`` before
   any work; a re-run of the batch reads it back, so it sees the same watermark;
2. **side outputs** — malformed records (``_error``) go to ``<name>.dlq`` and events
   whose every window is already closed go to ``<name>.late`` (both counted);
3. **pre-aggregate** each Spark partition vectorized (pandas) per (window, key) into
   partials, tagged with their state partition (``crc32(key) % state_partitions``),
   carried as data — never Spark's physical partition index;
4. **merge** — ``groupBy(state_partition).applyInPandas``: one call per state
   partition (plus a heartbeat row so partitions without data still expire and emit):
   load the state as of the previous batch (version ``batch_id``), merge, emit, expire
   closed windows, commit version ``batch_id + 1``;
5. **output** — the emitted rows overwrite ``<output>/batch_id=<id>/``: a re-run
   replaces its own output, never duplicates it;
6. **finish** — the batch record gets ``done`` and running totals; every
   ``snapshot_every`` batches the driver purges state history and batch records older
   than ``retain_versions`` batches (:func:`finish_batch`), so a query that runs for
   months keeps a bounded checkpoint.

A task retry, a speculative copy or a driver restart re-runs steps 3-5 for the same
``batch_id`` against the same previous version, so the state version and the output
are the same (see :mod:`riverbed.state` for why re-commits are safe).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.state import StateConfig, StateProvider
from riverbed.state.errors import CorruptStateError
from riverbed.state.keys import split_window_key_ms, window_key, window_prefix
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.fencing import check_term
from riverbed.stream.layout import Checkpoint

log = logging.getLogger(__name__)

PARTIAL_SCHEMA = "state_partition int, window_start long, key string, partials binary"


@dataclass(frozen=True)
class EngineConfig:
    """Everything a task needs; pickled to executors."""

    spec: Aggregation
    state: StateConfig
    checkpoint: str
    output: str
    log_url: str | None = None  # for the .dlq and .late topics
    sql_url: str | None = None  # also upsert results into this SQL table
    results_topic: str | None = None  # also append results to this topic (in log_url)
    # the RIVERBED_FAULT failpoint (tests), read on the driver: executors may not see it
    fault: str | None = field(default_factory=lambda: os.environ.get("RIVERBED_FAULT") or None)
    term: int | None = None  # the driver's election term; None: not fenced (fencing.py)

    def fence(self) -> None:
        """Raise DriverFencedError if a newer driver took over (before every write)."""
        check_term(self.checkpoint, self.term, self.spec.name)


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


def state_partition_of(keys: pd.Series, n: int) -> np.ndarray:
    uniques = keys.unique()
    mapping = {k: zlib.crc32(str(k).encode()) % n for k in uniques}
    out: np.ndarray = keys.map(mapping).to_numpy(dtype=np.int32)
    return out


def event_millis(column: pd.Series) -> np.ndarray:
    """Event times as ms since the epoch, whatever unit pandas holds them in (Spark's
    Arrow path gives ns, pyarrow's to_pandas keeps us); naive times are UTC."""
    if not pd.api.types.is_datetime64_any_dtype(column.dtype):
        column = pd.to_datetime(column, utc=True)  # strings, objects: parse (slow path)
    ms: np.ndarray = column.dt.as_unit("ms").astype("int64").to_numpy()
    return ms


# -- step 1: batch metadata ------------------------------------------------------------------
def read_record(path: Path) -> dict[str, Any]:
    """A batch record, or :class:`CorruptStateError` naming it and the recovery."""
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        batch = path.stem.lstrip("0") or "0"
        checkpoint = Checkpoint.of_batch_record(path)
        commits = checkpoint.spark_commits / batch
        when = (
            f"If Spark has not committed that batch (no {commits}), delete the file"
            if checkpoint.spark_commits.is_dir()
            else "If it is the newest batch record, delete the file"
        )
        raise CorruptStateError(
            f"the record of batch {batch} (its plan, watermark and counts) is damaged: "
            f"{path} ({exc}). {when} and the batch runs again and writes it anew; "
            "otherwise restore it from a backup or start the aggregation on a new "
            "checkpoint (docs/stream.md, 'Failure model')"
        ) from None
    return record


class BatchLog:
    """Per-batch watermark, fixed before the batch runs and reused by re-runs."""

    def __init__(self, checkpoint: str, fence: Callable[[], None] | None = None) -> None:
        self.layout = Checkpoint.of(checkpoint)
        self.dir = self.layout.batches
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fence = fence or (lambda: None)

    def _path(self, batch_id: int) -> Path:
        return self.layout.batch(batch_id)

    def get(self, batch_id: int) -> dict[str, Any] | None:
        path = self._path(batch_id)
        return read_record(path) if path.exists() else None

    def previous(self, batch_id: int) -> dict[str, Any] | None:
        """The newest record before ``batch_id`` (almost always ``batch_id - 1``; a
        listing only when that one is missing)."""
        if batch_id > 0 and (record := self.get(batch_id - 1)) is not None:
            return record
        earlier = sorted(p for p in self.dir.glob("*.json") if int(p.stem) < batch_id)
        return read_record(earlier[-1]) if earlier else None

    def put(self, batch_id: int, record: dict[str, Any], *, durable: bool = True) -> None:
        """Replace the record atomically; ``durable=False`` skips the fsync (for records
        a re-run would rebuild the same way). The fence is checked after the slow part
        (writing and syncing the new version) and right before the rename that
        publishes it, so a driver paused and replaced meanwhile publishes nothing."""
        path = self._path(batch_id)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            tmp.write_text(json.dumps(record))
            if durable:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            self.fence()
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def update(self, batch_id: int, **fields: Any) -> None:
        record = self.get(batch_id) or {}
        record.update(fields)
        self.put(batch_id, record)

    def ids(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.json"))

    def prune(self, keep_from: int) -> int:
        """Delete the records of batches before ``keep_from``; returns how many."""
        gone = 0
        for batch_id in self.ids():
            if batch_id >= keep_from:
                break
            self._path(batch_id).unlink(missing_ok=True)
            gone += 1
        return gone


def next_record(batches: BatchLog, batch_id: int, spec: Aggregation) -> dict[str, Any]:
    """A new batch's record: its watermark, derived from earlier batches only."""
    prev = batches.previous(batch_id) or {"watermark_ms": 0, "max_event_ms": 0}
    return {
        "watermark_ms": max(prev["watermark_ms"], prev["max_event_ms"] - spec.watermark_ms),
        "previous_watermark_ms": prev["watermark_ms"],
        "max_event_ms": prev["max_event_ms"],
    }


COUNTS = ("input", "late", "malformed")


def input_rate(record: dict[str, Any]) -> float | None:
    """Records per second while a finished batch ran (log-native batches say where
    their time went in ``ms``; others do not)."""
    ms = sum((record.get("ms") or {}).values())
    return int(record.get("input", 0)) * 1000 / ms if ms else None


def summed_totals(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Totals over finished batch records, for checkpoints from before running totals
    (where no record was pruned yet)."""
    done = [r for r in records if r.get("done")]
    totals = {c: sum(int(r.get(c, 0)) for r in done) for c in COUNTS}
    totals["batches"] = len(done)
    return totals


def finish_batch(
    config: EngineConfig, batches: BatchLog, batch_id: int, record: dict[str, Any]
) -> None:
    """Record the batch as done (durably, before Spark commits it: the next batch's
    watermark comes from it), with running totals; then, every ``snapshot_every``
    batches, run :func:`maintain`."""
    prev = batches.previous(batch_id)
    if prev is not None and "totals" in prev:
        totals = dict(prev["totals"])
    else:  # the first batch, or records from before totals existed: count them once
        totals = summed_totals(
            r for b in batches.ids() if b < batch_id and (r := batches.get(b)) is not None
        )
    for c in COUNTS:
        totals[c] = int(totals.get(c, 0)) + int(record.get(c, 0))
    totals["batches"] = int(totals.get("batches", 0)) + 1
    if config.term is not None:
        record = record | {"term": config.term}  # which driver ran it (fencing.py)
    batches.put(batch_id, record | {"done": True, "totals": totals})
    if (batch_id + 1) % config.state.snapshot_every == 0:
        maintain(config, batches, batch_id)


def maintain(config: EngineConfig, batches: BatchLog, batch_id: int) -> None:
    """Purge state snapshots and changelogs, and batch records, that no version among
    the newest ``retain_versions`` needs, and compact the result table
    (:func:`compact_output`). Runs on the driver without opening any state
    partition, so it never competes with the state tasks; a failure is logged and
    retried at the next round, never fails the query."""
    spec = config.spec
    config.fence()  # a replaced driver purges nothing
    try:
        provider = StateProvider(config.state)
        for partition in range(spec.state_partitions):
            provider.purge(spec.name, partition)
        batches.prune(batch_id + 1 - config.state.retain_versions)
        if batch_id > 0:  # the batch before this one is committed: fold the table into it
            compact_output(config.output, spec, batch_id - 1)
    except Exception as exc:  # maintenance must not stop the query
        log.warning(
            "maintenance of %s after batch %d failed (retried in %d batches): %s",
            spec.name,
            batch_id,
            config.state.snapshot_every,
            exc,
        )


# -- step 3: pre-aggregation -------------------------------------------------------------------
Partial = tuple[int, str, dict[str, Any]]  # (window start ms, key, {metric: partial})


def partials_of(
    spec: Aggregation, pdf: pd.DataFrame, watermark_ms: int, ts: np.ndarray | None = None
) -> list[Partial]:
    """Per (window, key) partials of one frame of events, vectorized per group. Events
    only count toward windows the watermark has not closed. ``ts``: the frame's event
    times in ms, when the caller has them already."""
    if pdf.empty:
        return []
    size = spec.window.size_ms
    if ts is None:
        ts = event_millis(pdf[spec.time])
    keys = pdf[spec.key].astype(str).to_numpy()
    columns = {c: pdf[c].to_numpy() for c in spec.columns()[2:]}
    window_starts, rows = [], []  # one entry per (event, open window it falls in)
    for starts in spec.window.starts(ts):
        open_ = np.flatnonzero(starts + size > watermark_ms)  # closed windows take no more
        if len(open_):
            window_starts.append(starts[open_])
            rows.append(open_)
    if not rows:
        return []
    starts_all, rows_all = np.concatenate(window_starts), np.concatenate(rows)
    # group by (window, key) with numpy: sort once, cut where either changes (a pandas
    # groupby costs ~0.2 ms a group, which dominates small batches)
    codes, names = pd.factorize(keys)
    key_codes = codes[rows_all]
    order = np.lexsort((key_codes, starts_all))
    starts_all, key_codes, rows_all = starts_all[order], key_codes[order], rows_all[order]
    cuts = np.flatnonzero((np.diff(starts_all) != 0) | (np.diff(key_codes) != 0)) + 1
    bounds = [0, *cuts.tolist(), len(rows_all)]
    metrics = [
        (name, metric, columns[metric.column] if hasattr(metric, "column") else None)
        for name, metric in spec.metrics.items()
    ]
    out: list[Partial] = []
    for a, b in itertools.pairwise(bounds):
        picked = rows_all[a:b]
        partials = {
            name: metric.partial(column[picked] if column is not None else None, b - a)
            for name, metric, column in metrics
        }
        out.append((int(starts_all[a]), str(names[key_codes[a]]), partials))
    return out


def preaggregate(
    spec: Aggregation, watermark_ms: int
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """``mapInPandas`` step: partials as rows, tagged with their state partition."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in frames:
            rows = [
                (start, key, msgpack.packb(partials, use_bin_type=True))
                for start, key, partials in partials_of(spec, pdf, watermark_ms)
            ]
            if not rows:
                continue
            out = pd.DataFrame(rows, columns=["window_start", "key", "partials"])
            out.insert(0, "state_partition", state_partition_of(out["key"], spec.state_partitions))
            yield out

    return run


# -- step 4: merge into state -------------------------------------------------------------------
class InjectedFault(RuntimeError):
    """Raised by the ``RIVERBED_FAULT`` failpoint (tests only)."""


def _failpoint(config: EngineConfig, partition: int, batch_id: int) -> None:
    """``RIVERBED_FAULT=after_commit:<dir>``: in every batch, the first task to commit a
    state partition dies right after the commit, once (a marker file in ``<dir>``
    remembers it), the way a task is lost between its commit and reporting success."""
    if not config.fault or not config.fault.startswith("after_commit:"):
        return
    marker = Path(config.fault.split(":", 1)[1]) / f"{config.spec.name}-{batch_id}"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    raise InjectedFault(f"injected fault after commit: partition {partition}, batch {batch_id}")


def merge_partition(
    config: EngineConfig,
    partition: int,
    batch_id: int,
    watermark_ms: int,
    previous_watermark_ms: int,
    partials: Iterable[Partial],
) -> pd.DataFrame:
    """Merge one batch's partials into state partition ``partition``: load version
    ``batch_id``, merge, emit, expire closed windows, commit ``batch_id + 1``. Returns
    the rows to emit."""
    spec = config.spec
    size = spec.window.size_ms
    provider = StateProvider(config.state)
    store = provider.load(spec.name, partition, version=batch_id)
    try:
        # combine this batch's partials per (window, key) (several tasks made them)
        batch: dict[bytes, dict[str, Any]] = {}
        for window_start, key, partial in partials:
            k = window_key(window_start, key.encode())
            if k in batch:
                batch[k] = {n: m.merge(batch[k][n], partial[n]) for n, m in spec.metrics.items()}
            else:
                batch[k] = partial
        keys = sorted(batch)
        emitted: dict[bytes, dict[str, Any]] = {}
        for k, stored in zip(keys, store.get_many(keys), strict=True):
            value = batch[k]
            if stored is not None:
                old = msgpack.unpackb(stored, raw=False)
                value = {n: m.merge(old[n], value[n]) for n, m in spec.metrics.items()}
            store.put(k, msgpack.packb(value, use_bin_type=True))
            if spec.output == "update":
                emitted[k] = value
        # windows the watermark closed in this batch: start + size <= watermark
        closed_to = watermark_ms - size  # starts <= closed_to are closed
        if spec.output == "final" and watermark_ms > previous_watermark_ms:
            lo = max(previous_watermark_ms - size + 1, 0)
            for k, blob in store.scan(start=window_prefix(lo), end=window_prefix(closed_to + 1)):
                emitted[k] = msgpack.unpackb(blob, raw=False)
        expire_to = closed_to - spec.keep_closed_ms
        if expire_to >= 0:
            store.delete_range(window_prefix(0), window_prefix(expire_to + 1))
        config.fence()  # a replaced driver's task must not commit a version
        store.commit(batch_id + 1)
    except BaseException:
        store.abort()
        raise
    _failpoint(config, partition, batch_id)
    return _rows(spec, emitted, batch_id)


def merger(
    config: EngineConfig, batch_id: int, watermark_ms: int, previous_watermark_ms: int
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """``applyInPandas`` step: one call per state partition (a heartbeat row makes sure
    every partition gets one)."""

    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        rows = pdf.loc[pdf["key"].notna(), ["window_start", "key", "partials"]]
        partials = (
            (int(start), key, msgpack.unpackb(blob, raw=False))
            for start, key, blob in rows.itertuples(index=False)
        )
        partition = int(pdf["state_partition"].iloc[0])
        return merge_partition(
            config, partition, batch_id, watermark_ms, previous_watermark_ms, partials
        )

    return run


def _rows(spec: Aggregation, emitted: dict[bytes, dict[str, Any]], batch_id: int) -> pd.DataFrame:
    """The emitted windows as output rows (built column by column)."""
    if not emitted:  # typed empty columns (empty lists would all be float64)
        return empty_rows(spec)
    names = output_arrow_schema(spec).names
    columns: dict[str, list[Any]] = {name: [] for name in names}
    starts: list[int] = []
    for k, value in sorted(emitted.items()):
        start, key = split_window_key_ms(k)
        starts.append(start)
        columns["key"].append(key.decode())
        for name, metric in spec.metrics.items():
            for suffix, result in metric.result(value[name]).items():
                columns[name + suffix].append(result)
    start_ms = np.array(starts, dtype=np.int64)
    columns["window_start"] = pd.to_datetime(start_ms, unit="ms", utc=True)
    columns["window_end"] = pd.to_datetime(start_ms + spec.window.size_ms, unit="ms", utc=True)
    columns["batch_id"] = [batch_id] * len(starts)
    return pd.DataFrame(columns, columns=names)
