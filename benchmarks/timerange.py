"""Time-range jobs: chunked vs one pass, and the cost of a resume, in one run.

    .venv/bin/python benchmarks/timerange.py [--sensors 1000] [--hours 24] [--every 8.6]
                                             [--job rolling|carried|both]

Data: ``--hours`` of readings from ``--sensors`` sensors, one every ``--every`` seconds
each (defaults: 24 h x 1,000 sensors ≈ 10M rows), as an hour-partitioned Parquet dataset.
Jobs, hourly chunks:

* **rolling** — a 30-minute rolling mean per sensor (each chunk re-reads 30 minutes);
* **carried** — a running sum and mean per sensor since the start and a mean over the
  last 5 readings: every chunk carries state from the one before (per-key running parts
  and each sensor's last 4 rows).

For each job:

1. **Baseline — one pass**: the same windows over the whole range as one Spark query
   (``Window.partitionBy(sensor).orderBy(ts)`` with ``rangeBetween(-30min, 0)``, or
   ``rangeBetween(unboundedPreceding, 0)`` and ``rowsBetween(-4, 0)``), written with
   ``df.write.parquet`` — what a user writes without riverbed.
   Beside it, the same query written one folder per chunk (``partitionBy("chunk")``):
   Spark's own way to the layout the chunked job publishes, without its markers or
   resumes — the peer its output shape has.
2. **Chunked**: ``riverbed timerange``'s driver, each chunk staged and published with its
   progress marker (SQLite control plane). Targets: ≤ 1.2x the one-pass time, and a
   chunk's overhead — (chunked - one pass) / chunks — ≤ 0.2 s.
3. **Resume**: a fresh run stopped right after its 50 % chunk is published (as a kill
   there would), then resumed; the resume's time over a full chunked run's.
   Target: ≤ 0.55.

All use one SparkSession (``local[*]``), warmed up by a small query first.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from riverbed.config import SparkConfig
from riverbed.control import connect
from riverbed.jobs.timerange import Driver, Event, load_spec, parse_time
from riverbed.spark import session

SPEC = """
from riverbed.jobs.timerange import Cumulative, ParquetInput, Rolling, Rows, TimeRangeJob

job = TimeRangeJob(
    input=ParquetInput({input!r}, partition="hour"),
    key="sensor", time="ts",
    metrics={metrics},
    output={output!r}, chunk="1h",
)
"""
METRICS = {
    "rolling": '[Rolling("30min", "value", ["mean"])]',
    "carried": '[Cumulative("value", ["sum", "mean"]), Rows(5, "value", ["mean"])]',
}
START = "2026-01-01"
HOUR_US = 3_600_000_000  # a chunk (hourly)


def generate(folder: Path, sensors: int, hours: int, every: float) -> int:
    rng = np.random.default_rng(1)
    per_hour = int(3600 / every)
    t0 = parse_time(START)
    total = 0
    for hour in range(hours):
        base = t0 + hour * HOUR_US
        offsets = (np.arange(per_hour) * every * 1e6).astype(np.int64)
        ts = (
            base + np.tile(offsets, sensors) + rng.integers(0, int(every * 1e6), per_hour * sensors)
        )
        table = pa.table(
            {
                "sensor": np.repeat(np.arange(sensors, dtype=np.int32), per_hour),
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "value": rng.normal(20, 5, per_hour * sensors),
            }
        )
        out = folder / f"hour={START}T{hour:02d}"
        out.mkdir(parents=True)
        pq.write_table(table, out / "part.parquet")
        total += table.num_rows
    return total


def one_pass_frame(spark: Any, job: str, data: Path) -> Any:
    """The baseline's query: ``job``'s windows over the whole range, as one Spark query."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(data)).drop("hour")
    t = F.unix_micros("ts")
    by = Window.partitionBy("sensor")
    if job == "rolling":
        w = by.orderBy(t).rangeBetween(-(30 * 60 * 1_000_000 - 1), 0)
        return df.withColumn("value_mean_30m", F.avg("value").over(w))
    running = by.orderBy(t).rangeBetween(Window.unboundedPreceding, 0)
    last5 = by.orderBy(t, "value").rowsBetween(-4, 0)
    return df.withColumns(
        {
            "value_cum_sum": F.sum("value").over(running),
            "value_cum_mean": F.avg("value").over(running),
            "value_mean_5rows": F.avg("value").over(last5),
        }
    )


