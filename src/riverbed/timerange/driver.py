"""The driver of a time-range job: one active per job, chunks in order, fenced publication.

``Driver.run(start, end)``:

1. campaign in the job's election (``timerange/<name>``): a second driver waits here as a
   hot standby and takes over when the first one's lease ends;
2. finish moving the files of the last published chunk (a driver may have died between
   its compare-and-swap and its renames), forget files no record names;
3. record the request in the progress marker (:func:`~riverbed.timerange.plan.plan_request`);
4. for each chunk :func:`~riverbed.timerange.plan.next_chunk` names: compute it on
   Spark, stage its files and its carried state under a fresh token, then in **one
   transaction guarded by the job's fence and the marker's revision** advance the marker
   and write the chunk's record; only then move the staged files into place.

The fence is a :class:`riverbed.fencing.ControlFence` the driver claims with its election
term right after it is elected, before it reads the marker. A driver whose term was
replaced cannot advance the marker (the transaction fails) and so never publishes: its
staged files are named by no record and are forgotten by the next driver.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from riverbed.control.base import Compare, ControlPlane, Delete, Put
from riverbed.control.election import Election
from riverbed.control.processes import host_name
from riverbed.control.session import Session
from riverbed.fencing import ControlFence
from riverbed.spark import driver_heap_bytes, tasks_on_this_machine
from riverbed.timerange.carry import Boundary, carries, chunk_rows
from riverbed.timerange.compute import ChunkFrames, compute_chunk
from riverbed.timerange.errors import (
    BadInputError,
    FencedError,
    RangeError,
    raised_by_us,
)
from riverbed.timerange.output import TimeRangeOutput
from riverbed.timerange.plan import (
    Progress,
    Shape,
    chunk_label,
    format_time,
    next_chunk,
    parse_time,
    plan_request,
)
from riverbed.timerange.plan import advance as advance_progress
from riverbed.timerange.spec import LoadedSpec, TimeRangeSpec, label, window_dataset

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from riverbed.tables import PartitionTable

log = logging.getLogger(__name__)

__all__ = ["ChunkRecord", "Driver", "Event", "Keys", "reset", "shape_of", "status"]

MAX_BATCH = 24  # chunks one Spark query computes, at most
# What a batch's rows may take in the driver's memory (Arrow bytes, at the size of the
# chunks before) when Spark's executors spill them as Parquet for it to read back
# (output.py): the table, its chunks and their Parquet encoding side by side.
SPILL_BYTES = 512 << 20
# Otherwise the rows come back through the driver JVM (``toArrow``), which holds a
# query's whole result before Python gets it: a share of its heap (with Spark's default
# 1 GiB ~150 MB in one query ran it out, ~100 not). That way is the faster one (Python
# reads while Spark computes) as long as a batch is more than a few chunks; below
# MIN_COLLECTED chunks a batch spills, when the executors reach the output.
HEAP_SHARE = 1 / 16
MIN_COLLECTED = 4


def shape_of(job: TimeRangeSpec) -> Shape:
    return Shape(
        chunk=job.chunk_us,
        lookback=job.lookback_us,
        unbounded=bool(job.cumulative or job.rows),
        tumbling=job.tumbling_us,
    )


@dataclass(frozen=True)
class Keys:
    name: str

    @property
    def prefix(self) -> str:
        return f"riverbed/timerange/{self.name}/"

    @property
    def progress(self) -> str:
        return self.prefix + "progress"

    @property
    def error(self) -> str:
        return self.prefix + "error"

    @property
    def chunks(self) -> str:
        return self.prefix + "chunks/"

    def chunk(self, start: int) -> str:
        return self.chunks + chunk_label(start)

    @property
    def election(self) -> str:
        return f"timerange/{self.name}"


@dataclass(frozen=True)
class ChunkRecord:
    start: int
    end: int
    token: str
    rows: int
    windows: int
    seconds: float
    finished: float
    version: str
    carry: bool
    arrow_bytes: int = 0  # the chunk's rows in the driver's memory (Arrow): sizes the next batch

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> ChunkRecord:
        return ChunkRecord(**json.loads(text))


@dataclass
class Event:
    """What the driver reports as it goes (the CLI prints these)."""

    kind: str  # standby | leader | planned | chunk | done | nothing
    progress: Progress | None = None
    record: ChunkRecord | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Driver:
    def __init__(
        self,
        spec: LoadedSpec,
        cp: ControlPlane,
        spark: Callable[[], SparkSession],
        *,
        ttl: int = 10,
        batch: int | None = None,
        spill: bool | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.spec = spec
        self.job = spec.job
        self.cp = cp
        self._spark_factory = spark
        self._spark: SparkSession | None = None
        self.ttl = ttl
        self.batch = batch  # chunks per Spark query (None: chosen from the chunks' rows)
        # rows through a spill: always when the executors reach the output (True), never
        # (False), or when the heap would keep batches small (None)
        self.spill = spill
        self._bytes_per_chunk: float | None = None  # what a chunk's query returned
        self.keys = Keys(self.job.name)
        self.output = TimeRangeOutput(self.job.output)
        self._tables: dict[str, PartitionTable] | None = None
        self.on_event = on_event or (lambda event: None)
        self.identity = f"{host_name()}:{os.getpid()}"

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = self._spark_factory()
        return self._spark

    @property
    def tables(self) -> dict[str, PartitionTable]:
        """The lakehouse tables the job's datasets are published to, chunk by chunk
        (its spec's ``tables``; opened on first use)."""
        if self._tables is None:
            from riverbed.tables import partition_table

            self._tables = {
                d: partition_table(t, self.job.name) for d, t in self.job.tables.items()
            }
        return self._tables

    @property
    def _can_spill(self) -> bool:
        """Whether a batch's rows can come back through a spill (:mod:`.output`): the
        executors reach the output — a bucket, or a directory of this machine."""
        return not self.output.local or tasks_on_this_machine(self.spark.sparkContext.master or "")

    def _heap_chunks(self) -> int:
        """How many chunks' rows fit :data:`HEAP_SHARE` of the driver JVM's heap."""
        budget = driver_heap_bytes(self.spark) * HEAP_SHARE
        return max(1, int(budget // max(self._bytes_per_chunk or 1, 1)))

    def _spills(self, count: int) -> bool:
        """Whether a batch of ``count`` chunks comes back through a spill."""
        if self.spill is False or not self._can_spill:
            return False
        if self.spill:
            return True
        return self._bytes_per_chunk is not None and count > self._heap_chunks()

    def _fetch(self, name: str, df: DataFrame, spill: bool) -> pa.Table:
        """A batch's output ``name`` in Arrow: the rows through a spill when ``spill``,
        the small outputs (and rows without a spill) collected."""
        if name != "rows" or not spill:
            return df.toArrow()
        token = f"batch-{uuid.uuid4().hex[:12]}"
        from riverbed.spark import s3a

        s3a.configure_for(self.spark, self.output.location)
        gone = FencedError(
            f"driver {self.identity} lost the lead of time-range job '{self.job.name}': the "
            f"rows it computed were removed from {self.output.location} by the driver that "
            "took over (it forgets what no record names); it stops without publishing"
        )
        try:
            try:
                df.write.parquet(self.output.spill_location(token))
            except Exception:
                if not self.output.spilled(token):  # its folder went while Spark wrote
                    raise gone from None
                raise
            table = self.output.read_spill(token)
        finally:
            self.output.drop_spill(token)
        if table is None:
            raise gone
        if not table.num_columns:  # Spark wrote no file: no rows (and no schema)
            return df.toArrow()
        return _as_collected(self.spark, df, table)

    # -- the run ------------------------------------------------------------------
    def run(self, start: Any, end: Any, rerun: bool = False) -> Progress:
        """Compute ``[start, end)`` (resuming what is done); returns the final progress."""
        lo, hi = parse_time(start), parse_time(end)
        shape = shape_of(self.job)
        kv = self.cp.get(self.keys.progress)
        # Validate before waiting to lead: a bad request fails at once, not after a failover.
        plan_request(Progress.from_json(kv.value) if kv else None, shape, lo, hi, rerun)
        session = Session(self.cp, self.ttl)
        election = Election(self.cp, self.keys.election, session)
        try:
            current = election.leader()
            if current is not None:
                self.on_event(Event("standby", detail={"leader": current.value.decode()}))
            value = json.dumps({"driver": self.identity, "since": time.time()})
            term = election.campaign(value)
            fence = ControlFence(
                self.cp,
                self.keys.election,
                f"driver {self.identity} of time-range job '{self.job.name}'",
                FencedError,
            )
            fence.claim(term, self.identity)  # before reading the marker it builds on
            guard = fence.guard(term)
            self.on_event(Event("leader", detail={"term": term, "driver": self.identity}))
            try:
                done = self._lead(guard, session, shape, lo, hi, rerun)
            except FencedError:
                raise
            except Exception as exc:
                self._record_error(guard, exc)
                raise
            self.cp.txn(guard, [Delete.of(self.keys.error)])
            return done
        finally:
            try:
                election.resign()
            finally:
                session.close()

    def _lead(
        self,
        guard: list[Compare],
        session: Session,
        shape: Shape,
        lo: int,
        hi: int,
        rerun: bool,
    ) -> Progress:
        kv = self.cp.get(self.keys.progress)
        progress = Progress.from_json(kv.value) if kv else None
        revision = kv.mod_revision if kv else 0
        if progress is None and self.output.datasets():
            raise RangeError(
                f"{self.output.location} already holds chunks, but the control plane "
                f"({self.cp.url}) has no progress for time-range job '{self.job.name}': point "
                "RIVERBED_CONTROL at the control plane that computed them, or start over with "
                f"riverbed timerange reset {self.spec.path} --output"
            )
        if progress is not None and progress.pending_token and progress.pending_start is not None:
            pending = self.cp.get(self.keys.chunk(progress.pending_start))
            moved = self.output.publish(
                progress.pending_token,
                progress.pending_start,
                self.tables,
                pending.mod_revision if pending is not None else revision,
            )
            if moved:
                log.info("moved %d file(s) of the last published chunk into place", moved)
        self.output.forget(self._tokens(), progress.pending_token if progress else None)
        planned = plan_request(progress, shape, lo, hi, rerun)
        if planned != progress:
            revision = self._commit(guard, revision, planned, [])
        progress = planned
        self.on_event(Event("planned", progress=progress))
        if next_chunk(progress) is None:
            self.on_event(Event("nothing", progress=progress))
        while (start := next_chunk(progress)) is not None:
            if not session.alive:
                raise FencedError(
                    f"driver {self.identity} lost the lead of time-range job '{self.job.name}' "
                    "(its lease ended); it stops without publishing"
                )
            batch = self._compute(progress, start)
            for i, record in enumerate(batch):
                advanced = advance_progress(progress, record.start, record.token)
                try:
                    revision = self._commit(
                        guard,
                        revision,
                        advanced,
                        [Put.of(self.keys.chunk(record.start), record.to_json())],
                    )
                except FencedError:
                    for unpublished in batch[i:]:  # named by no record: nobody will use them
                        self.output.discard(unpublished.token)
                    raise
                self.output.publish(record.token, record.start, self.tables, revision)
                progress = advanced
                self.on_event(Event("chunk", progress=progress, record=record))
        self.on_event(Event("done", progress=progress))
        return progress

    def _record_error(self, guard: list[Compare], exc: BaseException) -> None:
        text = json.dumps(
            {
                "at": time.time(),
                "driver": self.identity,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
            }
        )
        try:
            self.cp.txn(guard, [Put.of(self.keys.error, text)])
        except Exception:  # the control plane may be what failed; the error still propagates
            log.warning("could not record the error of time-range job '%s'", self.job.name)

    def _commit(
        self, guard: list[Compare], revision: int, progress: Progress, ops: list[Put]
    ) -> int:
        result = self.cp.txn(
            [*guard, Compare.mod(self.keys.progress) == revision],
            [Put.of(self.keys.progress, progress.to_json()), *ops],
        )
        if not result.succeeded:
            raise FencedError(
                f"driver {self.identity} lost the lead of time-range job '{self.job.name}' "
                "(its lease ended or another driver advanced the marker); it stops without "
                "publishing"
            )
        return result.revision

    def _tokens(self) -> set[str]:
        return {
            ChunkRecord.from_json(kv.value).token for kv in self.cp.get_prefix(self.keys.chunks)
        }

    def _record_before(self, progress: Progress, start: int) -> ChunkRecord | None:
        """The record of the chunk before ``start`` (None at the origin)."""
        if start == progress.origin:
            return None
        kv = self.cp.get(self.keys.chunk(start - progress.chunk))
        if kv is None:
            raise FencedError(f"no record of the chunk before {format_time(start)}")
        return ChunkRecord.from_json(kv.value)

    def batch_size(self, progress: Progress, start: int) -> int:
        """How many chunks from ``start`` one Spark query computes.

        Chunks are still published one by one, each with its own marker (and its own
        carried state); batching spreads a query's fixed cost — and the lookback it
        re-reads — over several chunks. The driver holds what a batch's query returns, so
        a run's first query computes one chunk and the later ones as many as return
        :data:`HEAP_SHARE` of the driver's heap — or, when that is fewer than
        :data:`MIN_COLLECTED` and the rows can spill, :data:`SPILL_BYTES` of its memory —
        at the size of the chunks before (the last run's, on a resume), at most
        :data:`MAX_BATCH`.
        """
        if self.batch is not None:
            wanted = self.batch
        elif self._bytes_per_chunk is None:
            wanted = 1
        else:
            wanted = min(MAX_BATCH, self._heap_chunks())
            small = wanted < MIN_COLLECTED and self.spill is None
            if (self.spill or small) and self._can_spill:
                wanted = min(MAX_BATCH, max(1, int(SPILL_BYTES // self._bytes_per_chunk)))
        stop = progress.redo_to if progress.redo_from is not None else progress.target
        assert stop is not None
        return max(1, min(wanted, (stop - start) // progress.chunk))

    def _compute(self, progress: Progress, start: int) -> list[ChunkRecord]:
        spark = self.spark
        began = time.monotonic()
        before = self._record_before(progress, start)
        if self._bytes_per_chunk is None and before is not None and before.arrow_bytes:
            self._bytes_per_chunk = before.arrow_bytes  # a resume: the size of the last run's
        count = self.batch_size(progress, start)
        end = start + count * progress.chunk
        prior: dict[str, pa.Table | None] = {"cumulative": None, "tail": None}
        if before is not None and before.carry:
            prior = {name: self.output.carried(before.token, name) for name in prior}
        cumulative, tail = (
            None if t is None else spark.createDataFrame(t)
            for t in (prior["cumulative"], prior["tail"])
        )
        frames = compute_chunk(spark, self.job, progress.origin, start, end, cumulative, tail)
        try:
            records = self._stage(frames, progress, start, count, began, prior["cumulative"])
        except Exception as exc:
            message = raised_by_us(exc)
            if message is None:
                raise
            raise BadInputError(message) from None
        finally:
            frames.release()
        return records

    def _stage(
        self,
        frames: ChunkFrames,
        progress: Progress,
        first: int,
        count: int,
        began: float,
        prior: pa.Table | None,
    ) -> list[ChunkRecord]:
        wanted: dict[str, tuple[DataFrame, str]] = {}
        if frames.rows is not None:  # with carried state: the rows plus what carries need
            rows = frames.rows if frames.carrying is None else frames.carrying
            wanted["rows"] = (rows, self.job.time)
        for size, df in frames.windows.items():
            wanted[window_dataset(size)] = (df, "window_start")
        # The outputs of a batch are Spark jobs over one cached input: run them side by
        # side (Spark schedules concurrent jobs; much of a job's cost is latency, not work).
        spill = self._spills(count)
        if len(wanted) > 1:
            with ThreadPoolExecutor(len(wanted), thread_name_prefix="riverbed-chunk") as pool:
                arrows = pool.map(
                    lambda item: self._fetch(item[0], item[1][0], spill), wanted.items()
                )
                done = dict(zip(wanted, arrows, strict=True))
        else:
            done = {name: self._fetch(name, df, spill) for name, (df, _) in wanted.items()}
        self._bytes_per_chunk = sum(t.nbytes for t in done.values()) / count
        pieces = {
            name: _by_chunk(done[name], column, first, progress.chunk, count)
            for name, (_, column) in wanted.items()
            if not (name == "rows" and frames.carrying is not None)
        }
        after: list[dict[str, pa.Table]] = [{} for _ in range(count)]
        if frames.carrying is not None:
            chunk = progress.chunk
            bounds = [
                Boundary(s, s + chunk, self.job.read_from(progress.origin, s + chunk))
                for s in range(first, first + count * chunk, chunk)
            ]
            pieces["rows"] = chunk_rows(done["rows"], bounds)
            after = carries(
                done["rows"],
                bounds,
                self.job.keys,
                frames.columns,
                sorted({c.column for c in self.job.cumulative}),
                bool(self.job.tail_rows),
                prior,
            )
        seconds = round((time.monotonic() - began) / count, 3)

        def stage(i: int) -> ChunkRecord:
            start = first + i * progress.chunk
            token = f"{chunk_label(start)}-{uuid.uuid4().hex[:12]}"
            counts = {"rows": 0, "windows": 0}
            for name, tables in pieces.items():
                counts["rows" if name == "rows" else "windows"] += tables[i].num_rows
                self.output.stage(token, name, tables[i])
            for name, table in after[i].items():
                self.output.stage_carry(token, name, table)
            return ChunkRecord(
                start=start,
                end=start + progress.chunk,
                token=token,
                rows=counts["rows"],
                windows=counts["windows"],
                seconds=seconds,
                finished=time.time(),
                version=self.spec.version,
                carry=bool(after[i]),
                arrow_bytes=int(self._bytes_per_chunk or 0),
            )

        if count == 1:
            return [stage(0)]
        # Parquet encoding lets go of the GIL: stage the chunks side by side
        with ThreadPoolExecutor(2, thread_name_prefix="riverbed-stage") as pool:
            return list(pool.map(stage, range(count)))


def _as_collected(spark: SparkSession, df: DataFrame, table: pa.Table) -> pa.Table:
    """``table`` (read from Spark's Parquet) with the types ``df.toArrow()`` would have
    given: Spark writes a timestamp as INT96 (read back as naive nanoseconds), the
    output keeps UTC microseconds; Spark's own schema metadata stays behind."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, timezone="UTC", prefers_large_types=large)
    return table.select(schema.names).cast(schema).replace_schema_metadata(None)


def _by_chunk(table: pa.Table, column: str, first: int, chunk: int, count: int) -> list[pa.Table]:
    """A batch's Arrow table cut into its ``count`` chunks by ``column`` (a timestamp)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if count == 1:
        return [table]
    micros = pc.cast(table[column], pa.timestamp("us", tz="UTC")).cast(pa.int64())
    index = pc.divide(pc.subtract(micros, first), chunk)  # truncated: -1 for none before
    index = pc.if_else(pc.less(micros, first), -1, index)
    return [table.filter(pc.equal(index, i)) for i in range(count)]


def status(cp: ControlPlane, spec: LoadedSpec) -> dict[str, Any]:
    """What ``riverbed timerange status`` shows: progress, rows, throughput, ETA, errors."""
    keys = Keys(spec.job.name)
    kv = cp.get(keys.progress)
    progress = Progress.from_json(kv.value) if kv else None
    records = [ChunkRecord.from_json(r.value) for r in cp.get_prefix(keys.chunks)]
    leader = Election(cp, keys.election).leader()
    error = cp.get(keys.error)
    seconds = sum(r.seconds for r in records)
    rows = sum(r.rows for r in records)
    info: dict[str, Any] = {
        "job": spec.job.name,
        "spec": str(spec.path),
        "output": spec.job.output,
        "origin": format_time(progress.origin) if progress else None,
        "chunk": label(progress.chunk if progress else spec.job.chunk_us),
        "done_to": format_time(progress.done_to) if progress else None,
        "target": format_time(progress.target) if progress else None,
        "chunks_done": progress.done if progress else 0,
        "chunks_total": progress.total if progress else 0,
        "rerun": (
            [format_time(progress.redo_from), format_time(progress.redo_to)]
            if progress and progress.redo_from is not None and progress.redo_to is not None
            else None
        ),
        "rows": rows,
        "rows_per_second": round(rows / seconds, 1) if seconds else None,
        "seconds_per_chunk": round(seconds / len(records), 3) if records else None,
        "eta_seconds": None,
        "driver": json.loads(leader.value)["driver"] if leader else None,
        "last_chunk_at": max((r.finished for r in records), default=None),
        "last_error": json.loads(error.value) if error else None,
    }
    if progress and records:
        left = progress.total - progress.done
        info["eta_seconds"] = round(left * seconds / len(records), 1)
    return info


def reset(cp: ControlPlane, spec: LoadedSpec) -> int:
    """Forget a job's progress and records (its output folder is the caller's to remove)."""
    keys = Keys(spec.job.name)
    leader = Election(cp, keys.election).leader()
    if leader is not None:
        raise FencedError(
            f"time-range job '{spec.job.name}' has a running driver "
            f"({json.loads(leader.value)['driver']}); stop it before resetting"
        )
    return cp.delete(keys.prefix, prefix=True)
