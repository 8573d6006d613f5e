"""An aggregation over a join's rows, in the join's own driver: ``start(spark, spec,
Joined(join), checkpoint=…)``.

Without it, a join writes its rows to a topic and an aggregation reads them back in a
driver of its own (Nexmark q9: the winning bid of each auction; q4: their average per
category). Here one loop (:class:`JoinedQuery`) runs both, batch by batch:

1. the join's next batch, planned over both sides' topics and committed as
   :mod:`riverbed.stream.streamjoin` does on its own — its rows written to its output
   (``batch_id=<id>/``, kept: a re-run batch writes the same rows);
2. then the aggregation's next batch, planned over *the join's finished batches it has
   not read yet* (its record's ``sources = {"join": {"0": [first, end]}}``: join batch
   ids), recorded before it runs and committed as a log-native batch is
   (:func:`riverbed.stream.lognative.run_planned`): the rows pre-aggregated in the
   driver (they are there already), their partials merged into the aggregation's state
   partitions (by threads of the driver under a local master, else by a Spark job).

Each has its own batch log, state and watermark: a join batch is never read by the
aggregation before it is committed, and the aggregation's plan names exactly which join
batches a batch reads, so a kill anywhere re-runs the unfinished one of the two with
the same input — the join's from its topics, the aggregation's from the join's
output files (on the normal path the rows are handed over in memory) — and exactly
once holds for both. When the input stops, each runs its own no-data batch once the
newest events moved its watermark (the aggregation's after the join's last rows).

The join's checkpoint and rows live inside the aggregation's checkpoint unless given
(``<checkpoint>/join``, ``<checkpoint>/join-rows``); the state of both goes to the
aggregation's state store, each under its own name (so the two names must differ).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.config import inherited
from riverbed.locations import location
from riverbed.spark import tasks, tasks_in_this_process
from riverbed.state import StateConfig, openpool
from riverbed.stream import lookups
from riverbed.stream.batch import Maintenance
from riverbed.stream.batchlog import BatchRecord, next_record, open_batches
from riverbed.stream.engine import Partial, merge_partition, partials_of
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import JoinQuery, open_join
from riverbed.stream.joins import Join
from riverbed.stream.layout import checkpoint_store
from riverbed.stream.lognative import Side, checked, merged_here, owned, task_attempts
from riverbed.stream.lognative import run_planned as run_aggregation
from riverbed.stream.nativeconfig import DirectConfig
from riverbed.stream.plan import Trigger
from riverbed.stream.results import batch_key, empty_rows, read_file
from riverbed.stream.streamjoin import PREFIX, SIDES, WINDOW_START, JoinConfig
from riverbed.stream.streamjoin import run_planned as run_join
from riverbed.stream.threadquery import ThreadQuery

log = logging.getLogger(__name__)

JOINED = "join"  # the aggregation's one source in its batch records' ``sources``


def failpoint(at: str, batch_id: int) -> None:
    """``RIVERBED_FAULT=joined:<at>:<batch>`` (tests): SIGKILL the driver at a seam of
    the loop — ``join``: right after the join's batch ``<batch>`` commits, its rows not
    aggregated yet; ``planned``: right after the aggregation's batch ``<batch>`` is
    planned, before it reads them."""
    if (inherited("RIVERBED_FAULT") or "") == f"joined:{at}:{batch_id}":
        os.kill(os.getpid(), signal.SIGKILL)


def locations(checkpoint: str | Path, given_checkpoint: Any, given_output: Any) -> tuple[str, str]:
    """The join's checkpoint and output: as given, else inside the aggregation's."""
    base = str(location(checkpoint)).rstrip("/")
    join_cp = location(given_checkpoint) if given_checkpoint is not None else f"{base}/join"
    rows = location(given_output) if given_output is not None else f"{base}/join-rows"
    return str(join_cp), str(rows)


def open_joined(
    join: Join,
    spec_name: str,
    checkpoint: str | Path,
    state: StateConfig,
    log_url: str | None,
    term: int | None,
    join_checkpoint: Any = None,
    join_output: Any = None,
    max_records: int | None = None,
) -> JoinConfig:
    """The join an aggregation reads the rows of, checked against its sides and its
    checkpoint (:func:`riverbed.stream.joinquery.open_join`)."""
    if not isinstance(join, Join):
        raise StreamValueError(f"Joined takes a Join, not {type(join).__name__}")
    if join.frames:
        raise StreamValueError(
            f"join {join.name}: an aggregation over a join's rows reads topics (riverbed "
            "or Kafka) on both sides, not DataFrames; aggregate the DataFrames' join "
            "with Spark, or write its rows to a topic (Join(topic=…)) and aggregate that"
        )
    if join.topic is not None:
        raise StreamValueError(
            f"join {join.name}: topic={join.topic!r} writes its rows to a topic for "
            "another driver; an aggregation in the same driver reads them directly — "
            "leave topic out"
        )
    where, rows = locations(checkpoint, join_checkpoint, join_output)
    # its state apart from the same join run on its own (`stream run join.py`)
    cfg = open_join(
        join, checkpoint=where, output=rows, state=state, log_url=log_url, term=term,
        state_name=state_name(spec_name, join.name),
        fenced_by=str(location(checkpoint)),  # one driver, one fence: the aggregation's
    )  # fmt: skip
    if max_records is not None:
        cfg = replace(cfg, max_records=max_records)
    return cfg


def state_name(aggregation: str, join: str) -> str:
    """The state's name of the join an aggregation runs (one owner of the spelling)."""
    return f"{aggregation}.join.{join}"


