"""The log-native path: the state tasks read riverbed topics themselves.

When the source is a riverbed topic, Spark does not need to move the events at all,
and riverbed runs the trigger loop itself (:mod:`riverbed.stream.loop`): each batch's
plan — its *slices*, one (partition, start, end) per log partition — is recorded before
it runs, and each batch runs one Spark job over those slices:

* **co-located** — the topic is keyed by the aggregation key with the key-hash
  partitioner and has as many partitions as the aggregation has state partitions, so
  log partition *p* holds exactly the keys of state partition *p*. For each partition
  a task (one per core, taking its share of the partitions) reads its slice (Arrow,
  vectorized), pre-aggregates, merges into state partition *p* and commits. No
  shuffle, no event crosses into the JVM.
* **shuffled** — otherwise tasks read pieces of the slices and pre-aggregate, and only
  the per-(window, key) partials are shuffled to the state partitions (an RDD
  ``partitionBy`` on the state partition: AQE never coalesces it, and the partition
  index *is* the state partition).

Either way the tasks also classify events as malformed (``_error``) or late (every
window already closed) and count them; the driver writes them to the side topics once
per batch, writes the batch's output, and records the batch. Re-runs of a batch get the
same slices and the same watermark from the batch record, so they commit the same
state version and replace the same output.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.errors import RiverbedError
from riverbed.gcpause import pausing
from riverbed.spark import tasks, tasks_in_this_process
from riverbed.spark.source import LogSlice, open_log, read_slice
from riverbed.state import openpool
from riverbed.state.provider import local_root
from riverbed.stream import lookups, shuffle
from riverbed.stream.batch import (
    SIDE_LIMIT,
    Maintenance,
    finish,
    side_outputs,
    side_outputs_written,
)
from riverbed.stream.batchlog import Batches, BatchRecord
from riverbed.stream.derive import derivation
from riverbed.stream.engine import (
    event_millis,
    merge_partition,
    partials_of,
    state_partition_of,
)
from riverbed.stream.errors import StreamValueError
from riverbed.stream.fencing import DriverFencedError
from riverbed.stream.grouping import Partial
from riverbed.stream.layout import handoff_dir
from riverbed.stream.lookups import tables as lookup_tables
from riverbed.stream.nativeconfig import DirectConfig
from riverbed.stream.plan import balanced_groups
from riverbed.stream.results import empty_rows, with_backfilled
from riverbed.stream.steal import Board, lopsided, split, steal_order
from riverbed.stream.validity import arrow_reasons
from riverbed.windows import late as window_late

log = logging.getLogger(__name__)


class NotCoLocatedError(RiverbedError):
    """A co-located task found a key that belongs to another state partition."""


@dataclass
class Side:
    """Per-task counts and side records."""

    input: int = 0
    late: int = 0
    malformed: int = 0
    filtered: int = 0  # events the spec's ``where`` (or an inner lookup) did not keep
    unmatched: int = 0  # events a lookup found no row for
    max_event_ms: int | None = None
    helped: int = 0  # records read for another task's state partition (steal.py)
    late_rows: list[pd.DataFrame] = field(default_factory=list)
    dlq_rows: list[pd.DataFrame] = field(default_factory=list)

    def saw(self, event_ms: int | None) -> None:
        """Raise ``max_event_ms`` to ``event_ms``."""
        if event_ms is not None:
            self.max_event_ms = max(self.max_event_ms or event_ms, event_ms)

    def add(self, other: Side) -> None:
        self.input += other.input
        self.late += other.late
        self.malformed += other.malformed
        self.filtered += other.filtered
        self.unmatched += other.unmatched
        self.helped += other.helped
        self.saw(other.max_event_ms)
        self.late_rows += other.late_rows
        self.dlq_rows += other.dlq_rows


def events(
    cfg: DirectConfig, piece: LogSlice, watermark_ms: int, side: Side, topic_log: Any = None
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Good, on-time events of ``piece`` as pandas frames with their event times (ms);
    the rest is counted in ``side``. ``topic_log``: an open log to read through."""
    read = read_slice(cfg.options, cfg.schema, piece, topic_log)
    yield from checked(cfg, read, watermark_ms, side)


