"""Aggregations over the rows of the stage before them, in that stage's driver.

A driver runs a **head** — a join over two topics (:mod:`riverbed.stream.joinedagg`)
or an aggregation over a topic (:class:`ChainedQuery`) — and after it a list of
aggregations (:class:`Downstream`), each over the rows of the one before: a join's
joined rows, or an aggregation's final rows (``output="final"``: each window once,
when the watermark closes it). Nexmark q5 is an aggregation over an aggregation's rows
(bids per auction and window, then the largest count per window); q4 is a join, an
aggregation over its rows, and one over those.

Every stage has its own batch log, state and watermark. One turn of the loop runs the
head's next batch, then each downstream's next batch over **the upstream batches it
has not read yet** — named in its record before it runs (``sources =
{"<source>": {"0": [first, end]}}``: upstream batch ids) — so a kill anywhere re-runs
the unfinished batch with the same input and exactly once holds for all of them. The
rows are handed over in memory; a re-run reads them from the upstream's output files
(``batch_id=<b>/``: a join's rows, an aggregation's result table), which stay until a
downstream has read them: a downstream's unfinished batch runs before the head plans
another, and compaction only folds an aggregation's batches before the one before its
newest.

A downstream's watermark never passes what its upstream may still emit
(:attr:`Upstream.bound`): an aggregation's batch after watermark *P* emits windows
ending after *P* (starting after *P* - size), a join's rows come with times its pairing
rule bounds. So a downstream never drops a row as late that its upstream emits in time.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.config import inherited
from riverbed.spark import tasks, tasks_in_this_process
from riverbed.state import openpool
from riverbed.state.provider import local_root
from riverbed.stream import lookups, shuffle
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batch import Maintenance
from riverbed.stream.batchlog import Batches, BatchRecord, next_record, open_batches
from riverbed.stream.engine import merge_partition, partials_of
from riverbed.stream.grouping import Partial
from riverbed.stream.layout import checkpoint_store
from riverbed.stream.lognative import Side, checked, merged_here, task_attempts
from riverbed.stream.lognative import run_planned as run_aggregation
from riverbed.stream.nativeconfig import DirectConfig
from riverbed.stream.results import batch_key, empty_rows, read_file
from riverbed.windows import Session

JOINED = "join"  # the source of an aggregation over a join's rows, in its records
UPSTREAM = "upstream"  # ... over another aggregation's final rows

Bound = Callable[[int], int]  # the upstream's watermark before a batch → the least value


def failpoint(fault: str) -> None:
    """``RIVERBED_FAULT=<fault>`` (tests): SIGKILL the driver here. The seams:
    ``joined:planned:<b>`` / ``chained:<aggregation>:planned:<b>`` right after an
    aggregation over a join's / another aggregation's rows planned its batch ``<b>``;
    ``joined:join:<b>`` / ``chained:<head>:committed:<b>`` right after the head's batch
    ``<b>`` committed, its rows not aggregated yet."""
    if (inherited("RIVERBED_FAULT") or "") == fault:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Upstream:
    """What an aggregation over another stage's rows reads of that stage."""

    label: str  # how errors and progress name it: "join 'q9'", "aggregation 'counts'"
    source: str  # the key of the reader's records' sources: JOINED or UPSTREAM
    batches: Batches  # its batch log: which of its batches are finished, their watermarks
    output: str  # where a finished batch's rows are (``batch_key(b)`` under it)
    # the reader's time column → how early that column can still be in the rows of its
    # batches after one with watermark P (None: not bounded)
    bound: Callable[[str], Bound | None]


def window_bound(spec: Aggregation, column: str) -> Bound | None:
    """How early an aggregation's final rows can still be in ``column``: a batch whose
    watermark passes *P* (its previous) emits the windows ending after *P* —
    ``window_end`` > P, ``window_start`` > P - size (:func:`riverbed.stream.engine.
    merge_partition`). None for any other column (a metric's value is not bounded)."""
    window = spec.window
    if isinstance(window, Session):
        return None
    size = window.size_ms
    if column == "window_end":
        return lambda p: p + 1
    if column == "window_start":
        return lambda p: p - size + 1
    return None


def aggregation_upstream(direct: DirectConfig, batches: Batches) -> Upstream:
    """An aggregation (``batches``: its batch log) as the upstream of the one chained
    after it: its final rows, in its result table."""
    spec = direct.engine.spec
    return Upstream(
        label=f"aggregation {spec.name!r}",
        source=UPSTREAM,
        batches=batches,
        output=direct.engine.output,
        bound=lambda column: window_bound(spec, column),
    )


def upstream_range(record: BatchRecord) -> tuple[str, int, int] | None:
    """Which upstream batches an aggregation batch reads — (its source, first, end) —
    or None for a batch of a topic."""
    for source in (JOINED, UPSTREAM):
        got = (record.sources or {}).get(source)
        if got is not None:
            first, end = got.get("0", [0, 0])
            return source, int(first), int(end)
    return None


