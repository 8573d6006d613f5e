"""Stream-stream joins on the DataFrame path: both sides streaming DataFrames
(``Join(left=Frame(df), right=Frame(df), …)``: any Spark source — Spark's Kafka reader,
files, Delta, a riverbed topic through ``spark.readStream.format("riverbed")``), joined
through **one** Spark streaming query over their union.

Spark's checkpoint records both sources' offsets per micro-batch, so a batch run again
after a crash holds the same events of both; riverbed's batch record (its watermark,
written durably before anything of the batch) and state versions do the rest, as on the
log-native path (:mod:`riverbed.stream.streamjoin`):

1. **plan** (the first run of micro-batch *b*): which sides have events in it (one small
   Spark job over the cached batch) and the watermark from the batches before
   (:func:`riverbed.stream.streamjoin.watermark_of`: the smaller of the sides' newest event
   times less the delay, an idle side not waited for), recorded;
2. **read** (a ``mapInArrow`` over each side's rows): events decoded, malformed and late
   ones set aside and counted (:func:`~riverbed.stream.streamjoin.events`), the rest sent
   to their state partition;
3. **pair** (one task per state partition, every partition every batch:
   :func:`riverbed.spark.tasks.frame_shuffle`): :func:`~riverbed.stream.streamjoin.
   pair_task`, version *b + 1* committed;
4. **finish** on the driver as the log-native path does; a micro-batch riverbed recorded
   done (Spark had not recorded it yet when the driver died) is not run again.

A side's event ids are its ``partition`` and ``offset`` columns when it has them (a
riverbed topic's, Kafka's), else the Spark partition and a row id within the batch.
Spark runs a micro-batch only when one of the sources has new events: the watermark
moves (and a left join emits its unmatched rows) with the next events of either side.

A lookup join (``Join(left=Frame(df), right=Lookup(...))``) has one DataFrame and no
state: its plan names the table's snapshot (:func:`riverbed.stream.lookupjoin.plan`),
its tasks enrich their rows (:func:`~riverbed.stream.lookupjoin.enriched`) and send
them to the driver, which finishes the batch as above.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa

from riverbed.spark import s3a, tasks
from riverbed.spark.checkpoint import clear_unfinished_start
from riverbed.state import openpool
from riverbed.stream.batchlog import BatchLog, BatchRecord, open_batches
from riverbed.stream.joins import DATAFRAME
from riverbed.stream.layout import spark_location
from riverbed.stream.streamjoin import (
    SIDES,
    Counts,
    JoinConfig,
    events,
    joined_rows,
    pair_task,
    route,
    run_planned,
    watermark_of,
)

_SIDE = "__side"
_PREFIX = {"left": "__l__", "right": "__r__"}
_META = ("partition", "offset", "_error")
_STAGED = pa.schema([("p", pa.int64()), ("v", pa.binary())])


def union(cfg: JoinConfig, frames: dict[str, Any]) -> Any:
    """Both sides' streaming DataFrames as one: a side's kept columns under its prefix,
    its event ids and ``_error`` under its prefix too, and which side a row is."""
    from pyspark.sql import functions as F

    out = None
    for which, side in zip(SIDES, cfg.sides, strict=True):
        if which not in frames:  # a lookup join's right side: its table
            continue
        df = frames[which]
        names = set(df.columns)
        p = _PREFIX[which]
        meta = {
            "partition": F.col("partition").cast("int")
            if "partition" in names
            else F.spark_partition_id(),
            "offset": F.col("offset").cast("long")
            if "offset" in names
            else F.monotonically_increasing_id(),
            "_error": F.col("_error").cast("string")
            if "_error" in names
            else F.lit(None).cast("string"),
        }
        # a Select's side evaluates its columns from the events' fields (every one)
        read = side.columns if cfg.join.select is None else _fields(df.columns)
        selected = df.select(
            F.lit(which).alias(_SIDE),
            *[F.col(c).alias(p + c) for c in read],
            *[meta[m].alias(p + m) for m in _META],
        )
        out = selected if out is None else out.unionByName(selected, allowMissingColumns=True)
    return out


def _fields(columns: Iterable[str]) -> list[str]:
    """A DataFrame's columns but the event ids and ``_error`` (the union adds its own)."""
    return [c for c in columns if c not in _META]


def start(cfg: JoinConfig, trigger: dict[str, Any] | None) -> Any:
    """Start the join's Spark streaming query; returns it."""
    from riverbed.stream.querystart import start_query

    frames = cfg.join.frames
    # what the batches and their tasks see: the join without its DataFrames (a task's
    # config travels pickled; a DataFrame does not)
    right = cfg.join.right if cfg.join.stateless else DATAFRAME  # (a table, or none)
    bare = replace(cfg, join=replace(cfg.join, left=DATAFRAME, right=right))
    location = spark_location(cfg.checkpoint)
    clear_unfinished_start(location)
    writer = (
        union(cfg, frames)
        .writeStream.foreachBatch(foreach_batch(bare))
        .option("checkpointLocation", s3a.to_s3a(location))
        .queryName(cfg.join.name)
    )
    return start_query(writer.trigger(**(trigger or {"processingTime": "1 second"})), cfg.join.name)


