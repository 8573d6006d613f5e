"""What chunk-shaped output costs Spark: the carried time-range job's one pass, written
plainly against the ways Spark could write each chunk's folder itself.

    .venv/bin/python benchmarks/timerange_layouts.py [--rounds 3] [--driver-memory 4g]
        [--concurrent-writers] [--only NAME-PART] [--conf spark.k=v ...]

The data and the query are ``benchmarks/timerange.py``'s carried job (a running sum and
mean per sensor since the start, a mean over the last 5 readings; 24 h x 1,000 sensors
≈ 10M readings). Each round, in one session:

1. **plain** (the baseline): the one pass, ``df.write.parquet`` — what the chunked run
   is compared with;
2. **partitionBy(chunk)**: the same rows written one folder per hourly chunk (Spark
   sorts each task's rows by chunk first);
3. **by (chunk, key)**: windows partitioned by (chunk, sensor), so their own sort
   orders rows by chunk and the writer needs no second one; running values completed
   by a per-(sensor, chunk) offset from a small aggregate joined back. Spark's side
   only: a real job would also need each chunk's edge rows for the row window, the
   carries, and publication;
4. **chunk files from Python**: the baseline's query through ``mapInArrow``, each task
   cutting its Arrow batches by chunk with the driver's own cut (``chunk_rows``) and
   writing one file per chunk it holds with pyarrow — no sort by chunk in Spark, no pass
   in the driver; Spark's side only, as 3.;
5. with ``--concurrent-writers``: partitionBy(chunk) through 32 concurrent writers
   (``spark.sql.maxConcurrentOutputFileWriters``) with 8 MiB row groups instead of the
   sort — with Spark's default 1 GiB heap this ran the driver JVM out of memory here.

Prints each round's seconds and ratio to plain. docs/benchmarks.md ("Time-range jobs")
says why this decides the carried job's target.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from riverbed.config import SparkConfig
from riverbed.spark import session
from timerange import (  # this folder: benchmarks/timerange.py
    chunked_frame,
    generate,
    one_pass,
    one_pass_by_chunk,
    with_chunk,
)


def by_chunk_and_key(spark: Any, data: Path) -> Any:
    """Windows per (chunk, sensor), running values completed by each chunk's offset."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = with_chunk(spark.read.parquet(str(data)).drop("hour"))
    parts = df.groupBy("sensor", "chunk").agg(
        F.sum("value").alias("s"), F.count("value").alias("n")
    )
    before = (
        Window.partitionBy("sensor").orderBy("chunk").rowsBetween(Window.unboundedPreceding, -1)
    )
    offsets = parts.select(
        "sensor",
        "chunk",
        F.coalesce(F.sum("s").over(before), F.lit(0.0)).alias("off_s"),
        F.coalesce(F.sum("n").over(before), F.lit(0)).alias("off_n"),
    )
    t = F.unix_micros("ts")
    w = Window.partitionBy("chunk", "sensor")
    running = w.orderBy(t).rangeBetween(Window.unboundedPreceding, 0)
    last5 = w.orderBy(t, "value").rowsBetween(-4, 0)
    out = df.withColumns(
        {
            "_s": F.sum("value").over(running),
            "_n": F.count("value").over(running),
            "value_mean_5rows": F.avg("value").over(last5),
        }
    ).join(F.broadcast(offsets), ["sensor", "chunk"])
    total = F.col("_s") + F.col("off_s")
    return out.withColumns(
        {"value_cum_sum": total, "value_cum_mean": total / (F.col("_n") + F.col("off_n"))}
    ).drop("_s", "_n", "off_s", "off_n")


HOURS = 24  # of readings, one chunk each
FLUSH_ROWS = 131_072  # rows a Python worker buffers per chunk before a row group


