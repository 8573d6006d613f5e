"""What the Flink jobs of the benchmarks share (they run in Flink's own virtualenv and
import nothing of riverbed): the settings — parallelism 2, the machine's cores, and, for
aggregations, what Flink's performance tuning guide gives for ``COUNT(DISTINCT)`` over
skewed keys: mini-batch (5,000 rows / 1 s), two-phase aggregation, split distinct
aggregation — and running a query into CSV files, timed (:func:`run_to_csv`)."""

from __future__ import annotations

import csv
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_to_csv(env: Any, sql: str, field: Callable[[str], Any]) -> tuple[float, list[list[Any]]]:
    """Run ``sql`` into CSV files inside Flink (a Python client collecting the rows takes
    ~1-2 ms a row through py4j: most of a job's time at 10,000 rows) and read them back:
    the job's seconds (submission to its end) and its rows, each field through ``field``."""
    from pyflink.table import Schema, TableDescriptor

    out_dir = tempfile.mkdtemp(prefix="flink-out-")
    table = env.sql_query(sql)
    env.create_temporary_table(
        "sink",
        TableDescriptor.for_connector("filesystem")
        .schema(
            Schema.new_builder().from_row_data_type(table.get_schema().to_row_data_type()).build()
        )
        .option("path", out_dir)
        .format("csv")
        .build(),
    )
    began = time.perf_counter()
    table.execute_insert("sink").wait()
    seconds = time.perf_counter() - began
    rows = []
    for path in sorted(Path(out_dir).rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            with open(path, newline="") as f:
                rows += [[field(v) for v in row] for row in csv.reader(f)]
    shutil.rmtree(out_dir, ignore_errors=True)
    return seconds, rows


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
