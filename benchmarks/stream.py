"""Hourly distinct users per flag, streaming, riverbed vs Spark's own paths, same run.

    .venv/bin/python benchmarks/stream.py [--events 2000000] [--batches 10]

One dataset (``--events`` over 24 h, 50 skewed flags, ~500k users) in a riverbed
topic; every streaming path reads it through the same ``format("riverbed")`` source
in ``--batches`` micro-batches (AvailableNow), so the ratios compare the aggregation.

* riverbed exact / HLL / adaptive (this project's engine, state in RocksDB);
* Spark streaming ``size(collect_set(user_id))`` and ``hll_sketch_agg`` with the RocksDB
  state store provider (JVM state);
* limits: Spark *batch* ``count(distinct)`` and ``approx_count_distinct`` over the same
  source, and pandas ``groupby().nunique()`` on the events in memory.

Prints events/s per path and ratios against Spark's fastest exact / HLL streaming path.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import riverbed.log
from riverbed.config import SparkConfig
from riverbed.spark import session
from riverbed.stream import Aggregation, Count, Distinct, Tumbling, register, start

SCHEMA = "user_id long, flag string, ts timestamp"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def generate(n: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ts = pd.Timestamp("2026-11-20", tz="UTC") + pd.to_timedelta(
        np.sort(rng.integers(0, 24 * 3_600_000, n)), unit="ms"
    )
    flags = (rng.zipf(1.3, n) - 1) % 50
    users = rng.integers(0, 500_000, n)
    return pd.DataFrame({"user_id": users, "flag": [f"f{f:02d}" for f in flags], "ts": ts})


def fill(url: str, events: pd.DataFrame) -> None:
    log = riverbed.log.open(url)
    log.create_topic("clicks", 4)
    producer = log.producer("clicks")
    for i in range(0, len(events), 50_000):
        chunk = events.iloc[i : i + 50_000]
        producer.send_batch(
            [
                {"user_id": int(u), "flag": f, "ts": t.isoformat()}
                for u, f, t in chunk.itertuples(index=False)
            ],
            key_field="flag",
        )
    log.close()


def stream_source(spark: Any, url: str, per_batch: int) -> Any:
    return (
        spark.readStream.format("riverbed")
        .option("topic", "clicks")
        .option("log", url)
        .option("schema", SCHEMA)
        .option("maxRecordsPerBatch", per_batch)
        .load()
        .select("user_id", "flag", "ts")
    )


def timed(fn: Any) -> float:
    start_t = time.perf_counter()
    fn()
    return time.perf_counter() - start_t


def riverbed_path(spark: Any, url: str, root: Path, mode: str, per_batch: int) -> float:
    spec = Aggregation(
        name=f"bench_{mode}",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="10m",
        metrics={
            "users": Distinct("user_id", mode=mode),  # type: ignore[arg-type]
            "events": Count(),
        },
        state_partitions=4,
    )

    def run() -> None:
        query = start(
            spark,
            spec,
            stream_source(spark, url, per_batch),
            checkpoint=root / f"ckpt-{mode}",
            output=root / f"out-{mode}",
            trigger={"availableNow": True},
        )
        query.awaitTermination()
        assert query.exception() is None, query.exception()

    return timed(run)


def spark_streaming_path(spark: Any, url: str, root: Path, kind: str, per_batch: int) -> float:
    from pyspark.sql import functions as F

    df = stream_source(spark, url, per_batch).withWatermark("ts", "10 minutes")
    grouped = df.groupBy(F.window("ts", "1 hour"), "flag")
    if kind == "collect_set":
        agg = grouped.agg(F.size(F.collect_set("user_id")).alias("users"))
    else:
        agg = grouped.agg(F.hll_sketch_estimate(F.hll_sketch_agg("user_id", 12)).alias("users"))

    def run() -> None:
        query = (
            agg.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(root / f"spark-{kind}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None, query.exception()

    return timed(run)


def spark_batch_path(spark: Any, url: str, kind: str) -> float:
    from pyspark.sql import functions as F

    df = (
        spark.read.format("riverbed")
        .option("topic", "clicks")
        .option("log", url)
        .option("schema", SCHEMA)
        .load()
    )
    distinct = (
        F.count_distinct("user_id") if kind == "exact" else F.approx_count_distinct("user_id")
    )
    return timed(lambda: df.groupBy(F.window("ts", "1 hour"), "flag").agg(distinct).collect())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    n, per_batch = args.events, args.events // args.batches
    events = generate(n)
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        url = f"file://{root / 'log'}"
        fill(url, events)
        spark = session(
            SparkConfig(
                master="local[2]",
                conf={
                    "spark.sql.shuffle.partitions": "4",
                    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
                },
            )
        )
        register(spark)
        rows.append(
            (
                "pandas groupby().nunique() (in memory, limit)",
                timed(
                    lambda: (
                        events.assign(w=events["ts"].dt.floor("1h"))
                        .groupby(["w", "flag"])["user_id"]
                        .nunique()
                    )
                ),
            )
        )
        rows.append(("Spark batch count(distinct) (limit)", spark_batch_path(spark, url, "exact")))
        rows.append(
            ("Spark batch approx_count_distinct (limit)", spark_batch_path(spark, url, "approx"))
        )
        rows.append(
            (
                "Spark streaming size(collect_set), RocksDB",
                spark_streaming_path(spark, url, root, "collect_set", per_batch),
            )
        )
        rows.append(
            (
                "Spark streaming hll_sketch_agg, RocksDB",
                spark_streaming_path(spark, url, root, "hll", per_batch),
            )
        )
        for mode in ("exact", "hll", "adaptive"):
            rows.append((f"riverbed {mode}", riverbed_path(spark, url, root, mode, per_batch)))
        spark.stop()
    rates = {name: n / seconds for name, seconds in rows}
    exact_base = rates["Spark streaming size(collect_set), RocksDB"]
    hll_base = rates["Spark streaming hll_sketch_agg, RocksDB"]
    print(f"{n:,} events, {args.batches} micro-batches, local[2]")
    print(f"{'path':48} {'seconds':>8} {'events/s':>12}")
    for name, seconds in rows:
        print(f"{name:48} {seconds:8.1f} {n / seconds:12,.0f}")
    exact_ratio = rates["riverbed exact"] / exact_base
    print(f"\nriverbed exact / Spark collect_set streaming: {exact_ratio:.2f}x (target 1.5x)")
    print(
        f"riverbed HLL / Spark hll_sketch_agg streaming: {rates['riverbed hll'] / hll_base:.2f}x"
        f" (target 1.5x)"
    )
    print(
        f"riverbed adaptive / Spark collect_set streaming: "
        f"{rates['riverbed adaptive'] / exact_base:.2f}x"
    )


if __name__ == "__main__":
    main()
