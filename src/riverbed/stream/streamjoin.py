"""Stream-stream joins on the log-native path: two topics, one plan per batch, exactly once.

A :class:`~riverbed.stream.joins.Join` runs as riverbed's own trigger loop on a driver
thread (:mod:`riverbed.stream.joinquery`, like a log-native aggregation's,
:mod:`riverbed.stream.loop`); this module is what one batch does:

1. **plan** batch *b*: each side's slices (from where *b - 1* ended to the topic's end,
   at most ``maxRecordsPerBatch`` per side) and the watermark — the smaller of the
   sides' newest event times seen *before* *b*, less the join's ``watermark`` delay; a
   side with no new records for ``idle_timeout`` stops holding it back — written
   durably before anything of *b* (a re-run reads both sides' same slices and the same
   watermark);
2. **read** (one task per piece of a slice): events decoded, malformed ones (no key, no
   time, a bad record) and late ones (:meth:`~riverbed.stream.pairing.Rule.late`) set
   aside and counted, the rest sent to their state partition (``crc32(key) %
   state_partitions``, keys compared as text);
3. **pair** (one task per state partition, every partition every batch: the watermark
   drops buffered events there too): state version *b* loaded, the batch's events
   paired and buffered (:func:`riverbed.stream.pairing.step`), version *b + 1*
   committed;
4. **finish** on the driver: the joined rows (in one order: by key and the events'
   times and offsets) are ``<output>/batch_id=b/part-00000.parquet`` (stored once: a
   re-run's same rows leave the file, :func:`riverbed.stream.results.store_batch`), go
   to the join's ``topic`` (once per batch and partition, :class:`~riverbed.stream.
   sinks.TopicSink`), malformed and late events to ``<name>.dlq`` / ``<name>.late``; then the
   batch is recorded done — the commit.

A small batch (a local master) runs its tasks in the driver's threads instead of as a
Spark job. A killed driver's next start re-runs its newest unfinished plan exactly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.config import adopt
from riverbed.log import reach_environment
from riverbed.spark import tasks, tasks_in_this_process
from riverbed.spark.source import LogSlice, read_slice
from riverbed.state import StateConfig, StateProvider, openpool
from riverbed.state.provider import local_root
from riverbed.stream.batch import SIDE_LIMIT, side_outputs, side_outputs_written
from riverbed.stream.batchlog import COUNTS, BatchLog, BatchRecord
from riverbed.stream.derive import side_derivation
from riverbed.stream.engine import state_partition_of
from riverbed.stream.fencing import check_term
from riverbed.stream.joins import Join
from riverbed.stream.lognative import decimal_doubles, in_driver, pieces
from riverbed.stream.nativeconfig import JOIN_DRIVER_BATCH_RECORDS
from riverbed.stream.pairing import KEY, OFF, PART, TS, Rule, no_events, step
from riverbed.stream.results import store_batch

log = logging.getLogger(__name__)

SIDES = ("left", "right")
PREFIX = {"left": "l.", "right": "r."}  # a side's columns inside the join
WINDOW_START = "window_start"


@dataclass(frozen=True)
class JoinSide:
    """One side as the tasks read it (fixed at start)."""

    options: dict[str, str]  # the topic reader's: topic, log, schema, ...
    schema: Any  # StructType: the value fields and the source's metadata columns
    key: str
    time: str
    columns: tuple[str, ...]  # the columns it keeps (its time too), stored per event
    times: tuple[str, ...]  # of those, timestamps: stored as ms, given back as times
    where: str | None = None  # the side's condition (Join.where), compiled per process
    derived: tuple[tuple[str, str], ...] = ()  # its derived columns (Join.columns), in order
    derived_types: tuple[pa.Field, ...] = ()  # their Arrow types (decided at start)

    @property
    def arrow(self) -> pa.Schema:
        """Its fields' and derived columns' Arrow types (timestamps in UTC)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        out = to_arrow_schema(self.schema, timezone="UTC")
        for derived in self.derived_types:
            out = out.append(derived)
        return out


