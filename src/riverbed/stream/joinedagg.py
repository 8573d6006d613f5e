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

The aggregation is a :class:`riverbed.stream.chain.Downstream` of the join (the loop
both kinds of head share); more aggregations can follow it, each over the final rows of
the one before (Nexmark q4: each auction's closing price, then their average per
category — ``Chained(q4_max, Joined(join))``).

The join's checkpoint and rows live inside the aggregation's checkpoint unless given
(``<checkpoint>/join``, ``<checkpoint>/join-rows``); the state of both goes to the
aggregation's state store, each under its own name (so the two names must differ).

Failpoints (tests): ``RIVERBED_FAULT=joined:join:<b>`` SIGKILLs the driver right after
the join's batch ``<b>`` commits, its rows not aggregated yet;
``joined:planned:<b>`` right after the aggregation's batch ``<b>`` is planned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from riverbed.locations import location
from riverbed.state import StateConfig
from riverbed.stream.batchlog import Batches, BatchRecord, open_batches
from riverbed.stream.chain import JOINED, Stages, Upstream, failpoint
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import JoinQuery, open_join
from riverbed.stream.joins import Join
from riverbed.stream.nativeconfig import DirectConfig
from riverbed.stream.plan import Trigger
from riverbed.stream.streamjoin import PREFIX, WINDOW_START, JoinConfig
from riverbed.stream.streamjoin import run_planned as run_join

log = logging.getLogger(__name__)


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
    fenced_by: str | None = None,
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
        # one driver, one fence: the aggregation's (or the one it is chained before)
        fenced_by=fenced_by or str(location(checkpoint)),
    )  # fmt: skip
    if max_records is not None:
        cfg = replace(cfg, max_records=max_records)
    return cfg


def state_name(aggregation: str, join: str) -> str:
    """The state's name of the join an aggregation runs (one owner of the spelling)."""
    return f"{aggregation}.join.{join}"


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


def as_upstream(cfg: JoinConfig, batches: Batches) -> Upstream:
    """A join as the upstream of the aggregation over its rows (:mod:`riverbed.stream.chain`)."""
    return Upstream(
        label=f"join {cfg.join.name!r}",
        source=JOINED,
        batches=batches,
        output=cfg.output,
        bound=lambda column: rows_bound(cfg, column),
    )


class JoinedQuery(JoinQuery):
    """A join and the aggregations over its rows (the first over the join's, each
    next over the one before's final rows), run batch by batch on one driver thread
    (see the module doc); constructing it starts the loop. Its name, progress and
    errors are the last aggregation's."""

    kind = "aggregation"

    def __init__(
        self,
        spark: Any,
        join_cfg: JoinConfig,
        directs: Sequence[DirectConfig],
        trigger: Trigger,
    ) -> None:
        # before JoinQuery's constructor starts the loop; the stages only read the
        # join's batch log
        self.stages = Stages.after_head(
            spark, as_upstream(join_cfg, open_batches(join_cfg.checkpoint)), directs,
            lambda entry: self._add_progress({"id": self.id, **entry}),
        )  # fmt: skip
        super().__init__(spark, join_cfg, trigger, name=directs[-1].engine.spec.name)

    def _loop(self, logs: dict[str, Any]) -> None:
        target = self._target(logs)

        def head_run(batch_id: int, record: BatchRecord, began: float) -> None:
            run_join(
                self.spark, self.cfg, self.batches, batch_id, record,
                self._tasks_of(batch_id, record),
                emitted=lambda table: self.stages.hand(batch_id, table),
            )  # fmt: skip
            failpoint(f"joined:join:{batch_id}")  # its rows not aggregated yet

        self.stages.drive(self._triggered, lambda: self._next(logs, target), head_run)


__all__ = [
    "JoinedQuery",
    "as_upstream",
    "open_joined",
    "rows_bound",
    "state_name",
]
