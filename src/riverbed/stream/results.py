"""The result table: one Parquet directory per batch under ``<output>/batch_id=<id>/``
(written atomically and once: a re-run's same rows leave it), one schema whichever path wrote a
batch, and the compaction that folds old batch directories together.

``output`` is a directory or a bucket (``s3://bucket/prefix/output/<name>``): there a
batch is the object ``batch_id=<id>/part-00000.parquet``, one conditional PUT (every
run of a batch writes the same rows: the first stays, :func:`store_batch`), and
compaction writes its object before it deletes what it folded — the same order, and
the same readers' rule (the highest ``batch_id`` per window and key wins), as on disk."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.parquetbytes import parquet_bytes, read_parquet_bytes, text_columns
from riverbed.stream.aggregation import DELETED, Aggregation
from riverbed.stream.errors import StreamValueError
from riverbed.stream.layout import backfill_key, checkpoint_store

if TYPE_CHECKING:
    from riverbed.storage import ObjectStore

PART = "part-00000.parquet"


def batch_key(batch_id: int) -> str:
    """Where a batch's rows are in a result table (and a join's output)."""
    return f"batch_id={batch_id}/{PART}"


log = logging.getLogger(__name__)


def output_columns(spec: Aggregation) -> list[tuple[str, str]]:
    """The result table's columns as (name, Spark DDL type); each metric names its own
    (``Metric.outputs``)."""
    cols = [("window_start", "timestamp"), ("window_end", "timestamp"), ("key", "string")]
    if spec.composite:  # each part under its own name too (riverbed.stream.keys)
        cols += [(part, spec.column_types.get(part, "string")) for part in spec.key_parts]
    for name, metric in spec.metrics.items():
        cols += [(name + suffix, kind) for suffix, kind in metric.outputs(spec.column_types)]
        if name in spec.since:  # backfilled after retention deleted some of its events
            cols.append((name + SINCE, "timestamp"))
    if spec.sessions:  # a tombstone: the session that started here was merged away
        cols.append((DELETED, "boolean"))
    return [*cols, ("batch_id", "long")]


SINCE = "_since"


def since_values(spec: Aggregation, starts_ms: np.ndarray) -> dict[str, pd.DatetimeIndex]:
    """The ``<metric>_since`` column of each metric in ``spec.since``, for windows
    starting at ``starts_ms``: where a window starts at or before the newest event time
    retention may have deleted before the metric was backfilled, that time (the window
    may miss events it never counted: windows after it count every event); else null."""
    out = {}
    for name, bound in spec.since.items():
        if name not in spec.metrics:
            continue
        mask = starts_ms <= bound
        at = np.where(mask, bound, 0).astype("datetime64[ms]")
        out[name + SINCE] = pd.to_datetime(at, utc=True).as_unit("us").where(mask)
    return out


def current(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows a reader sees: per (window_start, key) the newest batch's row, unless
    that row is a tombstone (a session merged away: riverbed.stream.sessions)."""
    frame = frame.sort_values("batch_id", kind="stable")
    frame = frame.drop_duplicates(["window_start", "key"], keep="last")
    if DELETED in frame.columns:
        frame = frame[~frame[DELETED].fillna(False).astype(bool)]
    return frame


def output_schema(spec: Aggregation) -> str:
    """:func:`output_columns` as a Spark DDL string."""
    return ", ".join(f"{name} {kind}" for name, kind in output_columns(spec))


