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
import dataclasses
import itertools
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.errors import RiverbedError
from riverbed.log.kafka import PARTITIONER as KAFKA_PARTITIONER
from riverbed.log.partitioners import KeyHashPartitioner
from riverbed.spark import tasks_in_this_process
from riverbed.spark.source import LogSlice, open_log, read_slice
from riverbed.state import kept
from riverbed.stream.aggregation import KEY
from riverbed.stream.batch import (
    SIDE_LIMIT,
    Maintenance,
    finish,
    side_outputs,
    side_outputs_written,
)
from riverbed.stream.derive import derivation
from riverbed.stream.engine import (
    EngineConfig,
    Partial,
    event_millis,
    merge_partition,
    partials_of,
    state_partition_of,
)
from riverbed.stream.errors import StreamValueError
from riverbed.stream.fencing import DriverFencedError
from riverbed.stream.layout import Checkpoint, handoff_dir, is_local
from riverbed.stream.metrics import VALUE_METRICS
from riverbed.stream.plan import balanced_groups, slices_json
from riverbed.stream.records import Batches, BatchRecord
from riverbed.stream.results import empty_rows
from riverbed.stream.steal import PIECE, Board, lopsided, split, steal_order
from riverbed.stream.validity import arrow_reasons
from riverbed.stream.windows import late as window_late

if TYPE_CHECKING:
    from riverbed.log import Log

log = logging.getLogger(__name__)

# Co-located batches up to this many records can run in the driver process (local
# masters): a PySpark job costs ~100 ms here whatever it does, more than a small batch's
# own work. The source option driverBatchRecords sets it (0: never; docs/stream.md).
DRIVER_BATCH_RECORDS = 50_000


class NotCoLocatedError(RiverbedError):
    """A co-located task found a key that belongs to another state partition."""


@dataclass(frozen=True)
class DirectConfig:
    """What the tasks need besides the engine config; pickled to executors."""

    engine: EngineConfig
    options: dict[str, str]  # source options: topic, log, ...
    schema: Any  # StructType: value fields + the source's metadata columns
    co_located: bool
    max_records: int | None = None  # maxRecordsPerBatch (None: no bound)
    starting: str = "earliest"  # startingOffsets: where a first batch starts
    steal: bool = True  # co-located tasks done early help the others (steal.py)
    piece_records: int = PIECE  # co-located tasks claim and help with pieces this big
    # co-located batches of at most this many records, with a local master, run in the
    # driver process instead of as a Spark job (DRIVER_BATCH_RECORDS; 0: never)
    driver_records: int = DRIVER_BATCH_RECORDS


@dataclass
class Side:
    """Per-task counts and side records."""

    input: int = 0
    late: int = 0
    malformed: int = 0
    filtered: int = 0  # events the spec's ``where`` did not keep
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
        self.helped += other.helped
        self.saw(other.max_event_ms)
        self.late_rows += other.late_rows
        self.dlq_rows += other.dlq_rows


