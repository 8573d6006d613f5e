"""The log-native path's trigger loop: riverbed plans and commits its own micro-batches.

A log-native aggregation needs nothing of Spark's streaming engine but a trigger and a
durable record of what each batch read: the events never pass through Spark (the state
tasks read the topic themselves, :mod:`riverbed.stream.lognative`). Running that through a
Structured Streaming query cost, per trigger, Spark's write-ahead offset log and commit
log (~80-110 ms here) and, once, ~1.3 s to start the Python streaming source's own
process on the driver. So the loop is riverbed's, on a thread of the driver:

1. **plan** batch *b*: the end offsets of the newest finished batch are where *b*
   starts; where it ends comes from the topic's offsets and ``maxRecordsPerBatch``
   (:mod:`riverbed.stream.plan`); *b*'s record — its slices, watermark and
   co-location — is written and fsynced *before* anything of *b* is (the write-ahead);
2. **run** it (:func:`riverbed.stream.lognative.run_planned`): state version *b*, side
   topics, result table, sinks, then the record marked done (the commit).

After a crash the newest record is either done (plan *b + 1*) or not (run *b* again from
its recorded slices and watermark: the same state version, the same output replaced).
Records of the Spark-driven loop (no ``slices``) are read through Spark's offset log
once, so a checkpoint written before carries on.

:class:`DirectQuery` has the part of Spark's ``StreamingQuery`` that riverbed and its
users call: ``isActive``, ``awaitTermination``, ``stop``, ``exception``,
``processAllAvailable``, ``recentProgress`` / ``lastProgress``, ``name``, ``id``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from riverbed.log.base import TopicConfig
from riverbed.spark.offsets import batch_ends, begin_offsets, capped
from riverbed.state.errors import CorruptStateError
from riverbed.stream import lookups
from riverbed.stream.batch import Maintenance
from riverbed.stream.batchlog import BatchRecord, next_record, open_batches
from riverbed.stream.layout import Checkpoint
from riverbed.stream.lognative import run_planned
from riverbed.stream.nativeconfig import DirectConfig
from riverbed.stream.plan import (
    Trigger,
    co_located,
    ends_of,
    has_input,
    slices_json,
    within_placement,
)
from riverbed.stream.slowbatch import SlowBatchWatch
from riverbed.stream.sparklog import spark_ends, spark_slices
from riverbed.stream.threadquery import ThreadQuery

log = logging.getLogger(__name__)


class DirectQuery(ThreadQuery):
    """One log-native aggregation running on a driver thread (see the module doc);
    constructing it starts the loop and returns at once, like ``writeStream.start()``."""

    kind = "aggregation"

    def __init__(
        self, spark: Any, cfg: DirectConfig, trigger: Trigger, name: str | None = None
    ) -> None:
        """``name``: the query's, when not the aggregation's (a chain's last one)."""
        name = name or cfg.engine.spec.name
        super().__init__(spark, name, f"riverbed-{name}", trigger)
        self.cfg = cfg
        self.batches = open_batches(cfg.engine.checkpoint, cfg.engine.fence)
        self._maintenance = Maintenance(cfg.engine.spec.name)
        self._watch = SlowBatchWatch(spark, self.name, self._group)
        self._start()

    # -- the loop ---------------------------------------------------------------------

    def _body(self) -> None:
        from riverbed.spark.source import open_log

        topic_log = open_log(self.cfg.options)
        try:
            self._loop(topic_log)
        finally:
            self._watch.close()
            self._maintenance.wait()
            topic_log.close()

    def _retained(self, topic_log: Any) -> dict[int, tuple[int, int]]:
        """(first retained, end) offset of every partition of the topic."""
        return {o.partition: (o.start, o.end) for o in topic_log.offsets(self.cfg.options["topic"])}

    def _target(self, topic_log: Any) -> dict[int, int] | None:
        """Where ``availableNow`` ends: what the topic holds now, and no more."""
        if not self.trigger.available_now:
            return None
        return {p: end for p, (_, end) in self._retained(topic_log).items()}

    def _loop(self, topic_log: Any) -> None:
        target = self._target(topic_log)

        def run(batch_id: int, record: BatchRecord, began: float) -> None:
            plan_ms = round((time.perf_counter() - began) * 1000)
            with self._watch.batch(batch_id):
                done = run_planned(
                    self.spark, self.cfg, self.batches, batch_id, record, plan_ms, self._maintenance
                )
            self._report(batch_id, done, began, plan_ms)

        self._triggered(lambda: self._next(topic_log, target), run)

    def _next(
        self, topic_log: Any, target: dict[int, int] | None
    ) -> tuple[int, BatchRecord] | None:
        """The batch to run: the newest one again if it did not finish, else a new one
        planned and recorded durably; ``None`` when there is no input."""
        spec = self.cfg.engine.spec
        ids = self.batches.ids()
        newest = self.batches.get(ids[-1]) if ids else None
        previous_ends: dict[int, int] | None = None
        if newest is not None and not newest.done:
            if newest.slices is not None:
                return ids[-1], newest  # re-run exactly what was planned
            legacy = spark_slices(self.cfg.engine.checkpoint, ids[-1])
            if legacy is not None:
                newest.slices = legacy
                if newest.co_located is None:
                    newest.co_located = self._co_located(self._placement(topic_log), legacy)
                self.batches.put(ids[-1], newest)
                return ids[-1], newest
            # a first batch the Spark-driven loop never planned: plan it below, with
            # the watermark it recorded
            batch_id, base = ids[-1], newest
            before = self.batches.previous(batch_id)
            if before is not None:
                previous_ends = self._ends(batch_id - 1, before)
        else:
            batch_id = ids[-1] + 1 if ids else 0
            base = next_record(self.batches, batch_id, spec.watermark_ms)
            if newest is not None:
                previous_ends = self._ends(ids[-1], newest)
        retained = self._retained(topic_log)
        begin = begin_offsets(retained, previous_ends, self.cfg.starting)
        latest = capped(retained, target)
        placement = self._placement(topic_log)
        if placement is not None:  # a batch in one placement of an altered topic
            latest = within_placement(placement, begin, latest)
        slices = slices_json(begin, batch_ends(begin, latest, self.cfg.max_records))
        # the first batch after a backfill runs even with nothing new: it writes the
        # result rows the backfill rewrote (backfill.py); so does the first batch whose
        # watermark the newest one's events moved — a no-data batch, as Spark's engine
        # runs one: it closes the windows that watermark passes (a final window is
        # written, a closed one dropped from state) without waiting for more input
        due = self.cfg.engine.backfill_rows
        moved = newest is not None and newest.done and base.watermark_ms > newest.watermark_ms
        if not has_input(slices) and not moved and (due is None or due[0] != batch_id):
            return None
        record = replace(
            base,
            slices=slices,
            co_located=self._co_located(placement, slices),
            spec=base.spec or self.cfg.engine.shape,  # the shape it runs (changes.py)
            # which version of each lookup table it joins with (lookups.py)
            lookups=lookups.planned(
                self.cfg.engine,
                newest if newest is None or newest.done else self.batches.previous(batch_id),
            ),
        )
        self.batches.put(batch_id, record)  # durable: the plan comes before any write
        return batch_id, record

    def _placement(self, topic_log: Any) -> TopicConfig | None:
        """The topic's configuration (its placement epochs) when batches may be
        co-located; None when they never are (it is not read then)."""
        return topic_log.topic(self.cfg.options["topic"]) if self.cfg.co_located else None

    def _co_located(self, placement: TopicConfig | None, slices: dict[str, list[int]]) -> bool:
        if placement is None:
            return False
        return co_located(placement, slices, self.cfg.engine.spec.state_partitions)

    def _ends(self, batch_id: int, record: BatchRecord) -> dict[int, int]:
        """Where a finished batch ended in every partition: its plan, or for a batch of
        the Spark-driven loop, Spark's offset log."""
        if record.slices is not None:
            return ends_of(record.slices)
        ends = spark_ends(self.cfg.engine.checkpoint, batch_id)
        if ends is None:
            path = Checkpoint.of(self.cfg.engine.checkpoint).spark_offsets / str(batch_id)
            raise CorruptStateError(
                f"batch {batch_id} of '{self.name}' does not record which offsets it read, "
                f"and Spark's offset log ({path}) cannot tell either: restore the "
                "checkpoint from a backup or start on a new one (docs/stream.md, "
                "'Failure model')"
            )
        return ends

    def _report(self, batch_id: int, record: BatchRecord, began: float, plan_ms: int) -> None:
        ms = record.ms
        elapsed = time.perf_counter() - began
        total = round(elapsed * 1000)
        started = datetime.fromtimestamp(time.time() - elapsed, UTC)
        self._add_progress(
            {
                "id": self.id,
                "name": self.name,
                "batchId": batch_id,
                # when the trigger began, as Spark writes it (its end: + triggerExecution)
                "timestamp": started.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "numInputRows": record.counted("input"),
                # Spark's names where the phase matches: planning is latestOffset; the
                # plan's fsync is the write-ahead; the batch itself (commit included)
                "durationMs": {
                    "latestOffset": plan_ms,
                    "addBatch": int(ms.get("state_job", 0)) + int(ms.get("outputs", 0)),
                    "triggerExecution": total,
                },
            }
        )


__all__ = ["DirectQuery"]
