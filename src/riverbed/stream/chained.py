"""An aggregation over another aggregation's final rows, in one driver:
``start(spark, spec, Chained(upstream, source), checkpoint=…)``.

Nexmark q5 ("hot items") counts bids per auction and window, then takes the largest
count per window. Through a results topic that is two drivers, the first writing its
rows as records the second reads back; here one loop (:class:`ChainedQuery`) runs the
upstream aggregation's batch over its topic, then the downstream's batch over the
upstream batches it has not read (:class:`riverbed.stream.chain.Downstream`: the seam
an aggregation over a join's rows uses too), the rows handed over in memory. The
upstream must emit each window once (``output="final"``): with ``update`` a window's
row comes again every batch that changes it, and would be counted again.

Each keeps its own checkpoint, state and result table: the upstream's inside the
downstream's checkpoint unless given (``<checkpoint>/upstream``, its result table
``<checkpoint>/upstream-results``: what a re-run batch reads again), its state in a
store of its own beside the downstream's (``<state>/<downstream>.upstream``), so the
same upstream spec run on its own elsewhere never shares state with it. One driver,
one fence: the downstream's checkpoint's term fences both. The upstream's source is
any the log-native path reads — a riverbed topic, a Kafka topic its tasks read, a
join's rows (``Joined``), another ``Chained`` — not a DataFrame.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from riverbed.locations import child, location
from riverbed.state import StateConfig
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.chain import Stages, aggregation_upstream, failpoint
from riverbed.stream.engine import EngineConfig
from riverbed.stream.errors import StreamValueError
from riverbed.stream.lognative import run_planned
from riverbed.stream.loop import DirectQuery
from riverbed.stream.nativeconfig import DirectConfig, check_reads
from riverbed.stream.pipeline import Pipeline
from riverbed.stream.plan import Trigger

CHECKPOINT, RESULTS = "upstream", "upstream-results"  # inside the downstream's checkpoint


def locations(checkpoint: str | Path, given_checkpoint: Any, given_output: Any) -> tuple[str, str]:
    """The upstream's checkpoint and result table: as given, else inside the
    downstream's checkpoint."""
    base = str(location(checkpoint)).rstrip("/")
    cp = location(given_checkpoint) if given_checkpoint is not None else f"{base}/{CHECKPOINT}"
    out = location(given_output) if given_output is not None else f"{base}/{RESULTS}"
    return str(cp), str(out)


def state_of(state: StateConfig, downstream: str) -> StateConfig:
    """The upstream's state: a store of its own beside the downstream's."""
    name = f"{downstream}.{CHECKPOINT}"
    return replace(
        state, local_dir=Path(state.local_dir) / name, durable=child(state.durable, name)
    )


@dataclass(frozen=True)
class Built:
    """The upstream's pipeline, built; :meth:`then` adds the downstream to it."""

    pipeline: Pipeline
    name: str

    @property
    def output_schema(self) -> pa.Schema:
        return self.pipeline.output_schema

    def then(self, config: EngineConfig) -> Pipeline:
        """The pipeline with the downstream aggregation (``config``) after it, its
        columns checked against the upstream's result rows."""
        check_reads(config, self.output_schema, f"the result rows of aggregation {self.name!r}")
        last = self.pipeline.last
        direct = DirectConfig(
            config, {"aggregation": self.name}, None, co_located=False,
            driver_records=last.driver_records,
        )  # fmt: skip
        return Pipeline(self.pipeline.head, (*self.pipeline.after, direct))


def upstream(
    chained: Any,
    spec: Aggregation,
    checkpoint: str | Path,
    state: StateConfig,
    build: Callable[[Aggregation, Any, str, str, StateConfig], Any],
) -> Built:
    """The upstream of ``spec`` checked and built (``build``: :func:`riverbed.stream.
    dataframe.start` up to the query, for the upstream's spec and source)."""
    up = chained.aggregation
    if not isinstance(up, Aggregation):
        raise StreamValueError(f"Chained takes an Aggregation, not {type(up).__name__}")
    if up.name == spec.name:
        raise StreamValueError(
            f"aggregation {spec.name!r} is chained after an aggregation of the same name; "
            "name them apart (each has its own state and result table)"
        )
    if up.output != "final":
        raise StreamValueError(
            f"aggregation {spec.name!r} reads the rows of {up.name!r}, whose output is "
            "'update' — a window's row comes again each batch that changes it and would "
            f'be counted again; set output="final" on {up.name!r}'
        )
    if up.sessions:
        raise StreamValueError(
            f"aggregation {spec.name!r}: chaining after session windows ({up.name!r}) is "
            "not supported — a merged session's row is taken back, which an aggregation "
            "over the rows cannot undo"
        )
    cp, out = locations(checkpoint, chained.checkpoint, chained.output)
    built = build(up, chained.source, cp, out, state_of(state, spec.name))
    if not isinstance(built, Pipeline):  # refused in dataframe._build; never reached
        raise StreamValueError(f"aggregation {up.name!r} cannot run in another's driver")
    return Built(built, up.name)


class ChainedQuery(DirectQuery):
    """A topic aggregation and the aggregations chained after it, run batch by batch
    on one driver thread (see the module doc); constructing it starts the loop. Its
    name, progress and errors are the last aggregation's; its progress has a line per
    batch of each chained aggregation."""

    def __init__(
        self,
        spark: Any,
        head: DirectConfig,
        after: Sequence[DirectConfig],
        trigger: Trigger,
    ) -> None:
        # before DirectQuery's constructor starts the loop; the stages only read the
        # head's batch log
        self.stages = Stages.after_head(
            spark, aggregation_upstream(head, open_batches(head.engine.checkpoint)), after,
            lambda entry: self._add_progress({"id": self.id, **entry}),
        )  # fmt: skip
        super().__init__(spark, head, trigger, name=after[-1].engine.spec.name)

    def _loop(self, topic_log: Any) -> None:
        target = self._target(topic_log)
        head = self.cfg.engine.spec.name

        def head_run(batch_id: int, record: BatchRecord, began: float) -> None:
            plan_ms = round((time.perf_counter() - began) * 1000)
            with self._watch.batch(batch_id):
                run_planned(
                    self.spark, self.cfg, self.batches, batch_id, record, plan_ms,
                    self._maintenance, emitted=lambda t: self.stages.hand(batch_id, t),
                )  # fmt: skip
            failpoint(f"chained:{head}:committed:{batch_id}")  # its rows not read yet

        self.stages.drive(self._triggered, lambda: self._next(topic_log, target), head_run)


__all__ = ["CHECKPOINT", "RESULTS", "Built", "ChainedQuery", "locations", "state_of", "upstream"]