def _events(
    cfg: DirectConfig, piece: LogSlice, watermark_ms: int, side: Side, topic_log: Any = None
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Good, on-time events of ``piece`` as pandas frames with their event times (ms);
    the rest is counted in ``side``. ``topic_log``: an open log to read through."""
    spec = cfg.engine.spec
    for batch in read_slice(cfg.options, cfg.schema, piece, topic_log):
        side.input += batch.num_rows
        errors = batch.column("_error")
        derived = derivation(spec, batch.schema)
        if derived is not None:  # the spec's columns and where (derive.py)
            table, why, kept = derived.apply(batch)
            errors = pc.coalesce(errors, why)
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
        for pdf, ts in _events(cfg, piece, watermark_ms, side, topic_log):
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
    """Stage 1 of the shuffled path: (state partition, partial) pairs, and one
    (n, Side) pair for the driver."""
    spec = cfg.engine.spec
    n = spec.state_partitions

    def run(piece: LogSlice) -> list[tuple[int, Any]]:
        side = Side()
        out: list[tuple[int, Any]] = []
        for pdf, ts in _events(cfg, piece, watermark_ms, side):
            partials = partials_of(spec, pdf, watermark_ms, ts)
            if partials:
                owners = state_partition_of(pd.Series([key for _, key, _ in partials]), n)
                out += [(int(p), partial) for p, partial in zip(owners, partials, strict=True)]
        out.append((n, side))
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
    """Whether a co-located batch of ``records`` runs in the driver process: at most
    ``limit`` records (0: never) and a ``local``/``local[…]`` master, whose tasks run in
    this machine's Python workers with this machine's state directory anyway (not
    ``local-cluster``, whose executors stand for other machines)."""
    return 0 < records <= limit and tasks_in_this_process(master)


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
        except DriverFencedError:
            raise
        except Exception as exc:
            if attempt == attempts:
                raise
            log.warning("task %s failed in the driver (attempt %s): %s", index, attempt, exc)
    raise AssertionError("unreachable")


def _colocated_job(
    sc: Any,
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
    handoff = handoff_dir(cfg.engine.checkpoint, cfg.engine.state.local_dir, spec.name, sc.master)
    if cfg.steal and lopsided(groups) and handoff is not None:
        cfg.engine.fence()  # a replaced driver writes nothing, not even a board
        board = Board.create(handoff, batch_id)
    task = colocated_task(cfg, batch_id, watermark, previous, groups, board)
    try:
        results: list[list[tuple[pd.DataFrame, Side]]] = (
            sc.parallelize(range(len(groups)), len(groups)).map(task).collect()
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
    sc = spark.sparkContext
    sc.setJobDescription(f"riverbed {spec.name} batch {batch_id}")
    side = Side()
    frames = []
    if record.co_located:
        by_partition = {s.partition: s for s in slices}
        work = [by_partition.get(p, LogSlice(p, 0, 0)) for p in range(n)]
        # One task per core, not per partition: a PySpark task costs ~50-100 ms to
        # launch here whatever it does, so 4 partitions on 2 cores in 4 tasks paid that
        # twice a core. The partitions are spread by size, biggest first
        # (longest-processing-time), each task merges its partitions in turn, and a
        # task done early reads pieces of the others' slices for them (steal.py).
        groups = balanced_groups(work, lambda s: s.end - s.start, sc.defaultParallelism)
        if in_driver(sum(s.end - s.start for s in work), cfg.driver_records, sc.master):
            # a small batch: a Spark job's own cost (~100 ms here, docs/stream.md) would
            # be most of its time; the same tasks run here, a thread each (their time is
            # mostly RocksDB and fsync, which let go of the GIL), with no board
            task = colocated_task(cfg, batch_id, watermark, previous, groups, None)
            attempts = task_attempts(sc.master)
            with ThreadPoolExecutor(len(groups), thread_name_prefix="riverbed-task") as pool:
                results = list(
                    pool.map(lambda i: _attempted(task, i, attempts), range(len(groups)))
                )
        else:
            kept.let_go()  # the job's tasks, in other processes, open the partitions
            results = _colocated_job(sc, cfg, batch_id, watermark, previous, groups)
        for group_rows in results:
            for rows, part_side in group_rows:
                frames.append(rows)
                side.add(part_side)
    else:
        kept.let_go()
        work = pieces([s for s in slices if s.end > s.start], sc.defaultParallelism)
        stage1 = sc.parallelize(work or [LogSlice(0, 0, 0)], max(1, len(work)))
        shuffled = stage1.flatMap(shuffle_tasks(cfg, watermark)).partitionBy(n + 1, lambda p: p)

        def merge(index: int, items: Iterator[tuple[int, Any]]) -> Iterator[Any]:
            if index == n:  # the driver's channel: every task's Side
                yield ("side", [s for _, s in items])
                return
            rows = merge_partition(
                cfg.engine, index, batch_id, watermark, previous, (p for _, p in items)
            )
            yield ("rows", rows)

        for kind, value in shuffled.mapPartitionsWithIndex(merge).collect():
            if kind == "rows":
                frames.append(value)
            else:
                for s in value:
                    side.add(s)
    full = [f for f in frames if len(f)]
    if not full:
        return empty_rows(spec), side
    return pd.concat(full, ignore_index=True), side


def run_planned(
    spark: Any,
    cfg: DirectConfig,
    batches: Batches,
    batch_id: int,
    record: BatchRecord,
    plan_ms: int = 0,
    maintenance: Maintenance | None = None,
) -> BatchRecord:
    """Run a batch whose plan is recorded (its ``slices``, watermark and co-location,
    written durably before this call): merge into state version ``batch_id``, write the
    side topics, the result table and the sinks, and record the batch as done. A re-run
    of the same record commits the same state version and replaces the same output.
    ``plan_ms`` is what planning it took (recorded with the batch's other phases);
    ``maintenance`` runs the periodic maintenance off the caller's thread. Returns the
    finished record."""
    began = time.perf_counter()
    if record.slices is None:
        raise StreamValueError(f"batch {batch_id} has no recorded plan to run")
    slices = [LogSlice(int(p), int(se[0]), int(se[1])) for p, se in record.slices.items()]
    slices.sort(key=lambda s: s.partition)
    rows, side = run_batch(spark, cfg, batch_id, record, slices)
    merged = time.perf_counter()
    if side.max_event_ms is not None:
        record.max_event_ms = max(record.max_event_ms, side.max_event_ms)
    record.late, record.malformed, record.helped = side.late, side.malformed, side.helped
    record.filtered = side.filtered
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
    finish(
        cfg.engine, batches, batch_id, record, rows, outputs_from=merged, maintenance=maintenance
    )
    return record


def spark_ends(checkpoint: str | Path, batch_id: int) -> dict[int, int] | None:
    """Where batch ``batch_id`` ended in every log partition according to Spark's
    write-ahead offset log (``spark/offsets/<b>``): for checkpoints written when a
    Spark streaming query drove this path (their batch records hold no slices).
    ``None`` when it cannot tell (file gone, an unexpected format, a bucket)."""
    if not is_local(checkpoint):
        return None
    try:
        offsets = source_offsets(Checkpoint.of(checkpoint).spark_offsets / str(batch_id))
    except (OSError, ValueError):
        return None
    return None if offsets is None else {int(p): int(e) for p, e in offsets.items()}


def spark_committed_ends(checkpoint: str | Path) -> dict[int, int] | None:
    """Where the newest batch in Spark's commit log ended in every partition
    (:func:`spark_ends` of it); ``None`` before the first commit or when the logs
    cannot tell (a bucket, an unexpected format)."""
    if not is_local(checkpoint):
        return None
    commits = Checkpoint.of(checkpoint).spark_commits
    done = sorted(int(p.name) for p in commits.glob("*") if p.name.isdigit())
    return spark_ends(checkpoint, done[-1]) if done else None


def committed_ends(checkpoint: str | Path, newest_first: Iterable[BatchRecord]) -> dict[int, int]:
    """Where the newest finished batch ended, per log partition: its recorded plan, or
    for a checkpoint of the Spark-driven loop, Spark's commit and offset logs ({}: no
    batch finished, or they cannot tell)."""
    from riverbed.stream.plan import ends_of

    done = next((d for d in newest_first if d.done), None)
    if done is not None and done.slices is not None:
        return ends_of(done.slices)
    return spark_committed_ends(checkpoint) or {}


def read_ends(checkpoint: str | Path) -> tuple[dict[int, int] | None, bool]:
    """:func:`committed_ends` of a checkpoint (``None`` when there are none), and
    whether Spark's streaming engine drove its batches (their records hold no slices:
    a checkpoint of the DataFrame path, which stays on it). Records are read newest
    first, only as far as the newest finished one."""
    from riverbed.stream.records import open_batches

    batches = open_batches(checkpoint)
    records = (r for r in map(batches.get, reversed(batches.ids())) if r is not None)
    newest = next(records, None)
    if newest is None:
        return None, False
    if newest.slices is None:
        return spark_committed_ends(checkpoint), True
    return committed_ends(checkpoint, itertools.chain([newest], records)) or None, False


def spark_slices(checkpoint: str | Path, batch_id: int) -> dict[str, list[int]] | None:
    """A batch's slices, as a batch record stores them, from Spark's offset log: batch
    *b* started where *b - 1* ended. ``None`` when the log cannot tell (batch 0, files
    gone, an unexpected format)."""
    if batch_id == 0:
        return None
    end, start = spark_ends(checkpoint, batch_id), spark_ends(checkpoint, batch_id - 1)
    if end is None or start is None:
        return None
    return slices_json({p: start.get(p, 0) for p in end}, end)


def source_offsets(path: Path) -> dict[str, int] | None:
    """The one source's offsets in an offset log file (``v1``, metadata, one line per
    source), if it has that shape: riverbed's ``{"<partition>": end}``, or Spark's Kafka
    source's ``{"<topic>": {"<partition>": end}}`` (one topic)."""
    import json

    lines = path.read_text().splitlines()
    if len(lines) != 3 or lines[0] != "v1":
        return None
    offsets = json.loads(lines[2])
    if isinstance(offsets, dict) and len(offsets) == 1:
        (only,) = offsets.values()
        if isinstance(only, dict):
            offsets = only
    if not isinstance(offsets, dict) or not all(
        isinstance(v, int) and str(k).isdigit() for k, v in offsets.items()
    ):
        return None
    return offsets