_SCALARS = {
    "timestamp": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "long": pa.int64(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}


def arrow_type(ddl: str) -> pa.DataType:
    """A result column's Arrow type from its Spark DDL type: the scalars results carry,
    ``array<…>`` of them (TopK's pairs, the tied values of a pick) and ``struct<name:
    type,…>`` (a tied row)."""
    ddl = ddl.strip()
    if ddl in _SCALARS:
        return _SCALARS[ddl]
    if ddl.startswith("array<") and ddl.endswith(">"):
        return pa.list_(arrow_type(ddl[len("array<") : -1]))
    if ddl.startswith("struct<") and ddl.endswith(">"):
        fields, depth, start = [], 0, 0
        body = ddl[len("struct<") : -1]
        for at, ch in enumerate(body + ","):
            depth += {"<": 1, ">": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                name, _, kind = body[start:at].partition(":")
                fields.append((name.strip(), arrow_type(kind)))
                start = at + 1
        return pa.struct(fields)
    raise StreamValueError(f"no Arrow type for the result column type {ddl!r}")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def with_listed_times(spec: Aggregation, columns: dict[str, list[Any]]) -> None:
    """The times inside list results (``ties="all"`` of a time) as datetimes."""
    for name, metric in spec.metrics.items():
        for suffix, kind in metric.outputs(spec.column_types):
            if kind.startswith("array<") and "timestamp" in kind:
                column = columns[name + suffix]
                columns[name + suffix] = [
                    None if v is None else listed_times(v, kind) for v in column
                ]


def listed_times(values: list[Any], kind: str) -> list[Any]:
    """A list result's times (epoch µs, as partials keep them) as UTC datetimes — every
    writer of a nested time reads those alike (Spark's pandas conversion takes a bare
    number in a struct for nanoseconds) — years 1-9999; ``kind``: its DDL type."""

    def time(us: Any) -> Any:
        return None if us is None else _EPOCH + timedelta(microseconds=int(us))

    if kind == "array<timestamp>":
        return [time(v) for v in values]
    inner = kind[len("array<struct<") : -2]
    timed = [f.split(":", 1)[0] for f in inner.split(",") if f.split(":", 1)[1] == "timestamp"]
    return [{**row, **{c: time(row[c]) for c in timed}} for row in values]


def output_arrow_schema(spec: Aggregation) -> pa.Schema:
    return pa.schema([(name, arrow_type(kind)) for name, kind in output_columns(spec)])


def empty_rows(spec: Aggregation) -> pd.DataFrame:
    """A batch that emitted nothing, with the output's columns and types."""
    return output_arrow_schema(spec).empty_table().to_pandas()


def write_output(
    output: str,
    spec: Aggregation,
    batch_id: int,
    rows: pd.DataFrame | pa.Table,
    fence: Callable[[], None] | None = None,
) -> pa.Table:
    """Write ``<output>/batch_id=<id>/part-00000.parquet`` (one object, written once:
    :func:`store_batch`; what compaction put beside it stays); returns the rows. Both
    paths write through here, so the table has one Parquet schema (timestamps as UTC
    microseconds) whichever path wrote a batch. ``fence`` (the driver's term check)
    runs again once the rows are encoded and right before they are stored: a driver
    paused meanwhile and resumed after a takeover raises there."""
    schema = output_arrow_schema(spec)
    if isinstance(rows, pa.Table):
        table = rows.select(schema.names).cast(schema)
    else:
        table = pa.Table.from_pandas(rows, schema=schema, preserve_index=False)
    store_batch(output, batch_id, table, fence)
    return table


def store_batch(
    output: str, batch_id: int, table: pa.Table, fence: Callable[[], None] | None = None
) -> bool:
    """Store ``table`` as the batch's result file unless an earlier run of the batch
    stored the same rows; whether this call wrote. An earlier run is a driver killed
    before its commit, or one that lost its lead while paused between its fence and
    its write: a re-run computes the same rows (:mod:`riverbed.stream.engine`), so the
    first file stays and a late writer's copy is dropped — a replaced file would be a
    write by a driver that no longer leads. Rows that differ (the first batch of a
    backfilled generation, run before the change by a killed driver) replace the file,
    after the fence once more. Both the aggregation's and the join's path store here."""
    data = encode_file(table)
    if fence is not None:
        fence()
    store = checkpoint_store(output)
    key = batch_key(batch_id)
    return store.write_once(
        key,
        data,
        same=lambda found: same_rows(read_file(found, f"result table {store.url}/{key}"), table),
        before_replace=fence,
    )


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Whether two result files hold the same rows, in any order (a re-run's rows come
    in its own order). Rows are compared sorted by every column that sorts (nested
    ones — a top-k's list — do not), then whole."""
    if a.schema.remove_metadata() != b.schema.remove_metadata() or a.num_rows != b.num_rows:
        return False
    order = [(f.name, "ascending") for f in a.schema if not pa.types.is_nested(f.type)]
    a, b = a.replace_schema_metadata(None), b.replace_schema_metadata(None)
    if order:
        a, b = a.sort_by(order), b.sort_by(order)
    return bool(a.equals(b))


FORMAT_KEY = b"riverbed.format"  # the result table's format version in each file


def encode_file(table: pa.Table) -> bytes:
    """A result file's bytes: Parquet (zstd) with the result table's format version."""

    from riverbed.formats import CURRENT

    meta = {**(table.schema.metadata or {}), FORMAT_KEY: str(CURRENT["result table"]).encode()}
    # zstd: every reader of Parquet reads it (DuckDB, Spark, Polars, pyarrow); smaller than
    # snappy at about its cost on result rows; dictionaries for text only: faster and
    # smaller on numbers and times (benchmarks/compression.py)
    table = table.replace_schema_metadata(meta)
    return parquet_bytes(table, compression="zstd", dictionaries=text_columns(table.schema))


def read_file(data: bytes, where: str) -> pa.Table:
    """One Parquet file of the result table (refused when a newer riverbed wrote it:
    :mod:`riverbed.formats`), without riverbed's own metadata."""

    from riverbed.formats import check

    table = read_parquet_bytes(data)
    meta = dict(table.schema.metadata or {})
    found = meta.pop(FORMAT_KEY, None)
    check("result table", int(found) if found is not None else None, where)
    return table.replace_schema_metadata(meta or None)


def _parquet_keys(store: ObjectStore) -> list[str]:
    """The result table's files in a bucket (hidden names and others left out)."""
    return [
        i.key
        for i in store.list("batch_id=")
        if i.key.endswith(".parquet") and not i.key.rsplit("/", 1)[-1].startswith(".")
    ]


def read_table(output: str | Path) -> pa.Table | None:
    """Every row file of the result table, as one table (None when there is none).
    Files of older versions (Spark-written: INT96, naive UTC) are cast to the first's
    schema, as a directory dataset would."""

    store = checkpoint_store(output)
    keys = _parquet_keys(store)
    if not keys:
        return None
    tables = [read_file(store.get(k), f"result table {store.url}/{k}") for k in keys]
    # every column any file has, typed as the first file that has it: a metric removed
    # from a running aggregation (stream/changes.py) is in older files only
    fields: dict[str, pa.Field] = {}
    for t in tables:
        for f in t.schema:
            fields.setdefault(f.name, f)
    schema = pa.schema(list(fields.values()))
    return pa.concat_tables([conformed(t, schema) for t in tables])


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order: cast (files older versions
    wrote: INT96, naive UTC), and nulls where the file has no such column."""
    if table.schema == schema:
        return table
    return pa.table(
        {
            f.name: (
                table.column(f.name).cast(f.type)
                if f.name in table.column_names
                else pa.nulls(table.num_rows, f.type)
            )
            for f in schema
        },
        schema=schema,
    )


COMPACT_AFTER = 100  # batch directories of the result table before they are folded


def _batch_ids(keys: list[str]) -> list[int]:
    ids = {k.split("/", 1)[0].split("=", 1)[1] for k in keys}
    return sorted(int(b) for b in ids if b.isdigit())


def compact_output(output: str, spec: Aggregation, upto: int) -> int:
    """Fold the result table's batches before ``upto`` into ``batch_id=upto`` once
    there are ``COMPACT_AFTER`` of them; returns how many were folded.

    ``upto`` must be a batch Spark has committed (it is never re-run). The latest row
    per (window_start, key) among the older batches -- except the keys ``upto`` wrote
    itself, which are newer -- is written as ``compacted-*.parquet`` into
    ``batch_id=upto`` with ``batch_id = upto`` (so every reader, including Spark's
    directory-based one, agrees), then the older batches' files are deleted. A crash in
    between leaves older rows that lose to the compacted ones: readers that keep the
    highest ``batch_id`` per (window_start, key) see the same table at every step.
    """

    store = checkpoint_store(output)
    keys = _parquet_keys(store)
    older = [b for b in _batch_ids(keys) if b < upto]
    prefix = f"batch_id={upto}/"
    mine = [k for k in keys if k.startswith(prefix)]
    if len(older) < COMPACT_AFTER or not mine:
        return 0
    schema = output_arrow_schema(spec)

    def read(batch_keys: list[str]) -> list[pa.Table]:
        # Spark-written batches of older versions: INT96, naive UTC -- cast reads them
        return [
            conformed(read_file(store.get(k), f"result table {store.url}/{k}"), schema)
            for k in batch_keys
        ]

    folded = {f"batch_id={b}/" for b in older}
    old_keys = [k for k in keys if k.split("/", 1)[0] + "/" in folded]
    old = pa.concat_tables(read(old_keys))
    own = pa.concat_tables(read(mine) or [schema.empty_table()])
    frame = _folded(old, own, upto)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    # the compacted object is stored (one write) before the folded ones are deleted
    store.put(f"{prefix}compacted-{uuid.uuid4().hex}.parquet", encode_file(table))
    store.delete_many(old_keys)
    log.info("compacted %d result batches of %s into batch %d", len(older), spec.name, upto)
    return len(older)


def _folded(old: pa.Table, own: pa.Table, upto: int) -> pd.DataFrame:
    """The latest row per (window_start, key) of ``old`` (tombstones dropped), less the
    keys batch ``upto`` wrote itself (``own``: newer), relabelled as batch ``upto``."""
    # a tombstone among the folded goes too: every row it hid is folded with it
    frame = current(old.to_pandas())
    mine = pd.MultiIndex.from_frame(own.select(["window_start", "key"]).to_pandas())
    frame = frame[~pd.MultiIndex.from_frame(frame[["window_start", "key"]]).isin(mine)]
    frame["batch_id"] = upto
    return frame


def store_backfilled(
    checkpoint: str | Path, generation: int, table: pa.Table, fence: Callable[[], None]
) -> None:
    """Store the result rows the first batch of state generation ``generation`` writes
    with its own (a backfill's or a restore's), create-only: before the generation's
    switch, so a re-run after a kill keeps the first."""
    data = encode_file(table)
    fence()
    checkpoint_store(checkpoint).put_if_absent(backfill_key(generation), data)


def with_backfilled(checkpoint: str, generation: int, rows: pd.DataFrame) -> pd.DataFrame:
    """A batch's ``rows`` with the result rows stored for state generation
    ``generation`` (:func:`store_backfilled`), less the windows and keys the batch wrote
    itself (its own rows are newer)."""
    key = backfill_key(generation)
    rewritten = read_file(checkpoint_store(checkpoint).get(key), key).to_pandas()
    if rows.empty:
        return rewritten
    own = pd.MultiIndex.from_frame(rows[["window_start", "key"]])
    keep = ~pd.MultiIndex.from_frame(rewritten[["window_start", "key"]]).isin(own)
    return pd.concat([rows, rewritten[keep]], ignore_index=True)