def rows_batch(
    spark: Any,
    cfg: DirectConfig,
    batch_id: int,
    record: BatchRecord,
    tables: list[pa.Table],
) -> tuple[pd.DataFrame, Side]:
    """One aggregation batch over a join's rows (``tables``: its batches' output, in
    order): pre-aggregated here, merged into each state partition — in the driver's
    threads under a local master, else by a Spark job the partials are shuffled to.
    Returns the emitted rows and the side counts."""
    spec = cfg.engine.spec
    n = spec.state_partitions
    watermark, previous = record.watermark_ms, record.previous_watermark_ms
    side = Side()
    pairs: list[tuple[int, Partial]] = []
    reads = (
        t.append_column("_error", pa.nulls(t.num_rows, pa.string())) for t in tables if t.num_rows
    )
    for pdf, ts in checked(cfg, reads, watermark, side):
        pairs += owned(partials_of(spec, pdf, watermark, ts), n)
    tasks.describe(spark, f"riverbed {spec.name} batch {batch_id}")

    def merge(p: int, values: Iterator[Partial]) -> pd.DataFrame:
        return merge_partition(cfg.engine, p, batch_id, watermark, previous, values)

    # in the driver, where the rows are, unless the tasks run elsewhere (or the join's
    # sides say driverBatchRecords=0: every batch a Spark job)
    where = tasks.master(spark)
    if tasks_in_this_process(where) and cfg.driver_records > 0:
        frames = merged_here(pairs, n, merge, task_attempts(where))
    else:
        openpool.let_go()  # the job's tasks, in other processes, open the partitions
        frames, _ = tasks.shuffle_job(spark, [pairs], [], list, n, merge)
    full = [f for f in frames if len(f)]
    if not full:
        return empty_rows(spec), side
    return pd.concat(full, ignore_index=True), side


def rows_bound(cfg: JoinConfig, column: str) -> Callable[[int], int] | None:
    """How early a join's rows can still be in ``column``: given the watermark of the
    join batch before a batch, the least value of ``column`` that batch or any later
    one emits (:meth:`~riverbed.stream.pairing.Rule.earliest`). None when the join does
    not hold rows back (a lookup join's rows are its events, in their order) or
    ``column`` is none of its times."""
    if cfg.join.lookup is not None:
        return None
    left, right = cfg.sides
    internal = {name: inner for inner, name in cfg.names}.get(column)
    rule = cfg.rule
    if internal == PREFIX["left"] + left.time or internal == WINDOW_START:
        return lambda p: rule.earliest("left", p)
    if internal == PREFIX["right"] + right.time:
        return lambda p: rule.earliest("right", p)
    return None


def join_range(record: BatchRecord) -> tuple[int, int]:
    """The join batches an aggregation batch reads: [first, end)."""
    first, end = (record.sources or {}).get(JOINED, {}).get("0", [0, 0])
    return int(first), int(end)