def decide_co_location(topic_log: Log, options: dict[str, str], spec: Any) -> bool:
    """Co-locate when asked (``co_locate``: auto | true | false) and the topic fits: one
    log partition per state partition, its records keyed by the aggregation key and
    placed by the key's CRC-32 (riverbed's key-hash partitioner — and librdkafka's
    default, ``consistent_random``, so a Kafka topic written by a librdkafka client
    keyed by the aggregation key fits; Java's producer places by murmur2 and does not).
    Checked on the first records of every partition here (a Kafka topic's placement
    too: riverbed does not know its producers), and on every record by the tasks."""
    choice = options.get("co_locate", "auto").lower()
    if choice not in ("auto", "true", "false"):
        raise StreamValueError(f"co_locate must be auto, true or false, not {choice!r}")
    if choice == "false":
        return False
    if spec.composite or spec.key in spec.columns:  # no producer placed records by it
        if choice == "true":
            raise StreamValueError(
                f"co_locate=true: the key {spec.key!r} is derived (a derived column, or a "
                "composite key's text), which no producer placed the topic's records by; "
                "leave co_locate at auto"
            )
        return False
    topic = topic_log.topic(options["topic"])
    hashed = topic.partitioner == KeyHashPartitioner.name  # placed by riverbed's producer
    placed_by_others = topic.partitioner == KAFKA_PARTITIONER
    fits = (hashed or placed_by_others) and topic.partitions == spec.state_partitions
    if fits and choice == "auto":
        sampled = 0
        for p in range(topic.partitions):
            first = topic_log.storage.offsets(topic.name, p)[0]
            # a malformed record (not decodable, not an object, no key) says nothing of
            # how keys are placed, and the batch counts it and sends it to the DLQ
            for record in topic_log.read(topic.name, p, first, 100, malformed="skip"):
                value = record.value
                if not isinstance(value, dict) or value.get(spec.key) is None:
                    continue
                if record.key != str(value[spec.key]).encode():
                    return False
                if not hashed and _KEY_HASH.partition(record.key, topic.partitions) != p:
                    return False
                sampled += 1
        if placed_by_others and not sampled:
            return False  # no record shows yet how the producers place keys
    if choice == "true" and not fits:
        raise StreamValueError(
            f"co_locate=true needs topic {options['topic']!r} to have "
            f"{spec.state_partitions} partitions (the aggregation's state_partitions) and "
            "records placed by the CRC-32 of their key (riverbed's key-hash partitioner, "
            "or a Kafka producer on librdkafka's default partitioner)"
        )
    return fits


