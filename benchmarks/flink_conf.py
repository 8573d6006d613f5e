"""What the Flink jobs of the benchmarks share (they run in Flink's own virtualenv and
import nothing of riverbed): the settings — parallelism 2, the machine's cores, and, for
aggregations, what Flink's performance tuning guide gives for ``COUNT(DISTINCT)`` over
skewed keys: mini-batch (5,000 rows / 1 s), two-phase aggregation, split distinct
aggregation — and running a query into CSV files, timed (:func:`run_to_csv`); the
digest of a query's rows that the benchmarks compare with DuckDB's and riverbed's when
the rows are too many to hand back (:func:`digest`)."""

from __future__ import annotations

import csv
import numbers
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def same_value(v: Any) -> Any:
    """A value as every system's rows compare: NULL and ``""`` alike (Flink's CSV does not
    tell them apart), text that is a number as the number, a number as an int when it is
    whole (else rounded to 6 places), a time as epoch ms."""
    if v is None or v == "":
        return None
    if isinstance(v, str):
        for kind in (int, float):
            try:
                return same_value(kind(v))
            except ValueError:
                pass
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if hasattr(v, "timestamp"):
        return round(v.timestamp() * 1000)
    number = float(v)
    if number != number:  # NaN: pandas' NULL
        return None
    return int(number) if number.is_integer() else round(number, 6)


def digest(rows: Iterable[Iterable[Any]]) -> tuple[int, int]:
    """(rows, a sum of their CRC-32s mod 2^64): the same for the same rows in any order."""
    count = total = 0
    for row in rows:
        count += 1
        total += zlib.crc32(repr(tuple(same_value(v) for v in row)).encode())
    return count, total % 2**64


def run_to_csv(
    env: Any, sql: str, field: Callable[[str], Any], fold: Callable[[list[Any]], None] | None = None
) -> tuple[float, list[list[Any]]]:
    """Run ``sql`` into CSV files inside Flink (a Python client collecting the rows takes
    ~1-2 ms a row through py4j: most of a job's time at 10,000 rows) and read them back:
    the job's seconds (submission to its end) and its rows, each field through ``field``
    (``fold``: each row given to it instead of kept)."""
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
                for row in csv.reader(f):
                    if fold is None:
                        rows.append([field(v) for v in row])
                    else:
                        fold([field(v) for v in row])
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