def checked(
    cfg: DirectConfig,
    read: Iterable[pa.RecordBatch | pa.Table],
    watermark_ms: int,
    side: Side,
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Good, on-time events of ``read`` (Arrow batches with an ``_error`` column: a
    topic slice's, or a join's rows in the same driver, :mod:`riverbed.stream.
    joinedagg`) as pandas frames with their event times (ms); the rest is counted in
    ``side``."""
    spec = cfg.engine.spec
    tables = lookup_tables(cfg.engine.checkpoint, cfg.engine.lookups) if spec.lookups else ()
    for batch in read:
        side.input += batch.num_rows
        errors = batch.column("_error")
        derived = derivation(spec, batch.schema, tables)
        if derived is not None:  # the spec's lookups, columns and where (derive.py)
            table, why, kept, unmatched = derived.apply(batch, tables)
            errors = pc.coalesce(table.column("_error"), why)
            if unmatched is not None:
                side.unmatched += int(pc.sum(pc.and_(unmatched, pc.is_null(errors))).as_py() or 0)
            dropped = pc.and_(pc.invert(kept), pc.is_null(errors))
            side.filtered += int(pc.sum(dropped).as_py() or 0)
            table = table.set_column(table.schema.get_field_index("_error"), "_error", errors)
            batch = table.filter(pc.invert(dropped))
            errors = batch.column("_error")
        # a decoded event the aggregation cannot count (no key or time, a window out of
        # the calendar, a NaN a metric reads) is malformed too, as on the DataFrame path
        unusable = arrow_reasons(spec, batch)
        if unusable.null_count < batch.num_rows:
            errors = pc.coalesce(errors, unusable)
            batch = batch.set_column(batch.schema.get_field_index("_error"), "_error", errors)
        if errors.null_count < batch.num_rows:  # malformed records in this batch
            bad = pc.is_valid(errors)
            side.malformed += int(pc.sum(bad).as_py())
            if sum(map(len, side.dlq_rows)) < SIDE_LIMIT:
                side.dlq_rows.append(batch.filter(bad).to_pandas())
            batch = batch.filter(pc.invert(bad))
        if batch.num_rows == 0:
            continue
        # filtered in Arrow first: an integer column without nulls stays int64 in pandas;
        # only the columns the metrics read, a string key as a category (its codes are
        # the grouping partials_of needs: no Python string per event)
        pdf = _narrow(batch, spec.reads(), spec.key_column).to_pandas()
        ts = event_millis(pdf[spec.time])
        late = window_late(spec.window, ts, watermark_ms)
        if late.any():
            side.late += int(late.sum())
            if sum(map(len, side.late_rows)) < SIDE_LIMIT:  # every column but _error
                side.late_rows.append(_late_rows(batch, late))
        side.saw(int(ts.max()))
        if late.any():
            yield pdf.loc[~late], ts[~late]
        else:  # no copy of every row to drop none
            yield pdf, ts


def _late_rows(batch: pa.RecordBatch | pa.Table, late: np.ndarray) -> pd.DataFrame:
    """The late events of ``batch`` with every column but ``_error``."""
    return batch.filter(pa.array(late)).drop_columns(["_error"]).to_pandas()


def decimal_doubles(column: Any) -> Any:
    """Decimals as the nearest doubles, as Spark (``BigDecimal.doubleValue``) and Python
    give them: Arrow's own cast is 1 ulp off for about one value in seven (measured:
    27,290 of 200,000 prices * 0.908); through text, Arrow's parser rounds correctly."""
    return pc.cast(pc.cast(column, pa.string()), pa.float64())