_KEY_HASH = KeyHashPartitioner()


def prepare(config: EngineConfig, options: dict[str, str]) -> DirectConfig:
    """Check a topic source's options against the topic and the aggregation, and decide
    co-location; on the driver, with a Spark session running (DDL is parsed by it)."""
    from pyspark.sql.types import StructType

    from riverbed.spark.offsets import source_limits
    from riverbed.spark.source import META_FIELDS, value_schema

    if "topic" not in options:
        raise StreamValueError('a riverbed source needs {"topic": NAME, ...}')
    lowered = {k.lower(): v for k, v in options.items()}  # Spark's option names: any case
    max_records, starting = source_limits(lowered)
    steal = str(options.get("steal", "true")).lower()
    if steal not in ("true", "false"):
        raise StreamValueError(f"steal must be true or false, not {steal!r}")
    driver_records = _count_option(lowered, "driverBatchRecords", DRIVER_BATCH_RECORDS)
    topic_log = open_log(options)
    try:
        if options["topic"] not in topic_log.topics():
            raise StreamValueError(
                f"topic {options['topic']!r} does not exist in {options['log']}; create it "
                f"with `riverbed topic create {options['topic']} --partitions "
                f"{config.spec.state_partitions}`"
            )
        co_located = decide_co_location(topic_log, options, config.spec)
    finally:
        topic_log.close()
    values = value_schema(lowered)
    # a DDL string is parsed here, on the driver: executors cannot parse DDL
    parsed = StructType.fromDDL(values) if isinstance(values, str) else values
    if not isinstance(parsed, StructType):
        raise StreamValueError(f"schema {options.get('schema')!r} must be a list of fields")
    schema = StructType(list(parsed.fields) + META_FIELDS)
    derived = _derived_names(config.spec, schema)
    config = _with_column_types(config, schema)
    missing = [c for c in config.spec.reads() if c not in schema.fieldNames() + derived]
    if missing:
        raise StreamValueError(
            f"aggregation {config.spec.name!r} reads column(s) {missing}, which the topic's "
            f"schema ({', '.join(schema.fieldNames())}) does not have"
        )
    return DirectConfig(
        config,
        options,
        schema,
        co_located,
        max_records,
        starting,
        steal == "true",
        driver_records=driver_records,
    )