class JoinedQuery(JoinQuery):
    """A join and an aggregation over its rows, run batch by batch on one driver
    thread (see the module doc); constructing it starts the loop. Its name, progress
    and errors are the aggregation's."""

    kind = "aggregation"

    def __init__(
        self, spark: Any, join_cfg: JoinConfig, direct: DirectConfig, trigger: Trigger
    ) -> None:
        name = direct.engine.spec.name
        ThreadQuery.__init__(self, spark, name, f"riverbed-{name}", trigger)
        self.cfg = join_cfg
        self.streams = SIDES[: len(join_cfg.join.sides)]
        self.batches = open_batches(join_cfg.checkpoint, join_cfg.fence)
        self.direct = direct
        self.aggregated = open_batches(direct.engine.checkpoint, direct.engine.fence)
        self._maintenance = Maintenance(name)
        self._handed: dict[int, pa.Table] = {}  # join batches' rows, in memory until read
        self._bound = rows_bound(join_cfg, direct.engine.spec.time)
        self._start()

    def _loop(self, logs: dict[str, Any]) -> None:
        target = self._target(logs)

        def plan() -> tuple[str, int, BatchRecord] | None:
            unfinished = self._unfinished()
            if unfinished is not None:
                return ("aggregation", *unfinished)
            joined = self._next(logs, target)
            if joined is not None:
                return ("join", *joined)
            planned = self._aggregation_next()
            return None if planned is None else ("aggregation", *planned)

        def run(kind: str, batch_id: int, record: BatchRecord, began: float) -> None:
            if kind == "join":
                run_join(
                    self.spark, self.cfg, self.batches, batch_id, record,
                    self._tasks_of(batch_id, record),
                    emitted=lambda table: self._handed.__setitem__(batch_id, table),
                )  # fmt: skip
                failpoint("join", batch_id)
                planned = self._aggregation_next()  # its rows aggregated at once
                if planned is None:
                    return
                batch_id, record = planned
            self._aggregate(batch_id, record, began)

        try:
            self._triggered(plan, run)
        finally:
            self._maintenance.wait()

    def _unfinished(self) -> tuple[int, BatchRecord] | None:
        ids = self.aggregated.ids()
        newest = self.aggregated.get(ids[-1]) if ids else None
        return (ids[-1], newest) if newest is not None and not newest.done else None

    def _joined_end(self) -> int:
        """One past the join's newest finished batch."""
        ids = self.batches.ids()
        if not ids:
            return 0
        newest = self.batches.get(ids[-1])
        return ids[-1] + 1 if newest is not None and newest.done else ids[-1]

    def _aggregation_next(self) -> tuple[int, BatchRecord] | None:
        """A new aggregation batch over the join's finished batches not read yet (or a
        no-data batch when its newest batch moved its watermark), recorded durably;
        ``None`` when there is neither."""
        engine = self.direct.engine
        ids = self.aggregated.ids()
        newest = self.aggregated.get(ids[-1]) if ids else None
        batch_id = ids[-1] + 1 if ids else 0
        first = join_range(newest)[1] if newest is not None else 0
        end = max(first, self._joined_end())
        base = next_record(self.aggregated, batch_id, engine.spec.watermark_ms)
        if self._bound is not None:  # never past what the join may still emit
            before = self.batches.get(first - 1) if first else None
            held = self._bound(before.watermark_ms if before is not None else 0)
            own = base.max_event_ms - engine.spec.watermark_ms
            base.watermark_ms = max(base.previous_watermark_ms, min(own, held))
        moved = newest is not None and base.watermark_ms > newest.watermark_ms
        if end == first and not moved:
            return None
        record = replace(
            base,
            sources={JOINED: {"0": [first, end]}},
            spec=base.spec or engine.shape,
            lookups=lookups.planned(engine, newest),
        )
        self.aggregated.put(batch_id, record)  # durable: the plan comes before any write
        failpoint("planned", batch_id)
        return batch_id, record

    def _rows(self, join_batch: int) -> pa.Table:
        """A finished join batch's rows: handed over in memory, else its output file."""
        table = self._handed.pop(join_batch, None)
        if table is not None:
            return table
        key = batch_key(join_batch)
        data = checkpoint_store(self.cfg.output).get(key)
        return read_file(data, f"join {self.cfg.join.name}'s rows {self.cfg.output}/{key}")

    def _aggregate(self, batch_id: int, record: BatchRecord, began: float) -> None:
        first, end = join_range(record)
        for old in [b for b in self._handed if b < first]:
            del self._handed[old]  # read by a batch before a restart: not needed

        def rows_of(cfg: DirectConfig) -> tuple[pd.DataFrame, Side]:
            tables = [self._rows(b) for b in range(first, end)]
            return rows_batch(self.spark, cfg, batch_id, record, tables)

        done = run_aggregation(
            self.spark, self.direct, self.aggregated, batch_id, record,
            maintenance=self._maintenance, rows_of=rows_of,
        )  # fmt: skip
        self._add_progress(
            {
                "id": self.id,
                "name": self.name,
                "batchId": batch_id,
                "numInputRows": done.counted("input"),
                "joinBatches": [first, end],
                "watermarkMs": done.watermark_ms,
                "durationMs": {"triggerExecution": round((time.perf_counter() - began) * 1000)},
            }
        )


__all__ = [
    "JOINED",
    "JoinedQuery",
    "join_range",
    "open_joined",
    "rows_batch",
    "rows_bound",
    "state_name",
]