def rows_batch(
    spark: Any,
    cfg: DirectConfig,
    batch_id: int,
    record: BatchRecord,
    tables: list[pa.Table],
) -> tuple[pd.DataFrame, Side]:
    """One aggregation batch over an upstream's rows (``tables``: its batches', in
    order): pre-aggregated here, merged into each state partition — in the driver's
    threads under a local master, else by a Spark job the partials are shuffled to.
    Returns the emitted rows and the side counts."""
    spec = cfg.engine.spec
    n = spec.state_partitions
    watermark, previous = record.watermark_ms, record.previous_watermark_ms
    side = Side()
    partials: list[Partial] = []
    reads = (
        t.append_column("_error", pa.nulls(t.num_rows, pa.string())) for t in tables if t.num_rows
    )
    for pdf, ts in checked(cfg, reads, watermark, side):
        partials += partials_of(spec, pdf, watermark, ts)
    pairs = shuffle.values(partials, n)
    tasks.describe(spark, f"riverbed {spec.name} batch {batch_id}")

    def merge(p: int, values: Iterator[bytes]) -> pd.DataFrame:
        given = shuffle.unpacked(values)
        return merge_partition(cfg.engine, p, batch_id, watermark, previous, given)

    # in the driver, where the rows are, unless the tasks run elsewhere (or
    # driverBatchRecords=0: every batch a Spark job)
    where = tasks.master(spark)
    if tasks_in_this_process(where) and cfg.driver_records > 0:
        frames = merged_here(pairs, n, merge, task_attempts(where))
    else:
        # the job's tasks, in other processes, open the partitions
        openpool.let_go(local_root(cfg.engine.state, cfg.engine.namespace))
        frames, _ = tasks.shuffle_job(spark, [pairs], [], list, n, merge)
    full = [f for f in frames if len(f)]
    if not full:
        return empty_rows(spec), side
    return pd.concat(full, ignore_index=True), side


class Downstream:
    """An aggregation over the finished batches of its :class:`Upstream`, run by the
    upstream's driver (see the module doc)."""

    def __init__(
        self,
        spark: Any,
        direct: DirectConfig,
        upstream: Upstream,
        progress: Callable[[dict[str, Any]], None],
    ) -> None:
        self.spark = spark
        self.direct = direct
        self.upstream = upstream
        self.batches = open_batches(direct.engine.checkpoint, direct.engine.fence)
        self.maintenance = Maintenance(direct.engine.spec.name)
        self.handed: dict[int, pa.Table] = {}  # upstream batches' rows, until read
        self.bound = upstream.bound(direct.engine.spec.time)
        self.next: Downstream | None = None  # the aggregation over this one's rows
        self._progress = progress

    @property
    def name(self) -> str:
        return self.direct.engine.spec.name

    def as_upstream(self) -> Upstream:
        """This aggregation as the upstream of another (its final rows)."""
        return aggregation_upstream(self.direct, self.batches)

    def hand(self, batch_id: int, table: pa.Table) -> None:
        """An upstream batch's rows, before it commits (read once it has)."""
        self.handed[batch_id] = table

    def unfinished(self) -> tuple[int, BatchRecord] | None:
        ids = self.batches.ids()
        newest = self.batches.get(ids[-1]) if ids else None
        return (ids[-1], newest) if newest is not None and not newest.done else None

    def _upstream_end(self) -> int:
        """One past the upstream's newest finished batch."""
        ids = self.upstream.batches.ids()
        if not ids:
            return 0
        newest = self.upstream.batches.get(ids[-1])
        return ids[-1] + 1 if newest is not None and newest.done else ids[-1]

    def plan(self) -> tuple[int, BatchRecord] | None:
        """A new batch over the upstream's finished batches not read yet (or a no-data
        batch when its newest batch moved its watermark), recorded durably; ``None``
        when there is neither."""
        engine = self.direct.engine
        ids = self.batches.ids()
        newest = self.batches.get(ids[-1]) if ids else None
        batch_id = ids[-1] + 1 if ids else 0
        read = upstream_range(newest) if newest is not None else None
        first = read[2] if read is not None else 0
        end = max(first, self._upstream_end())
        base = next_record(self.batches, batch_id, engine.spec.watermark_ms)
        if self.bound is not None:  # never past what the upstream may still emit
            before = self.upstream.batches.get(first - 1) if first else None
            held = self.bound(before.watermark_ms if before is not None else 0)
            own = base.max_event_ms - engine.spec.watermark_ms
            base.watermark_ms = max(base.previous_watermark_ms, min(own, held))
        moved = newest is not None and base.watermark_ms > newest.watermark_ms
        if end == first and not moved:
            return None
        record = replace(
            base,
            sources={self.upstream.source: {"0": [first, end]}},
            spec=base.spec or engine.shape,
            lookups=lookups.planned(engine, newest),
        )
        self.batches.put(batch_id, record)  # durable: the plan comes before any write
        joined = self.upstream.source == JOINED  # (the failpoint's older spelling)
        failpoint(
            f"joined:planned:{batch_id}" if joined else f"chained:{self.name}:planned:{batch_id}"
        )
        return batch_id, record

    def _rows(self, upstream_batch: int) -> pa.Table:
        """A finished upstream batch's rows: handed over in memory, else its file."""
        table = self.handed.pop(upstream_batch, None)
        if table is not None:
            return table
        key = batch_key(upstream_batch)
        data = checkpoint_store(self.upstream.output).get(key)
        return read_file(data, f"{self.upstream.label}'s rows {self.upstream.output}/{key}")

    def run(self, batch_id: int, record: BatchRecord, began: float) -> None:
        read = upstream_range(record)
        first, end = (read[1], read[2]) if read is not None else (0, 0)
        for old in [b for b in self.handed if b < first]:
            del self.handed[old]  # read by a batch before a restart: not needed

        def rows_of(cfg: DirectConfig) -> tuple[pd.DataFrame, Side]:
            tables = [self._rows(b) for b in range(first, end)]
            return rows_batch(self.spark, cfg, batch_id, record, tables)

        after = self.next
        done = run_aggregation(
            self.spark, self.direct, self.batches, batch_id, record,
            maintenance=self.maintenance, rows_of=rows_of,
            emitted=None if after is None else lambda table: after.hand(batch_id, table),
        )  # fmt: skip
        self._progress(
            {
                "name": self.name,
                "batchId": batch_id,
                "numInputRows": done.counted("input"),
                f"{self.upstream.source}Batches": [first, end],
                "watermarkMs": done.watermark_ms,
                "durationMs": {"triggerExecution": round((time.perf_counter() - began) * 1000)},
            }
        )