def _derived_names(spec: Any, schema: Any) -> list[str]:
    """The spec's derived columns, compiled here against the source's schema so that a
    ``where`` or ``columns`` that cannot be evaluated is refused at start."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from riverbed.stream.derive import compile_for, input_types

    if not spec.derives:
        return []
    derived = compile_for(spec, input_types(to_arrow_schema(schema, timezone="UTC")))
    names = [name for name, _ in derived.columns] if derived is not None else []
    return [*names, KEY] if spec.composite else names


def _with_column_types(config: EngineConfig, schema: Any) -> EngineConfig:
    """``config`` with its spec's composite key part types, from the source's schema and
    the derived columns (the result table types each part as its column)."""
    spec = config.spec
    if not spec.composite and not any(isinstance(m, VALUE_METRICS) for m in spec.metrics.values()):
        return config
    from pyspark.sql.pandas.types import to_arrow_schema

    from riverbed.stream.derive import column_types
    from riverbed.stream.keys import resolved

    types = column_types(config.spec, to_arrow_schema(schema, timezone="UTC"))
    return dataclasses.replace(config, spec=resolved(config.spec, types))


def _count_option(lowered: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative whole-number source option (``lowered``: the options with their
    names in lower case)."""
    given = lowered.get(name.lower())
    if given is None:
        return default
    try:
        value = int(str(given))
    except ValueError:
        value = -1
    if value < 0:
        raise StreamValueError(
            f"{name} must be a whole number of records, 0 or more, not {given!r}"
        )
    return value