def _narrow(batch: pa.RecordBatch | pa.Table, columns: list[str], key: str) -> pa.Table:
    """``columns`` of ``batch``, a string ``key`` dictionary-encoded; a decimal metric
    column as doubles (metrics compute in double)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    table = table.select(columns)
    for at, f in enumerate(table.schema):
        if pa.types.is_decimal(f.type) and f.name != key:
            table = table.set_column(at, f.name, decimal_doubles(table.column(at)))
    at = table.schema.get_field_index(key)
    if pa.types.is_string(table.schema.field(at).type) or pa.types.is_large_string(
        table.schema.field(at).type
    ):
        table = table.set_column(at, key, pc.dictionary_encode(table.column(at)))
    return table


def colocated_task(
    cfg: DirectConfig,
    batch_id: int,
    watermark_ms: int,
    previous_watermark_ms: int,
    groups: list[list[LogSlice]],
    board: Board | None,
) -> Any:
    """The work of task ``index``: for each state partition p of ``groups[index]``,
    read log partition p's slice, merge into state partition p; then help the other
    tasks with the pieces of their slices nobody has claimed yet (:mod:`riverbed.
    stream.steal`; no board: no helping — one task, an even plan, or ``steal=false``)."""
    spec = cfg.engine.spec
    n = spec.state_partitions

    def compute(topic_log: Any, piece: LogSlice) -> tuple[list[Partial], Side]:
        side = Side()
        partials: list[Partial] = []
        for pdf, ts in events(cfg, piece, watermark_ms, side, topic_log):
            # each distinct key once (a batch has few): not a partition per event
            keys = pd.Series(pdf[spec.key_column].unique())
            owners = state_partition_of(keys, n)
            stray = owners != piece.partition
            if stray.any():
                key = keys.to_numpy()[stray][0]
                fix = (
                    f"produce with the key {spec.key!r} on librdkafka's default partitioner "
                    "(Java's producer places keys by murmur2)"
                    if str(cfg.options.get("log", "")).startswith("kafka://")
                    else f'produce with key_field="{spec.key}"'
                )
                raise NotCoLocatedError(
                    f"topic {cfg.options['topic']!r} partition {piece.partition} holds "
                    f"{spec.key}={key!r}, which belongs to state partition "
                    f"{int(owners[stray][0])}: the topic is not keyed by {spec.key!r} "
                    f"(by its CRC-32). Either {fix}, or set the source option "
                    'co_locate="false" to shuffle partials instead.'
                )
            partials += partials_of(spec, pdf, watermark_ms, ts)
        return partials, side

    def claim(piece: LogSlice, index: int) -> bool:
        assert board is not None
        cfg.engine.fence()  # a replaced driver's tasks write nothing, not even a claim
        return board.claim(piece, index)

    def own(index: int, topic_log: Any, owned: LogSlice) -> tuple[pd.DataFrame, Side]:
        pieces = split(owned, cfg.piece_records)
        results: list[tuple[list[Partial], Side] | None] = [
            compute(topic_log, piece) if board is None or claim(piece, index) else None
            for piece in pieces
        ]
        side = Side()
        partials: list[Partial] = []
        for piece, result in zip(pieces, results, strict=True):
            if result is None:  # a helper claimed it: take what it computed
                assert board is not None
                result = board.take(piece) or compute(topic_log, piece)
            partials += result[0]
            side.add(result[1])
        rows = merge_partition(
            cfg.engine, owned.partition, batch_id, watermark_ms, previous_watermark_ms, partials
        )
        return rows, side

    @pausing  # a task's partials, its merge and its rows: riverbed.gcpause
    def run(index: int) -> list[tuple[pd.DataFrame, Side]]:
        topic_log = open_log(cfg.options)
        try:
            out = [own(index, topic_log, owned) for owned in groups[index]]
            if board is not None:
                helped = Side()
                for piece in steal_order(groups, index, cfg.piece_records):
                    if claim(piece, index):
                        result = compute(topic_log, piece)
                        cfg.engine.fence()
                        board.put(piece, result)
                        helped.helped += piece.end - piece.start
                out.append((empty_rows(spec), helped))
            return out
        finally:
            topic_log.close()

    return run


def shuffle_tasks(cfg: DirectConfig, watermark_ms: int) -> Any:
    """Stage 1 of the shuffled path: a piece's partials as :func:`shuffle.values`, and
    one (n, Side) pair for the driver."""
    spec = cfg.engine.spec
    n = spec.state_partitions

    @pausing
    def run(piece: LogSlice) -> list[tuple[int, Any]]:
        side = Side()
        partials: list[Partial] = []
        for pdf, ts in events(cfg, piece, watermark_ms, side):
            partials += partials_of(spec, pdf, watermark_ms, ts)
        out: list[tuple[int, Any]] = [*shuffle.values(partials, n), (n, side)]
        return out

    return run


def pieces(slices: list[LogSlice], parallelism: int) -> list[LogSlice]:
    """Split slices so that every core gets about two pieces of work."""
    total = sum(s.end - s.start for s in slices)
    size = max(20_000, -(-total // max(1, 2 * parallelism)))
    out = []
    for s in slices:
        for start in range(s.start, s.end, size):
            out.append(LogSlice(s.partition, start, min(start + size, s.end)))
    return out


def in_driver(records: int, limit: int, master: str) -> bool:
    """Whether a batch of ``records`` runs in the driver process: at most ``limit``
    records (0: never) — one with none too (its watermark moved: it closes windows) —
    and a ``local``/``local[…]`` master, whose tasks run in this machine's Python
    workers with this machine's state directory anyway (not ``local-cluster``, whose
    executors stand for other machines)."""
    return limit > 0 and records <= limit and tasks_in_this_process(master)


def task_attempts(master: str) -> int:
    """How many times Spark runs a failing task under a local master: ``local[N,F]``
    gives F, any other local master 1 (Spark ignores spark.task.maxFailures there)."""
    found = re.fullmatch(r"local\[[^,\]]+,\s*(\d+)\]", master.strip())
    return max(1, int(found.group(1))) if found else 1


def _attempted(task: Any, index: int, attempts: int) -> Any:
    """``task(index)`` run in the driver, retried as Spark retries a failed task (a
    task's work is idempotent: a retry re-commits the same state version)."""
    for attempt in range(1, attempts + 1):
        try:
            return task(index)
        except (DriverFencedError, NotCoLocatedError):
            raise  # a retry would find the same key where it is
        except Exception as exc:
            if attempt == attempts:
                raise
            log.warning("task %s failed in the driver (attempt %s): %s", index, attempt, exc)
    raise AssertionError("unreachable")


def _colocated_job(
    spark: Any,
    cfg: DirectConfig,
    batch_id: int,
    watermark: int,
    previous: int,
    groups: list[list[LogSlice]],
) -> list[list[tuple[pd.DataFrame, Side]]]:
    """The co-located tasks as one Spark job, one task per group, with a work-stealing
    board when the groups are lopsided."""
    spec = cfg.engine.spec
    board = None
    # the board is a directory every task reaches (none: tasks on other machines
    # with a bucket's checkpoint)
    where = tasks.master(spark)
    handoff = handoff_dir(cfg.engine.checkpoint, cfg.engine.state.local_dir, spec.name, where)
    if cfg.steal and lopsided(groups) and handoff is not None:
        cfg.engine.fence()  # a replaced driver writes nothing, not even a board
        board = Board.create(handoff, batch_id)
    task = colocated_task(cfg, batch_id, watermark, previous, groups, board)
    try:
        results: list[list[tuple[pd.DataFrame, Side]]] = tasks.map_items(
            spark, range(len(groups)), task
        )
    finally:
        if board is not None:
            # a replaced driver deletes nothing either: the sweep removes its board
            with contextlib.suppress(DriverFencedError):
                cfg.engine.fence()
                board.remove()
    return results


def run_batch(
    spark: Any,
    cfg: DirectConfig,
    batch_id: int,
    record: BatchRecord,
    slices: list[LogSlice],
) -> tuple[pd.DataFrame, Side]:
    """Run one micro-batch's Spark job; returns the emitted rows and the side counts."""
    spec = cfg.engine.spec
    n = spec.state_partitions
    watermark, previous = record.watermark_ms, record.previous_watermark_ms
    tasks.describe(spark, f"riverbed {spec.name} batch {batch_id}")
    where, parallelism = tasks.master(spark), tasks.parallelism(spark)
    side = Side()
    frames = []
    # a plan recorded before a rescale (rescale.py) co-located N log partitions with N
    # state partitions; with another count now it runs shuffled (the same results)
    if record.co_located and len(record.slices or {}) == n:
        by_partition = {s.partition: s for s in slices}
        work = [by_partition.get(p, LogSlice(p, 0, 0)) for p in range(n)]
        # One task per core, not per partition: a PySpark task costs ~50-100 ms to
        # launch here whatever it does, so 4 partitions on 2 cores in 4 tasks paid that
        # twice a core. The partitions are spread by size, biggest first
        # (longest-processing-time), each task merges its partitions in turn, and a
        # task done early reads pieces of the others' slices for them (steal.py).
        groups = balanced_groups(work, lambda s: s.end - s.start, parallelism)
        if in_driver(sum(s.end - s.start for s in work), cfg.driver_records, where):
            # a small batch: a Spark job's own cost (~100 ms here, docs/stream.md) would
            # be most of its time; the same tasks run here, a thread each (their time is
            # mostly RocksDB and fsync, which let go of the GIL), with no board
            task = colocated_task(cfg, batch_id, watermark, previous, groups, None)
            attempts = task_attempts(where)
            results = tasks.in_threads(
                lambda i: _attempted(task, i, attempts), range(len(groups)), len(groups)
            )
        else:
            # the job's tasks, in other processes, open the partitions
            openpool.let_go(local_root(cfg.engine.state, cfg.engine.namespace))
            results = _colocated_job(spark, cfg, batch_id, watermark, previous, groups)
        for group_rows in results:
            for rows, part_side in group_rows:
                frames.append(rows)
                side.add(part_side)
    else:
        work = pieces([s for s in slices if s.end > s.start], parallelism)

        def merge(index: int, values: Iterator[bytes]) -> pd.DataFrame:
            partials = shuffle.unpacked(values)
            return merge_partition(cfg.engine, index, batch_id, watermark, previous, partials)

        total = sum(s.end - s.start for s in work)
        if in_driver(total, cfg.shuffled_driver_records, where):
            # a small batch (also one with no input: the watermark moved), as a
            # co-located one: the same two stages in the driver's threads (a Spark job's
            # own cost, ~250 ms a batch here, would be most of it)
            stage1 = shuffle_tasks(cfg, watermark)
            merged, sides = _shuffled_here(work, stage1, n, merge, task_attempts(where))
        else:
            openpool.let_go(local_root(cfg.engine.state, cfg.engine.namespace))
            merged, sides = tasks.shuffle_job(
                spark, work, LogSlice(0, 0, 0), shuffle_tasks(cfg, watermark), n, merge
            )
        frames += merged
        for s in sides:
            side.add(s)
    full = [f for f in frames if len(f)]
    if not full:
        return empty_rows(spec), side
    return pd.concat(full, ignore_index=True), side


def _shuffled_here(
    work: list[LogSlice], stage1: Any, n: int, merge: Any, attempts: int
) -> tuple[list[pd.DataFrame], list[Side]]:
    """:func:`tasks.shuffle_job`'s two stages in the driver's threads: each piece's
    (state partition, partial) pairs, then each partition merged (a failed merge tried
    ``attempts`` times, as Spark would) — the merges' rows and the pieces' side counts."""
    pairs: list[tuple[int, Any]] = []
    sides: list[Side] = []
    for piece in tasks.in_threads(stage1, work, max(1, min(len(work), 4))):
        sides += [value for p, value in piece if p == n]
        pairs += [(p, value) for p, value in piece if p != n]
    return merged_here(pairs, n, merge, attempts), sides


def merged_here(
    pairs: list[tuple[int, Any]], n: int, merge: Any, attempts: int
) -> list[pd.DataFrame]:
    """Stage 2 of a shuffle in the driver's threads: every state partition ``p`` < ``n``
    (also one without values) merged by ``merge(p, its values)``, a failed merge tried
    ``attempts`` times as Spark would — the merges' rows."""
    routed: dict[int, list[Any]] = {p: [] for p in range(n)}
    for p, value in pairs:
        routed[p].append(value)
    return tasks.in_threads(
        lambda p: _attempted(lambda i: merge(i, iter(routed[i])), p, attempts), range(n), min(n, 4)
    )


def _stray(cfg: DirectConfig, exc: BaseException) -> bool:
    """Whether a co-located batch failed only on a key placed elsewhere, where the
    user left co-location to riverbed (``co_locate=auto``)."""
    if str(cfg.options.get("co_locate", "auto")).lower() != "auto":
        return False  # co_locate=true: the user said every key is in place
    if isinstance(exc, NotCoLocatedError):
        return True  # a task that ran in the driver
    return f"{NotCoLocatedError.__name__}:" in str(exc)  # one of a Spark job


def run_planned(
    spark: Any,
    cfg: DirectConfig,
    batches: Batches,
    batch_id: int,
    record: BatchRecord,
    plan_ms: int = 0,
    maintenance: Maintenance | None = None,
    rows_of: Callable[[DirectConfig], tuple[pd.DataFrame, Side]] | None = None,
    emitted: Callable[[pa.Table], None] | None = None,
) -> BatchRecord:
    """Run a batch whose plan is recorded (its ``slices``, watermark and co-location,
    written durably before this call): merge into state version ``batch_id``, write the
    side topics, the result table and the sinks, and record the batch as done. A re-run
    of the same record commits the same state version and replaces the same output.
    ``plan_ms`` is what planning it took (recorded with the batch's other phases);
    ``maintenance`` runs the periodic maintenance off the caller's thread. ``rows_of``:
    what computes the batch's rows instead of its slices' tasks (a join's rows in the
    same driver: :mod:`riverbed.stream.joinedagg`); ``emitted``: given the batch's result
    rows before it commits (an aggregation over them in the same driver:
    :mod:`riverbed.stream.chain`). Returns the finished record."""
    began = time.perf_counter()
    if record.slices is None and rows_of is None:
        raise StreamValueError(f"batch {batch_id} has no recorded plan to run")
    slices = [LogSlice(int(p), int(se[0]), int(se[1])) for p, se in (record.slices or {}).items()]
    slices.sort(key=lambda s: s.partition)
    if cfg.engine.spec.lookups:  # the lookup tables as the plan recorded them
        cfg = replace(cfg, engine=lookups.running(cfg.engine, batches, batch_id, record))
    try:
        if rows_of is not None:
            rows, side = rows_of(cfg)
        else:
            rows, side = run_batch(spark, cfg, batch_id, record, slices)
    except Exception as exc:
        if rows_of is not None or not (record.co_located and _stray(cfg, exc)):
            raise
        # co_locate=auto and a key in another state partition's log partition: a
        # producer placed it by an older partition count (it had not yet seen a `topic
        # alter`), or the topic is not keyed as sampled. The same slices, shuffled, give
        # the same results
        log.warning(
            "batch %d of %s: a log partition holds a key of another state partition "
            "(placed by an older partition count, or the topic is not keyed by %r); "
            "running the batch shuffled",
            batch_id,
            cfg.engine.spec.name,
            cfg.engine.spec.key,
        )
        shuffled = True  # the plan stays as recorded: a re-run tries it, and falls back
        rows, side = run_batch(spark, cfg, batch_id, replace(record, co_located=False), slices)
    else:
        shuffled = False
    pending = cfg.engine.backfill_rows
    if pending is not None and pending[0] == batch_id:  # a backfill's rows (backfill.py)
        rows = with_backfilled(cfg.engine.checkpoint, pending[1], rows)
    merged = time.perf_counter()
    if side.max_event_ms is not None:
        record.max_event_ms = max(record.max_event_ms, side.max_event_ms)
    record.late, record.malformed, record.helped = side.late, side.malformed, side.helped
    record.filtered = side.filtered
    if cfg.engine.spec.lookups:
        record.unmatched = side.unmatched
    late = pd.concat(side.late_rows) if side.late_rows else None
    dlq = pd.concat(side.dlq_rows) if side.dlq_rows else None
    if late is not None or dlq is not None:
        batches.put(batch_id, record)
        side_outputs(cfg.engine, batch_id, batches, dlq, late)
        # only the flag: the recorded plan holds no counts (a re-run counts again)
        record.side_outputs_written = side_outputs_written(batches, batch_id)
    record.ms = {  # where the batch's time went, for `riverbed stream status`
        "offsets": plan_ms,
        "state_job": round((merged - began) * 1000),
    }
    record.input = side.input
    if shuffled:
        record.co_located = False  # what it ran as, in the commit
    finish(
        cfg.engine, batches, batch_id, record, rows,
        outputs_from=merged, maintenance=maintenance, emitted=emitted,
    )  # fmt: skip
    return record