def with_chunk(df: Any) -> Any:
    """``df`` with each row's hourly chunk index (``chunk``)."""
    from pyspark.sql import functions as F

    index = F.floor((F.unix_micros("ts") - F.lit(parse_time(START))) / F.lit(HOUR_US))
    return df.withColumn("chunk", index.cast("int"))


def chunked_frame(spark: Any, job: str, data: Path) -> Any:
    """The baseline's query with each row's chunk, as ``partitionBy("chunk")`` needs."""
    return with_chunk(one_pass_frame(spark, job, data))


def one_pass(spark: Any, job: str, data: Path, out: Path) -> float:
    began = time.perf_counter()
    one_pass_frame(spark, job, data).write.parquet(str(out))
    return time.perf_counter() - began


def one_pass_by_chunk(spark: Any, job: str, data: Path, out: Path) -> float:
    """The one pass written one folder per chunk: Spark's own way to the output layout
    the chunked job publishes (its writer sorts each task's rows by chunk first)."""
    began = time.perf_counter()
    chunked_frame(spark, job, data).write.partitionBy("chunk").parquet(str(out))
    return time.perf_counter() - began


def chunked(spark: Any, spec_path: Path, cp_url: str, hours: int, stop_at: int = 0) -> float:
    spec = load_spec(spec_path)
    seen = 0

    class Stop(Exception):
        pass

    def on_event(event: Event) -> None:
        nonlocal seen
        if event.kind == "chunk":
            seen += 1
            if stop_at and seen == stop_at:
                raise Stop

    driver = Driver(spec, connect(cp_url), lambda: spark, on_event=on_event)
    began = time.perf_counter()
    with contextlib.suppress(Stop):
        driver.run(START, parse_time(START) + hours * HOUR_US)
    return time.perf_counter() - began


def race(spark: Any, job: str, root: Path, rows: int, hours: int) -> None:
    base = one_pass(spark, job, root / "in", root / f"onepass-{job}")
    print(f"\n{job}: {METRICS[job]}")
    print(
        f"  one pass (Spark window, df.write.parquet): {base:7.1f} s  "
        f"{rows / base:,.0f} rows/s   [baseline]"
    )

    shaped = one_pass_by_chunk(spark, job, root / "in", root / f"onepass-chunks-{job}")
    print(
        f"  one pass, a folder per chunk (partitionBy): {shaped:6.1f} s  "
        f"{rows / shaped:,.0f} rows/s   [Spark's own path to the chunked layout]"
    )

    def fresh(name: str) -> tuple[Path, str]:
        spec = root / f"{job}_{name}.py"
        output = root / f"{job}_{name}"
        text = SPEC.format(input=str(root / "in"), output=str(output), metrics=METRICS[job])
        spec.write_text(text)
        return spec, f"sqlite:///{root / job}_{name}.db"

    spec, url = fresh("chunked")
    full = chunked(spark, spec, url, hours)
    print(
        f"  chunked (hourly, riverbed driver):         {full:7.1f} s  "
        f"{rows / full:,.0f} rows/s   ratio {full / base:.2f}x one pass (target ≤ 1.2); "
        f"overhead {(full - base) / hours:+.3f} s per chunk (target ≤ 0.2); "
        f"{full / shaped:.2f}x the one pass a folder per chunk"
    )
    spec, url = fresh("resumed")
    half = chunked(spark, spec, url, hours, stop_at=hours // 2)
    resume = chunked(spark, spec, url, hours)
    print(
        f"  stopped at 50 % after {half:.1f} s; resume: {resume:7.1f} s  "
        f"ratio {resume / full:.2f} of a full chunked run (target ≤ 0.55)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--every", type=float, default=8.6, help="seconds between readings")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--job", choices=["rolling", "carried", "both"], default="both")
    parser.add_argument(
        "--driver-memory",
        help="spark.driver.memory, e.g. 4g (default: Spark's, 1g); a batch of chunks may "
        "return 1/16 of the driver's heap",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rb-bench-timerange-"))
    try:
        rows = generate(root / "in", args.sensors, args.hours, args.every)
        print(f"{rows:,} rows: {args.hours} h x {args.sensors:,} sensors, one every {args.every} s")
        conf = {"spark.driver.memory": args.driver_memory} if args.driver_memory else {}
        spark = session(
            SparkConfig(master=args.master, app_name="riverbed-bench-timerange", conf=conf)
        )
        spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM

        for job in ("rolling", "carried") if args.job == "both" else (args.job,):
            race(spark, job, root, rows, args.hours)
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