@dataclass(frozen=True)
class JoinConfig:
    """Everything a join's tasks need; pickled to executors."""

    join: Join
    sides: tuple[JoinSide, JoinSide]
    state: StateConfig
    checkpoint: str
    output: str
    log_url: str | None
    names: tuple[tuple[str, str], ...]  # (internal column, output column), in order
    output_schema: pa.Schema
    term: int | None = None
    max_records: int | None = None
    driver_records: int = JOIN_DRIVER_BATCH_RECORDS
    lookup_schema: pa.Schema | None = None  # a lookup join's table's columns at start
    # its state's name in the state store (None: the join's name); a join run by an
    # aggregation over its rows has its own (stream/joinedagg.py)
    state_name: str | None = None
    # the checkpoint whose driver record fences its writes (None: its own); an
    # aggregation's, whose driver runs the join (stream/joinedagg.py)
    fenced_by: str | None = None
    reach_env: dict[str, str] = field(default_factory=reach_environment, repr=False)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As :class:`~riverbed.stream.engine.EngineConfig`'s: the driver's reach
        settings fill in what a worker's environment lacks."""
        self.__dict__.update(state)
        adopt(state.get("reach_env", {}))

    @property
    def name(self) -> str:
        return self.join.name

    @property
    def namespace(self) -> str:
        return self.state_name or self.join.name

    @property
    def rule(self) -> Rule:
        """When events pair (a lookup join's: nothing is ever late, its watermark stays 0)."""
        until = self.join.until
        return Rule.of(self.join, None if until is None else PREFIX["left"] + until)

    def fence(self) -> None:
        check_term(self.fenced_by or self.checkpoint, self.term, self.join.name)

    def columns(self, which: str) -> list[str]:
        side = self.sides[SIDES.index(which)]
        return [PREFIX[which] + c for c in side.columns]


@dataclass
class Counts:
    """What the read tasks saw, per batch (summed on the driver)."""

    input: int = 0
    late: int = 0
    malformed: int = 0
    filtered: int = 0  # events a side's ``where`` did not keep
    unmatched: int = 0  # a lookup join's events the table had no row for
    max_ms: dict[str, int] = field(default_factory=dict)
    late_rows: list[pd.DataFrame] = field(default_factory=list)
    dlq_rows: list[pd.DataFrame] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        self.input += other.input
        self.late += other.late
        self.malformed += other.malformed
        self.filtered += other.filtered
        self.unmatched += other.unmatched
        for side, ms in other.max_ms.items():
            self.max_ms[side] = max(self.max_ms.get(side, ms), ms)
        self.late_rows += other.late_rows
        self.dlq_rows += other.dlq_rows


def watermark_of(
    join: Join, previous: BatchRecord | None, moved: dict[str, int], now_ms: int
) -> int:
    """A batch's watermark, from the batches before it only (``previous``: the newest,
    done) and when each side last had new records (``moved``, this plan's): the
    smaller of the active sides' newest event times less the delay — a side idle for
    ``idle_timeout`` is not waited for; a side that never had an event holds it back
    until then. Never lower than the previous batch's."""
    before = previous.watermark_ms if previous is not None else 0
    seen = dict(previous.source_max_ms or {}) if previous is not None else {}
    idle = join.idle_ms
    active = [s for s in SIDES if idle is None or now_ms - moved.get(s, now_ms) < idle]
    if any(s not in seen for s in active):
        return before  # a side still to show its first event
    times = [seen[s] for s in active] or list(seen.values())
    if not times:
        return before
    return max(before, min(times) - join.watermark_ms)


# -- the tasks -------------------------------------------------------------------------------


def _read(
    cfg: JoinConfig, which: str, piece: LogSlice, watermark_ms: int, counts: Counts
) -> Iterator[pd.DataFrame]:
    """The on-time events of one piece of a side's topic (:func:`events`)."""
    side = cfg.sides[SIDES.index(which)]
    yield from events(cfg, which, read_slice(side.options, side.schema, piece), watermark_ms,
                      counts)  # fmt: skip


