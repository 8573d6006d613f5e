"""Flink settings the Flink jobs of the benchmarks share (they run in Flink's own
virtualenv and import nothing of riverbed): parallelism 2 — the machine's cores — and,
for aggregations, what Flink's performance tuning guide gives for ``COUNT(DISTINCT)``
over skewed keys: mini-batch (5,000 rows / 1 s), two-phase aggregation, split
distinct aggregation."""

from __future__ import annotations

from typing import Any


def configure(conf: Any, state: str, tuned: bool) -> None:
    conf.set("parallelism.default", "2")
    conf.set("table.exec.resource.default-parallelism", "2")
    conf.set("state.backend.type", state)
    if tuned:
        conf.set("table.exec.mini-batch.enabled", "true")
        conf.set("table.exec.mini-batch.allow-latency", "1 s")
        conf.set("table.exec.mini-batch.size", "5000")
        conf.set("table.optimizer.agg-phase-strategy", "TWO_PHASE")
        conf.set("table.optimizer.distinct-agg.split.enabled", "true")