def foreach_batch(cfg: JoinConfig) -> Any:
    """The ``foreachBatch`` function of a join on the DataFrame path."""
    batches = open_batches(cfg.checkpoint, cfg.fence)

    def run(df: Any, batch_id: int) -> None:
        record = batches.get(batch_id)
        if record is not None and record.done:
            return  # committed by riverbed; Spark had not recorded it when its driver died
        df = df.cache()
        try:
            if record is None:
                record = _plan(cfg, batches, batch_id, df)
            spark = df.sparkSession
            done = record

            def tasks_of() -> tuple[pa.Table | None, Counts]:
                if cfg.join.stateless:
                    return _run_lookup(cfg, df, batch_id, done)
                return _run_tasks(spark, cfg, df, batch_id, done.watermark_ms)

            run_planned(spark, cfg, batches, batch_id, record, tasks_of)
        finally:
            df.unpersist()

    return run


def _plan(cfg: JoinConfig, batches: BatchLog, batch_id: int, df: Any) -> BatchRecord:
    """Micro-batch ``batch_id``'s record, written durably before anything of it: its
    watermark — or a lookup join's table snapshot (:func:`riverbed.stream.lookupjoin.
    plan`; nothing of a lookup join waits for time, so no watermark)."""
    newest = batches.previous(batch_id)
    record = BatchRecord(
        previous_watermark_ms=newest.watermark_ms if newest is not None else 0,
        max_event_ms=newest.max_event_ms if newest is not None else 0,
        source_max_ms=dict(newest.source_max_ms or {}) if newest is not None else {},
    )
    if cfg.join.lookup is not None:
        from riverbed.stream import lookupjoin

        record.lookups = lookupjoin.plan(cfg, newest)
    elif cfg.join.select is not None:
        pass  # a Select's record: nothing to decide (no table, no watermark)
    else:
        with_input = {row[_SIDE] for row in df.groupBy(_SIDE).count().collect()}
        now = int(time.time() * 1000)
        moved: dict[str, int] = {}
        for which in SIDES:
            was = (newest.source_moved_ms or {}).get(which) if newest is not None else None
            moved[which] = now if which in with_input or was is None else int(was)
        record.watermark_ms = watermark_of(cfg.join, newest, moved, now)
        record.source_moved_ms = moved
    batches.put(batch_id, record)
    return record


def _run_lookup(
    cfg: JoinConfig, df: Any, batch_id: int, record: BatchRecord
) -> tuple[pa.Table | None, Counts]:
    """A lookup join's micro-batch: each task enriches its rows of the left DataFrame
    with the snapshot the plan names (:func:`riverbed.stream.lookupjoin.enriched`) — a
    Select's filters and projects them; the rows and counts come back to the driver."""
    from pyspark.sql import functions as F

    from riverbed.stream import lookupjoin

    selects = cfg.join.select is not None
    snapshot = "" if selects else lookupjoin.snapshot_of(cfg, batch_id, record)
    p = _PREFIX["left"]
    read = cfg.sides[0].columns
    if selects:  # the events' fields, as the union took them
        read = tuple(_fields(c[len(p) :] for c in df.columns if c.startswith(p)))
    rows = df.select(*[F.col(p + c).alias(c) for c in (*read, *_META)])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = Counts()
        for joined in lookupjoin.enriched(cfg, snapshot, batches, counts):
            yield pa.RecordBatch.from_pydict({"p": [0], "v": [pickle.dumps(joined)]}, _STAGED)
        yield pa.RecordBatch.from_pydict({"p": [1], "v": [pickle.dumps(counts)]}, _STAGED)

    counts, frames = Counts(), []
    for row in rows.mapInArrow(run, "p long, v binary").collect():
        value = pickle.loads(row["v"])  # noqa: S301 - our own tasks' values
        if row["p"]:
            counts.add(value)
        else:
            frames.append(value)
    return joined_rows(frames), counts


def _run_tasks(
    spark: Any, cfg: JoinConfig, df: Any, batch_id: int, watermark_ms: int
) -> tuple[pa.Table | None, Counts]:
    """The batch's read and pair tasks: the joined rows (internal columns), the counts."""
    from pyspark.sql import functions as F

    n = cfg.join.state_partitions
    staged = None
    for which, side in zip(SIDES, cfg.sides, strict=True):
        p = _PREFIX[which]
        rows = df.filter(F.col(_SIDE) == which).select(
            *[F.col(p + c).alias(c) for c in (*side.columns, *_META)]
        )
        read = rows.mapInArrow(_reader(cfg, which, watermark_ms), "p long, v binary")
        staged = read if staged is None else staged.unionByName(read)
    pair = pair_task(cfg, batch_id, watermark_ms)
    openpool.let_go()  # the tasks, maybe in this process's workers, open the partitions
    frames, reports = tasks.frame_shuffle(spark, staged, n, lambda q, v: pair(q, list(v)))
    counts = Counts()
    for report in reports:
        counts.add(report)
    return joined_rows(frames), counts


def _reader(cfg: JoinConfig, which: str, watermark_ms: int) -> Any:
    """A ``mapInArrow`` function: a side's rows to (state partition, its events) pairs,
    and one (n, counts) pair for the driver — each value pickled."""
    n = cfg.join.state_partitions

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = Counts()
        for table in events(cfg, which, batches, watermark_ms, counts):
            routed = list(route(table, n))
            values = [pickle.dumps((which, part)) for _, part in routed]
            parts = [p for p, _ in routed]
            yield pa.RecordBatch.from_pydict({"p": parts, "v": values}, schema=_STAGED)
        yield pa.RecordBatch.from_pydict({"p": [n], "v": [pickle.dumps(counts)]}, schema=_STAGED)

    return run


__all__ = ["foreach_batch", "start", "union"]