def events(
    cfg: JoinConfig, which: str, batches: Iterable[pa.RecordBatch], watermark_ms: int,
    counts: Counts,
) -> Iterator[pa.Table]:  # fmt: skip
    """The on-time events of Arrow batches of a side (its fields, ``partition``,
    ``offset`` and ``_error``), as :mod:`~riverbed.stream.pairing` takes them (Arrow
    tables: no row becomes a Python object); the rest counted (and kept, up to
    SIDE_LIMIT) in ``counts``."""
    side = cfg.sides[SIDES.index(which)]
    rule = cfg.rule
    # a NULL key matches no row of a table, as in SQL; a Select has no key
    keyless_ok = cfg.join.stateless
    as_given = cfg.join.select is not None  # a Select's rows keep Spark's types
    for read in batches:
        counts.input += read.num_rows
        batch: pa.RecordBatch | pa.Table = read
        kept_mask = None
        derivation = side_derivation(side.derived, side.where, read.schema)
        if derivation is not None:  # derived columns, then where (derive.Derivation)
            applied = derivation.apply(read)
            batch, kept_mask = applied.table, applied.kept
            if applied.why.null_count < len(applied.why):  # malformed, naming the part
                batch = batch.set_column(
                    batch.schema.get_field_index("_error"), "_error",
                    pc.coalesce(batch.column("_error"), applied.why),
                )  # fmt: skip
        ts, timeless, unparsed = _event_ms(batch.column(side.time))
        no_key = np.zeros(batch.num_rows, dtype=bool)
        if not keyless_ok:
            no_key = _nulls(batch.column(side.key))
        failed = _present(batch.column("_error"))  # unreadable, or an expression failed
        dropped = np.zeros(batch.num_rows, dtype=bool)
        if kept_mask is not None:  # the side's where: an event it drops is only filtered
            dropped = ~failed & ~pc.fill_null(kept_mask, False).to_numpy(zero_copy_only=False)
            counts.filtered += int(dropped.sum())
        reasons = [  # the first that holds is why a record is malformed
            (failed, None),
            (no_key & ~dropped, f"no {side.key} to join on"),
            (timeless & ~dropped, f"no event time ({side.time})"),
            (unparsed & ~dropped, f"event time ({side.time}) is not an ISO 8601 time"),
            ((ts < 0) & ~dropped, f"event time ({side.time}) before 1970"),
        ]
        bad = np.zeros(batch.num_rows, dtype=bool)
        for holds, _ in reasons:
            bad |= holds
        if bad.any():
            counts.malformed += int(bad.sum())
            if sum(map(len, counts.dlq_rows)) < SIDE_LIMIT:
                rows = batch.filter(pa.array(bad)).to_pandas()
                why = rows["_error"].to_numpy(dtype=object)
                for holds, text in reasons[1:]:
                    why[pd.isna(why) & holds[bad]] = text
                if as_given:  # a Select's reasons name its own columns
                    why = np.array([v if v is None else cfg.join.named(v) for v in why], object)
                counts.dlq_rows.append(rows.assign(_error=why, side=which))
        ok = ~bad & ~dropped
        if not ok.any():
            continue
        counts.max_ms[which] = max(counts.max_ms.get(which, int(ts[ok].max())), int(ts[ok].max()))
        late = ok & rule.late(ts, watermark_ms)
        if late.any():
            counts.late += int(late.sum())
            if sum(map(len, counts.late_rows)) < SIDE_LIMIT:
                rows = batch.filter(pa.array(late)).to_pandas().drop(columns=["_error"])
                counts.late_rows.append(rows.assign(side=which))
        good = ok & ~late
        if not good.any():
            continue
        kept = batch.filter(pa.array(good))
        arrays = [
            pc.cast(kept.column(side.key), pa.string()),
            pa.array(ts[good]),
            pc.cast(kept.column("partition"), pa.int64()),
            pc.cast(kept.column("offset"), pa.int64()),
        ]
        for c in side.columns:
            arrays.append(
                kept.column(c) if as_given else stored_column(kept.column(c), c in side.times)
            )
        yield pa.Table.from_arrays(arrays, names=[KEY, TS, PART, OFF, *cfg.columns(which)])


def _present(column: pa.Array) -> np.ndarray:
    mask: np.ndarray = pc.is_valid(column).to_numpy(zero_copy_only=False)
    return mask


def _nulls(column: pa.Array) -> np.ndarray:
    mask: np.ndarray = pc.is_null(column).to_numpy(zero_copy_only=False)
    return mask