class Stages:
    """The aggregations a head's driver runs after it, in order (each over the rows of
    the one before; the first over the head's)."""

    def __init__(self, stages: Sequence[Downstream]) -> None:
        self.stages = list(stages)
        for before, after in zip(self.stages, self.stages[1:], strict=False):
            before.next = after

    @classmethod
    def after_head(
        cls,
        spark: Any,
        head: Upstream,
        directs: Sequence[DirectConfig],
        progress: Callable[[dict[str, Any]], None],
    ) -> Stages:
        """``directs`` in order: the first over ``head``'s rows, each next over the
        final rows of the one before."""
        stages, source = [], head
        for direct in directs:
            stage = Downstream(spark, direct, source, progress)
            stages.append(stage)
            source = stage.as_upstream()
        return cls(stages)

    def drive(
        self,
        triggered: Callable[[Any, Any], None],
        head_next: Callable[[], tuple[int, BatchRecord] | None],
        head_run: Callable[[int, BatchRecord, float], None],
    ) -> None:
        """The loop of a head and these stages under the query's trigger
        (``triggered(plan, run)``: :meth:`ThreadQuery._triggered`), their maintenance
        waited for at its end."""

        def run(index: int, batch_id: int, record: BatchRecord, began: float) -> None:
            self.run(index, batch_id, record, began, head_run)

        try:
            triggered(lambda: self.next(head_next), run)
        finally:
            self.wait()

    def hand(self, batch_id: int, table: pa.Table) -> None:
        """The head's batch's rows, for the first aggregation."""
        self.stages[0].hand(batch_id, table)

    def unfinished(self) -> tuple[int, int, BatchRecord] | None:
        """A stage's batch planned and not finished (a kill's): (stage, batch, record)."""
        for index, stage in enumerate(self.stages):
            got = stage.unfinished()
            if got is not None:
                return index, *got
        return None

    def planned(self) -> tuple[int, int, BatchRecord] | None:
        """The first stage with a batch to run now, planned: (stage, batch, record)."""
        for index, stage in enumerate(self.stages):
            got = stage.plan()
            if got is not None:
                return index, *got
        return None

    def next(
        self, head: Callable[[], tuple[int, BatchRecord] | None]
    ) -> tuple[int, int, BatchRecord] | None:
        """What the loop runs next: a stage's batch a kill left unfinished, else the
        head's next batch (``head()``: planned and recorded; stage -1), else the first
        stage with a batch to run now (a no-data batch: its watermark moved)."""
        unfinished = self.unfinished()
        if unfinished is not None:
            return unfinished
        planned = head()
        if planned is not None:
            return (-1, *planned)
        return self.planned()

    def run(
        self,
        index: int,
        batch_id: int,
        record: BatchRecord,
        began: float,
        head: Callable[[int, BatchRecord, float], None],
    ) -> None:
        """Run a planned batch of stage ``index`` (-1: the head's, by ``head``), then
        each later stage's over its rows."""
        if index < 0:
            head(batch_id, record, began)
        else:
            self.stages[index].run(batch_id, record, began)
        self.after(index, began)

    def after(self, index: int, began: float) -> None:
        """Each stage after ``index`` (-1: the head) plans and runs a batch over what
        the one before it finished."""
        for stage in self.stages[index + 1 :]:
            planned = stage.plan()
            if planned is not None:
                stage.run(*planned, began)

    def wait(self) -> None:
        for stage in self.stages:
            stage.maintenance.wait()


__all__ = [
    "JOINED",
    "UPSTREAM",
    "Downstream",
    "Stages",
    "Upstream",
    "aggregation_upstream",
    "failpoint",
    "rows_batch",
    "upstream_range",
    "window_bound",
]