def python_chunk_writer(out: str) -> Callable[[Any], Any]:
    """A ``mapInArrow`` function: each task cuts its Arrow batches by chunk with the
    driver's own cut (:func:`riverbed.timerange.carry.chunk_rows`) and writes one
    Parquet file per chunk it holds, ``<out>/chunk=<c>/part-<task>.parquet``, buffering
    each chunk's rows up to :data:`FLUSH_ROWS` per row group; it yields how many rows
    each file got."""

    def write(batches: Any) -> Any:
        import os
        import uuid

        import pyarrow as pa
        import pyarrow.parquet as pq

        from riverbed.timerange.carry import CHUNK, Boundary, chunk_rows

        bounds = [Boundary(h, h + 1, h + 1) for h in range(HOURS)]  # only their count is read
        task = uuid.uuid4().hex[:12]
        held: dict[int, list[Any]] = {}
        counts: dict[int, int] = {}
        written: dict[int, int] = {}
        writers: dict[int, Any] = {}

        def flush(c: int) -> None:
            table = pa.Table.from_batches(held.pop(c))
            counts[c] = 0
            if c not in writers:
                os.makedirs(f"{out}/chunk={c}", exist_ok=True)
                writers[c] = pq.ParquetWriter(f"{out}/chunk={c}/part-{task}.parquet", table.schema)
            writers[c].write_table(table)
            written[c] = written.get(c, 0) + table.num_rows

        for batch in batches:
            named = [CHUNK if n == "chunk" else n for n in batch.schema.names]
            table = pa.Table.from_batches([batch]).rename_columns(named)
            for c, rows in enumerate(chunk_rows(table, bounds)):  # the driver's own cut
                if rows.num_rows:
                    held.setdefault(c, []).extend(rows.to_batches())
                    counts[c] = counts.get(c, 0) + rows.num_rows
                    if counts[c] >= FLUSH_ROWS:
                        flush(c)
        for c in list(held):
            flush(c)
        for w in writers.values():
            w.close()
        yield pa.RecordBatch.from_pydict(
            {"chunk": list(written), "rows": list(written.values())},
            schema=pa.schema([("chunk", pa.int32()), ("rows", pa.int64())]),
        )

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver-memory", help="spark.driver.memory (default: Spark's, 1g)")
    parser.add_argument(
        "--concurrent-writers",
        action="store_true",
        help="also write through 32 concurrent writers (ran a 1 GiB driver out of memory)",
    )
    parser.add_argument("--only", help="run only the ways whose name contains this")
    parser.add_argument("--conf", action="append", default=[], help="a Spark setting, k=v")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rb-bench-layouts-"))
    try:
        rows = generate(root / "in", 1000, HOURS, 8.6)
        conf = {"spark.driver.memory": args.driver_memory} if args.driver_memory else {}
        for kv in args.conf:
            if "=" not in kv:
                parser.error(f"--conf {kv!r}: give a Spark setting as key=value")
            key, value = kv.split("=", 1)
            conf[key] = value
        spark = session(SparkConfig(master="local[*]", app_name="riverbed-layouts", conf=conf))
        spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
        data = root / "in"

        def concurrent(out: str) -> None:
            spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", "32")
            try:
                chunked_frame(spark, "carried", data).write.option(
                    "parquet.block.size", str(8 << 20)
                ).partitionBy("chunk").parquet(out)
            finally:
                spark.conf.unset("spark.sql.maxConcurrentOutputFileWriters")

        def python_writes(out: str) -> None:
            files = (
                chunked_frame(spark, "carried", data)
                .mapInArrow(python_chunk_writer(out), "chunk int, rows long")
                .collect()
            )
            written = sum(f["rows"] for f in files)
            if written != rows or len({f["chunk"] for f in files}) != HOURS:
                raise SystemExit(f"the Python writers wrote {written:,} rows of {rows:,}")

        ways: dict[str, Callable[[str], Any]] = {
            "partitionBy(chunk)": lambda out: one_pass_by_chunk(spark, "carried", data, Path(out)),
            "by (chunk, key), partitionBy(chunk)": lambda out: (
                by_chunk_and_key(spark, data).write.partitionBy("chunk").parquet(out)
            ),
            "by key, chunk files from Python (mapInArrow)": lambda out: python_writes(out),
        }
        if args.concurrent_writers:
            ways["partitionBy(chunk), concurrent writers"] = concurrent
        if args.only:
            ways = {name: way for name, way in ways.items() if args.only in name}
        print(f"{rows:,} rows, the carried job's windows, {args.rounds} rounds")
        for r in range(args.rounds):
            plain = one_pass(spark, "carried", data, root / "plain")
            shutil.rmtree(root / "plain")
            print(f"round {r + 1}: plain (one pass, df.write.parquet) {plain:6.1f} s")
            for name, write in ways.items():
                began = time.perf_counter()
                write(str(root / "out"))
                seconds = time.perf_counter() - began
                shutil.rmtree(root / "out")
                print(f"  {name:40} {seconds:6.1f} s  {seconds / plain:5.2f}x plain")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