def _event_ms(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Event times as epoch ms (``-1`` where there is none), which have none, and which
    are text that is not an ISO 8601 time: timestamps (naive ones are UTC), epoch ms
    as integers, ISO 8601 text."""
    missing = _nulls(column)
    unparsed = np.zeros(len(column), dtype=bool)
    kind = column.type
    if pa.types.is_timestamp(kind):
        ms = pc.cast(column, pa.timestamp("ms", kind.tz), safe=False).cast(pa.int64())
    elif pa.types.is_integer(kind):
        ms = pc.cast(column, pa.int64())
    else:  # text, or anything else pandas reads as a time (slow path)
        text = column.to_pandas()
        parsed = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
        unparsed = ~missing & parsed.isna().to_numpy()
        ms = pa.array(parsed.dt.as_unit("ms").astype("int64").where(parsed.notna(), None),
                      pa.int64())  # fmt: skip
    out: np.ndarray = pc.fill_null(ms, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return out, missing, unparsed


def stored_column(column: pa.Array, is_time: bool) -> pa.Array:
    """A column as buffered events keep it: times as epoch ms (null for none), decimals
    as doubles (aggregations compute with them so), anything else as it is."""
    if is_time:
        ms, missing, unparsed = _event_ms(column)
        return pa.array(ms, pa.int64(), mask=missing | unparsed)
    if pa.types.is_decimal(column.type):
        return decimal_doubles(column)
    return column


def read_task(cfg: JoinConfig, watermark_ms: int) -> Any:
    """Stage 1: a (side, piece) read into (state partition, (side, events)) pairs, and
    one (n, Counts) pair for the driver."""
    n = cfg.join.state_partitions

    def run(item: tuple[str, LogSlice]) -> list[tuple[int, Any]]:
        which, piece = item
        counts = Counts()
        out: list[tuple[int, Any]] = []
        if piece.end > piece.start:
            for table in _read(cfg, which, piece, watermark_ms, counts):
                out += [(p, (which, part)) for p, part in route(table, n)]
        out.append((n, counts))
        return out

    return run


def pair_task(cfg: JoinConfig, batch_id: int, watermark_ms: int) -> Any:
    """Stage 2: one state partition's events paired (every partition, every batch)."""

    def run(partition: int, items: list[tuple[str, pa.Table]]) -> pa.Table | None:
        frames = {}
        for which in SIDES:
            got = [t for w, t in items if w == which]
            frames[which] = (
                pa.concat_tables(got, promote_options="permissive")
                if got
                else no_events(cfg.columns(which))
            )
        store = StateProvider(cfg.state).load(cfg.namespace, partition, version=batch_id)
        try:
            out = step(
                store,
                cfg.rule,
                str(cfg.join.how),  # (set by Join: 'inner' or 'left')
                frames["left"],
                frames["right"],
                watermark_ms,
                (cfg.columns("left"), cfg.columns("right")),
            )
            cfg.fence()  # a replaced driver's task must not commit a version
            store.commit(batch_id + 1)
        except BaseException:
            store.abort()
            raise
        return joined_rows([out.pairs, out.unmatched])

    return run


def route(table: pa.Table, n: int) -> Iterator[tuple[int, pa.Table]]:
    """A side's events by state partition (``crc32(key) % n``)."""
    owners = state_partition_of(table.column(KEY).to_pandas(), n)
    for p in np.unique(owners):
        yield int(p), table.filter(pa.array(owners == p))


def joined_rows(tables: list[Any]) -> pa.Table | None:
    """Joined rows (pairs; a left join's unmatched rows, without the right side's
    columns) as one table, or None for none."""
    full = [t for t in tables if t is not None and t.num_rows]
    if not full:
        return None
    return full[0] if len(full) == 1 else pa.concat_tables(full, promote_options="permissive")


def side_slices(record: BatchRecord, which: str) -> list[LogSlice]:
    """The non-empty slices of side ``which``'s topic a batch's plan records, by partition."""
    planned = (record.sources or {}).get(which, {})
    return [
        LogSlice(int(p), int(se[0]), int(se[1]))
        for p, se in sorted(planned.items(), key=lambda x: int(x[0]))
        if int(se[1]) > int(se[0])
    ]


def run_batch(
    spark: Any, cfg: JoinConfig, batch_id: int, record: BatchRecord
) -> tuple[pa.Table | None, Counts]:
    """Run one planned batch's tasks; returns the joined rows (internal columns; None:
    none) and the read counts."""
    n = cfg.join.state_partitions
    tasks.describe(spark, f"riverbed join {cfg.join.name} batch {batch_id}")
    where, parallelism = tasks.master(spark), tasks.parallelism(spark)
    work: list[tuple[str, LogSlice]] = []
    total = 0
    for which in SIDES:
        slices = side_slices(record, which)
        total += sum(s.end - s.start for s in slices)
        work += [(which, s) for s in pieces(slices, parallelism)]
    read, pair = read_task(cfg, record.watermark_ms), pair_task(cfg, batch_id, record.watermark_ms)
    counts = Counts()
    frames: list[pa.Table | None] = []
    # a small batch (also one with no input: the watermark moved) in the driver's threads
    if in_driver(total, cfg.driver_records, where) or (total == 0 and tasks_in_this_process(where)):
        routed: dict[int, list[Any]] = {p: [] for p in range(n)}
        for item in work:
            for p, value in read(item):
                if p == n:
                    counts.add(value)
                else:
                    routed[p].append(value)
        frames = tasks.in_threads(lambda p: pair(p, routed[p]), range(n), min(n, 4))
    else:
        # the job's tasks, in other processes, open the join's partitions (an aggregation
        # over its rows in this driver keeps its own open)
        openpool.let_go(local_root(cfg.state, cfg.namespace))
        frames, reports = tasks.shuffle_job(
            spark, work, ("left", LogSlice(0, 0, 0)), read, n, lambda p, v: pair(p, list(v))
        )
        for c in reports:
            counts.add(c)
    return joined_rows(frames), counts


def output_rows(cfg: JoinConfig, batch_id: int, joined: pa.Table | None) -> pa.Table:
    """The batch's joined rows in the output's columns and one order (by key, then the
    left and the right events' times and log positions)."""
    schema = cfg.output_schema
    if joined is None or not joined.num_rows:
        return schema.empty_table()
    if cfg.join.select is not None:  # a Select's: as they are, in log order
        ranked = pc.sort_indices(joined, sort_keys=[(PART, "ascending"), (OFF, "ascending")])
        joined = joined.take(ranked)
        arrays = [joined.column(internal).cast(schema.field(name).type)
                  for internal, name in cfg.names]  # fmt: skip
        arrays.append(pa.array(np.full(joined.num_rows, batch_id, dtype=np.int64)))
        return pa.Table.from_arrays(arrays, schema=schema)
    order = [KEY, "l" + TS, "l" + PART, "l" + OFF, "r" + TS, "r" + PART, "r" + OFF]
    for c in order:
        if c not in joined.column_names:  # no pairs in this batch: unmatched rows only
            joined = joined.append_column(c, pa.nulls(joined.num_rows, pa.int64()))
    ranked = pc.sort_indices(joined, sort_keys=[(c, "ascending", "at_start") for c in order])
    joined = joined.take(ranked)
    arrays = []
    for internal, name in cfg.names:
        kind = schema.field(name).type
        if internal == WINDOW_START:
            start = cfg.rule.window_start(joined.column("l" + TS).to_numpy())
            arrays.append(pa.array(start * 1000, pa.int64()).cast(kind))
            continue
        if internal not in joined.column_names:
            arrays.append(pa.nulls(joined.num_rows, kind))
            continue
        column = joined.column(internal)
        if pa.types.is_timestamp(kind):  # kept as ms
            arrays.append(pc.multiply(column.cast(pa.int64()), 1000).cast(kind))
        else:
            arrays.append(column.cast(kind))
    arrays.append(pa.array(np.full(joined.num_rows, batch_id, dtype=np.int64)))
    return pa.Table.from_arrays(arrays, schema=schema)


def run_planned(
    spark: Any,
    cfg: JoinConfig,
    batches: BatchLog,
    batch_id: int,
    record: BatchRecord,
    tasks_of: Callable[[], tuple[pa.Table | None, Counts]] | None = None,
    emitted: Callable[[pa.Table], None] | None = None,
) -> BatchRecord:
    """Run a planned batch (its record written durably before this call) and commit it:
    the same record run again commits the same state version and replaces the same
    output. ``tasks_of``: what runs its tasks (default: :func:`run_batch` over the
    record's slices of the sides' topics); ``emitted``: given the batch's output rows
    once they are written (an aggregation over them in the same driver). Returns the
    finished record."""
    began = time.perf_counter()
    if tasks_of is None:
        joined, counts = run_batch(spark, cfg, batch_id, record)
    else:
        joined, counts = tasks_of()
    merged = time.perf_counter()
    table = output_rows(cfg, batch_id, joined)
    seen = dict(record.source_max_ms or {})
    for which, ms in counts.max_ms.items():
        seen[which] = max(seen.get(which, ms), ms)
    record.source_max_ms = seen
    if seen:
        record.max_event_ms = max(record.max_event_ms, *seen.values())
    record.input, record.late, record.malformed = counts.input, counts.late, counts.malformed
    record.filtered = counts.filtered
    # unmatched: events without a partner; alone: the rows emitted without one
    if cfg.join.stateless:  # counted by the lookup tasks (inner: dropped; a Select: none)
        unmatched = counts.unmatched
        alone = unmatched if cfg.join.how == "left" else 0
    elif joined is None:
        alone = unmatched = 0
    elif "r" + TS not in joined.column_names:  # a left join's unmatched rows only
        alone = unmatched = joined.num_rows
    else:
        alone = unmatched = joined.column("r" + TS).null_count
    record.joined, record.unmatched = table.num_rows - alone, unmatched
    late = pd.concat(counts.late_rows) if counts.late_rows else None
    dlq = pd.concat(counts.dlq_rows) if counts.dlq_rows else None
    if late is not None or dlq is not None:
        batches.put(batch_id, record)
        side_outputs(cfg, batch_id, batches, dlq, late)
        record.side_outputs_written = side_outputs_written(batches, batch_id)
    cfg.fence()
    store_batch(cfg.output, batch_id, table, cfg.fence)
    if cfg.join.topic is not None and cfg.log_url is not None and table.num_rows:
        _to_topic(cfg, batch_id, table)
    record.ms = {
        "state_job": round((merged - began) * 1000),
        "outputs": round((time.perf_counter() - merged) * 1000),
    }
    _commit(cfg, batches, batch_id, record)
    if emitted is not None:
        emitted(table)
    return record


def _to_topic(cfg: JoinConfig, batch_id: int, table: pa.Table) -> None:
    """The joined rows appended to the join's topic, keyed by the join key (exactly
    once per batch and partition: :class:`~riverbed.stream.sinks.TopicSink`)."""
    from riverbed.stream.sinks import TopicSink

    url, topic = cfg.log_url or "", cfg.join.topic or ""
    sink = TopicSink(url, topic, cfg.join.state_partitions, schema=table.schema)
    try:
        cfg.fence()
        key = cfg.join.on if cfg.join.select is not None else cfg.sides[0].key
        sink.write_table(batch_id, table, str(key))
    finally:
        sink.close()


def _commit(cfg: JoinConfig, batches: BatchLog, batch_id: int, record: BatchRecord) -> None:
    """The batch recorded done with running totals (the commit); every
    ``snapshot_every`` batches, old state history and batch records purged."""
    prev = batches.previous(batch_id)
    totals = dict(prev.totals) if prev is not None and prev.totals is not None else {}
    for c in (*COUNTS, "joined", "unmatched"):
        totals[c] = int(totals.get(c, 0)) + int(getattr(record, c) or 0)
    totals["batches"] = int(totals.get("batches", 0)) + 1
    batches.put(batch_id, replace(record, term=cfg.term, done=True, totals=totals))
    if (batch_id + 1) % cfg.state.snapshot_every == 0:
        try:
            provider = StateProvider(cfg.state)
            stateful = not cfg.join.stateless  # (a lookup join and a Select keep none)
            for partition in range(cfg.join.state_partitions if stateful else 0):
                provider.purge(cfg.namespace, partition, sweep_after=3600.0)
            batches.prune(batch_id + 1 - cfg.state.retain_versions)
        except Exception as exc:  # maintenance must not stop the join
            log.warning("maintenance of join %s failed (retried later): %s", cfg.join.name, exc)


__all__ = [
    "PREFIX",
    "SIDES",
    "WINDOW_START",
    "Counts",
    "JoinConfig",
    "JoinSide",
    "events",
    "joined_rows",
    "output_rows",
    "pair_task",
    "route",
    "run_batch",
    "run_planned",
    "side_slices",
    "stored_column",
    "watermark_of",
]
