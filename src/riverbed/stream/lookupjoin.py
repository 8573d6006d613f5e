"""A lookup join's batch (``Join(left="bids", right=Lookup(...))``) — and a Select's,
which is one without a table (:class:`~riverbed.stream.joins.Select`: the events
filtered and projected, nothing added): each event of the
left topic enriched from a table as of its batch, the rows written like a stream-stream
join's (:func:`riverbed.stream.streamjoin.run_planned`: the output's batch file, the
join's topic, the batch record) — but no state and no watermark: an event is never
late, and nothing waits for a partner.

* **plan**: the left side's slices, and the table's snapshot the batch joins with
  (:func:`riverbed.stream.lookups.plan_snapshots`: read again per the Lookup's
  ``refresh``, written once per content) — both in the plan, written before anything
  of the batch, so a re-run batch joins the same events with the same rows;
* **enrich** (one task per piece of the slices, in the driver's threads for a small
  batch): the events decoded (:func:`~riverbed.stream.streamjoin.events`), joined with
  the snapshot (:func:`riverbed.stream.lookups.join`); an event without a row (or with
  a NULL key) is counted unmatched — kept with NULLs by ``how="left"``, dropped by
  ``"inner"``.

A streaming DataFrame's events (``Join(left=Frame(df), right=Lookup(...))``) take the
same two steps inside a Spark streaming query's micro-batches
(:mod:`riverbed.stream.joinframes`: Spark's checkpoint holds the slices; the snapshot
is in riverbed's record; :func:`enriched` runs over each task's rows).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverbed.spark import tasks
from riverbed.spark.source import LogSlice, read_slice
from riverbed.stream import lookups
from riverbed.stream.batchlog import BatchRecord
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joins import Join
from riverbed.stream.lognative import in_driver, pieces
from riverbed.stream.streamjoin import (
    PREFIX,
    Counts,
    JoinConfig,
    JoinSide,
    events,
    joined_rows,
    side_slices,
    stored_column,
)

__all__ = ["enriched", "plan", "run_batch", "snapshot_of", "table_side"]


def table_side(join: Join, left: JoinSide, schema: pa.Schema) -> JoinSide:
    """The right side of a lookup join from its table's columns (``schema``: the
    normalized table's, :func:`riverbed.stream.lookups.normalized`): the columns it adds,
    its timestamps; its key's type checked against the left side's key."""
    from pyspark.sql.pandas.types import from_arrow_schema

    lookup = join.lookup
    assert lookup is not None
    event_type = left.arrow.field(left.key).type  # (the key may be a derived column)
    table_type = schema.field(lookup.table_column).type
    both_integral = pa.types.is_integer(event_type) and pa.types.is_integer(table_type)
    if not both_integral and event_type != table_type:
        raise StreamValueError(
            f"join {join.name}: the events' {left.key!r} is {event_type} and the table's "
            f"{lookup.table_column!r} is {table_type}: a key matches one of its own type "
            "(integers of any width match); cast one of them (a schema option on the topic, "
            "or the table's column)"
        )
    added = [f for f in schema if f.name != lookup.table_column]
    spark_schema = from_arrow_schema(pa.schema(added))
    times = tuple(f.name for f in added if pa.types.is_timestamp(f.type))
    return JoinSide({}, spark_schema, lookup.table_column, "", tuple(f.name for f in added), times)


def plan(cfg: JoinConfig, previous: BatchRecord | None) -> list[dict[str, Any]]:
    """A new batch's snapshot of the table (its record's ``lookups``): the previous
    batch's while fresh enough, else the table read now; snapshots no batch that can
    still run names are pruned."""
    lookup = cfg.join.lookup
    assert lookup is not None
    schemas = None if cfg.lookup_schema is None else [cfg.lookup_schema]
    return lookups.plan_record(
        [lookup], cfg.checkpoint, previous, schemas, cfg.log_url, cfg.join.state_partitions
    )


def enriched(cfg: JoinConfig, snapshot: str, read: Any, counts: Counts) -> list[pa.Table]:
    """The left side's rows ``read`` (Arrow batches of its columns and event ids: a
    topic's slice, or a DataFrame's rows) decoded and joined with the table's snapshot
    ``snapshot`` (its id, :func:`snapshot_of`): the rows, as the output's internal
    columns; ``counts`` counts them (an event without a row: unmatched). A Select's
    (no table, ``snapshot`` ``""``): the events kept, with its columns."""
    lookup = cfg.join.lookup
    if lookup is None:
        return list(events(cfg, "left", read, 0, counts))
    table = lookups.tables(cfg.checkpoint, [snapshot])[0]
    inside = dataclasses.replace(lookup, on=(PREFIX["left"] + lookup.event_column,
                                             lookup.table_column))  # fmt: skip
    right = cfg.sides[1]
    out = []
    for kept in events(cfg, "left", read, 0, counts):
        width = kept.num_columns
        joined, found = lookups.join(kept, inside, table)
        missed = int(len(found) - pc.sum(found).as_py()) if len(found) else 0
        counts.unmatched += missed
        if cfg.join.how == "inner" and missed:
            joined = joined.filter(found)
        names = joined.column_names
        for at in range(width, joined.num_columns):  # the table's: as the right side's
            column = joined.column(at)
            stored = stored_column(column, names[at] in right.times)
            joined = joined.set_column(at, PREFIX["right"] + names[at], stored)
        out.append(joined)
    return out


def snapshot_of(cfg: JoinConfig, batch_id: int, record: BatchRecord) -> str:
    """The id of the table's snapshot batch ``batch_id``'s plan joins with."""
    if not record.lookups:
        raise StreamValueError(
            f"join {cfg.join.name}: batch {batch_id}'s plan names no snapshot of the table; "
            "it was planned by another kind of join: start on a new checkpoint"
        )
    return str(record.lookups[0]["id"])


def enrich_task(cfg: JoinConfig, snapshot: str) -> Any:
    """One piece of the left topic's slices enriched: (the rows, as the output's
    internal columns; the counts)."""

    def run(piece: LogSlice) -> tuple[pa.Table | None, Counts]:
        counts = Counts()
        read = read_slice(cfg.sides[0].options, cfg.sides[0].schema, piece)
        return joined_rows(enriched(cfg, snapshot, read, counts)), counts

    return run


def run_batch(
    spark: Any, cfg: JoinConfig, batch_id: int, record: BatchRecord
) -> tuple[pa.Table | None, Counts]:
    """Run one planned batch's tasks (each piece of the left side's slices enriched with
    the snapshot its plan names — a Select's: filtered and projected); returns the rows
    and the counts."""
    tasks.describe(spark, f"riverbed join {cfg.join.name} batch {batch_id}")
    snapshot = "" if cfg.join.lookup is None else snapshot_of(cfg, batch_id, record)
    enrich = enrich_task(cfg, snapshot)
    slices = side_slices(record, "left")
    work = pieces(slices, tasks.parallelism(spark))
    total = sum(s.end - s.start for s in slices)
    if in_driver(total, cfg.driver_records, tasks.master(spark)) or not work:
        done = tasks.in_threads(enrich, work, min(max(1, len(work)), 4))
    else:
        done = tasks.map_items(spark, work, enrich)
    counts = Counts()
    for _, c in done:
        counts.add(c)
    return joined_rows([t for t, _ in done]), counts
