"""End-to-end latency of a running aggregation: produce → its result row readable.

    .venv/bin/python benchmarks/latency.py                      # 1k, 10k, 100k/s, 50 % of max
    .venv/bin/python benchmarks/latency.py --rates 10000 --seconds 10 --no-max

A producer **process** writes events at a fixed rate into a riverbed topic (4 partitions
keyed by flag; a tick every 10 ms, each tick's events one ``send_batch`` of an Arrow
table; an event's time is its produce time) while riverbed's aggregation — exact
distinct users and a count per flag per hourly window, ``update`` output (every batch
emits the windows it changed) — runs in this process on ``local[2]`` with
``processingTime`` 0: the next batch starts as soon as the last one ends, and batches of
up to ``--driver-batch-records`` (50,000) run in the driver instead of as a Spark job.

A record's **latency** is from the start of the produce call that wrote it to the end of
the trigger whose batch committed its window's new row (the batch's result file and its
commit are written before its trigger ends; the trigger's start and duration are the
query's progress, the offsets each batch read its batch record). Before the rates, the
**maximum** is measured: a backlog of ``--max-events`` drained with ``availableNow``;
the last rate is 50 % of it.

Prints, per rate: the rate achieved, batches and records per batch, latency p50 / p95 /
p99 / max, and where a trigger's time went (planning, the state job, the rest); writes
the curve as a PNG (``--plot``, default ``build/latency.png``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import riverbed.log
from riverbed.config import SparkConfig
from riverbed.spark import session
from riverbed.stream import Aggregation, Count, Distinct, Tumbling, start
from riverbed.stream.batchlog import open_batches

SCHEMA = "user_id long, flag string, ts timestamp"
TICK_S = 0.01
FLAGS = 50
USERS = 500_000


def spec(name: str) -> Aggregation:
    return Aggregation(
        name=name,
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="10m",
        metrics={"users": Distinct("user_id"), "events": Count()},
        state_partitions=4,
    )


def events_table(n: int, rng: np.random.Generator, now: float) -> pa.Table:
    """``n`` events at time ``now``: zipf-skewed flags, uniform users."""
    flags = (rng.zipf(1.3, n) - 1) % FLAGS
    return pa.table(
        {
            "user_id": pa.array(rng.integers(0, USERS, n), pa.int64()),
            "flag": pa.array([f"f{f:02d}" for f in flags]),
            "ts": pa.array(np.full(n, int(now * 1e6), dtype="datetime64[us]")).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


# -- the producer process ----------------------------------------------------------------


def produce(url: str, rate: int, seconds: float, out: Path) -> None:
    """Write ``rate`` events a second for ``seconds`` in 10 ms ticks; save, per record,
    its partition, offset and the time its produce call started."""
    log = riverbed.log.open(url)
    producer = log.producer("clicks")
    rng = np.random.default_rng(rate)
    parts: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    sent: list[np.ndarray] = []
    per_tick = rate * TICK_S
    owed = 0.0
    began = time.time()
    tick = 0
    while True:
        due = began + tick * TICK_S
        now = time.time()
        if now < due:
            time.sleep(due - now)
        if due - began >= seconds:
            break
        owed += per_tick
        n = int(owed)
        owed -= n
        tick += 1
        if n == 0:
            continue
        t0 = time.time()
        meta = producer.send_batch(events_table(n, rng, t0), key_field="flag")
        parts.append(np.fromiter((m.partition for m in meta), np.int16, len(meta)))
        offsets.append(np.fromiter((m.offset for m in meta), np.int64, len(meta)))
        sent.append(np.full(len(meta), t0))
    log.close()
    np.savez(
        out,
        partition=np.concatenate(parts),
        offset=np.concatenate(offsets),
        sent=np.concatenate(sent),
        seconds=time.time() - began,
    )


# -- the driver side ---------------------------------------------------------------------


def bench_session() -> Any:
    return session(
        SparkConfig(
            master="local[2]", app_name="riverbed-latency", conf={"spark.ui.enabled": "false"}
        )
    )


def fill_topic(url: str, partitions: int = 4) -> None:
    log = riverbed.log.open(url)
    log.create_topic("clicks", partitions, schema=SCHEMA)
    log.close()


def max_rate(spark: Any, root: Path, events: int) -> float:
    """Events per second through the aggregation on a backlog (availableNow)."""
    url = f"file://{root / 'log-max'}"
    fill_topic(url)
    log = riverbed.log.open(url)
    producer = log.producer("clicks")
    rng = np.random.default_rng(0)
    for i in range(0, events, 50_000):
        producer.send_batch(
            events_table(min(50_000, events - i), rng, time.time()), key_field="flag"
        )
    log.close()
    source = {"topic": "clicks", "log": url, "schema": SCHEMA, "maxRecordsPerBatch": "500000"}
    began = time.perf_counter()
    query = start(
        spark,
        spec("latency_max"),
        source,
        checkpoint=root / "ckpt-max",
        output=root / "out-max",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return events / (time.perf_counter() - began)


def run_rate(
    spark: Any, root: Path, rate: int, seconds: float, driver_records: int
) -> dict[str, Any]:
    """One rate: the producer process and the running aggregation; the latencies."""
    name = f"latency_{rate}"
    url = f"file://{root / f'log-{rate}'}"
    fill_topic(url)
    source = {"topic": "clicks", "log": url, "schema": SCHEMA}
    source["driverBatchRecords"] = str(driver_records)
    checkpoint = root / f"ckpt-{rate}"
    query = start(
        spark,
        spec(name),
        source,
        checkpoint=checkpoint,
        output=root / f"out-{rate}",
        trigger={"processingTime": "0 seconds"},
    )
    progress: dict[int, dict[str, Any]] = {}
    slices: dict[int, dict[str, list[int]]] = {}
    batches = open_batches(checkpoint)
    stop = threading.Event()

    def seen() -> None:
        # recentProgress keeps the last 100 triggers, and the maintenance prunes batch
        # records older than retain_versions: each batch's slices are read as it ends
        for p in query.recentProgress:
            if p["batchId"] not in progress:
                record = batches.get(p["batchId"])
                if record is not None and record.slices:
                    slices[p["batchId"]] = record.slices
            progress[p["batchId"]] = p

    def collect() -> None:
        while not stop.is_set():
            seen()
            stop.wait(0.05)

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    sends = root / f"sends-{rate}.npz"
    subprocess.run(
        [sys.executable, __file__, "--produce", url, "--rate", str(rate), "--seconds", str(seconds),
         "--out", str(sends)],
        check=True,
    )  # fmt: skip
    produced = np.load(sends)
    total = len(produced["offset"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until every record is in a committed batch
        if sum(p["numInputRows"] for p in progress.values()) >= total:
            break
        time.sleep(0.05)
    stop.set()
    collector.join()
    seen()
    query.stop()
    assert query.exception() is None, query.exception()
    return latencies(slices, progress, produced, rate)


def latencies(
    slices: dict[int, dict[str, list[int]]],
    progress: dict[int, dict[str, Any]],
    produced: Any,
    rate: int,
) -> dict[str, Any]:
    """Each record's latency: the end of the trigger of the batch that read it (whose
    ``slices`` say which offsets) minus the start of its produce call."""
    by_partition = {}  # partition → (offsets, produce times), by offset
    for part in np.unique(produced["partition"]):
        mine = produced["partition"] == part
        order = np.argsort(produced["offset"][mine])
        by_partition[int(part)] = (produced["offset"][mine][order], produced["sent"][mine][order])
    lat: list[np.ndarray] = []
    sizes, plan_ms, job_ms, trig_ms = [], [], [], []
    for batch_id, p in sorted(progress.items()):
        if batch_id not in slices or not p["numInputRows"]:
            continue
        ended = datetime.fromisoformat(p["timestamp"]).timestamp() + (
            p["durationMs"]["triggerExecution"] / 1000
        )
        for part, (lo, hi) in slices[batch_id].items():
            if int(part) not in by_partition:
                continue
            offs, times = by_partition[int(part)]
            i, j = np.searchsorted(offs, lo), np.searchsorted(offs, hi)
            lat.append(ended - times[i:j])
        sizes.append(p["numInputRows"])
        plan_ms.append(p["durationMs"]["latestOffset"])
        job_ms.append(p["durationMs"]["addBatch"])
        trig_ms.append(p["durationMs"]["triggerExecution"])
    values = np.concatenate(lat) * 1000 if lat else np.array([np.nan])
    if len(values) < len(produced["offset"]):  # a batch not seen: its records unmeasured
        print(f"  note: {len(values):,} of {len(produced['offset']):,} records measured")
    return {
        "rate": rate,
        "achieved": len(produced["offset"]) / float(produced["seconds"]),
        "records": len(values),
        "batches": len(sizes),
        "per_batch": float(np.mean(sizes)) if sizes else 0.0,
        "p50": float(np.percentile(values, 50)),
        "p95": float(np.percentile(values, 95)),
        "p99": float(np.percentile(values, 99)),
        "max": float(values.max()),
        "trigger_ms": float(np.median(trig_ms)) if trig_ms else 0.0,
        "plan_ms": float(np.median(plan_ms)) if plan_ms else 0.0,
        "job_ms": float(np.median(job_ms)) if job_ms else 0.0,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["achieved"])
    x = [r["achieved"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^-")):
        ax.plot(x, [r[key] for r in rows], style, label=key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("events / s (achieved)")
    ax.set_ylabel("produce → result readable, ms")
    ax.set_title("riverbed: end-to-end latency, exact distinct per flag per hour, local[2]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-events", type=int, default=2_000_000)
    parser.add_argument("--no-max", action="store_true", help="skip the 50 %% of max rate")
    parser.add_argument(
        "--driver-batch-records",
        type=int,
        default=50_000,
        help="batches up to this many records run in the driver, not as a Spark job "
        "(the source option driverBatchRecords; 0: every batch a Spark job)",
    )
    parser.add_argument("--plot", type=Path, default=Path("build/latency.png"))
    parser.add_argument("--produce", help=argparse.SUPPRESS)  # the producer process
    parser.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        produce(args.produce, args.rate, args.seconds, args.out)
        return
    root = Path(tempfile.mkdtemp(prefix="rb-latency-"))
    try:
        spark = bench_session()
        rates = list(args.rates)
        if not args.no_max:
            best = max_rate(spark, root, args.max_events)
            print(f"maximum: {best:,.0f} events/s ({args.max_events:,} events, availableNow)")
            rates.append(int(best * 0.5))
        rows = []
        print(
            f"{'rate/s':>9} {'achieved':>9} {'batches':>7} {'rec/batch':>9} {'p50 ms':>8} "
            f"{'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'trigger':>8} {'plan':>6} {'job':>6}"
        )
        for rate in rates:
            r = run_rate(spark, root, rate, args.seconds, args.driver_batch_records)
            rows.append(r)
            print(
                f"{rate:>9,} {r['achieved']:>9,.0f} {r['batches']:>7} {r['per_batch']:>9,.0f} "
                f"{r['p50']:>8.0f} {r['p95']:>8.0f} {r['p99']:>8.0f} {r['max']:>8.0f} "
                f"{r['trigger_ms']:>8.0f} {r['plan_ms']:>6.0f} {r['job_ms']:>6.0f}",
                flush=True,
            )
        plot(rows, args.plot)
        print(f"curve: {args.plot}")
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
