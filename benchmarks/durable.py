"""What object storage costs riverbed: file vs s3 checkpoints, in one run.

    .venv/bin/python benchmarks/durable.py [--events 2000000] [--per-batch 200000]
                                           [--restore-gb 1] [--start-gb 0.1 1]

Starts the tests' S3 server (a one-host Ceph RGW on loopback, ``riverbed.testing.s3``,
with a 24 GiB sparse OSD) and measures, with the same code and data on both tiers:

1. **stream throughput** — the log-native aggregation (hourly exact distinct users per
   flag, 4 state partitions, ``--per-batch`` events a batch) over ``--events`` events,
   checkpoint + state + results on a local directory vs in the bucket; work stealing
   off on both (a bucket's checkpoint has none), so the tier is the only difference.
   Goal: s3 ≥ 0.8x file. The server's own usage log counts the requests every process
   made (driver and Spark's Python workers): PUTs, GETs and LISTs, and bytes written,
   per batch — and what they cost per million events at AWS's list price;
2. **restore** — ``--restore-gb`` of state (4 partitions of random, incompressible
   values) snapshotted to the bucket, then loaded by a fresh provider on an empty disk,
   vs the same objects downloaded raw in parallel (obstore, 8 threads, no checks: the
   floor). Goal: restore ≥ 0.8x raw;
3. **fresh start** — for each ``--start-gb``: an aggregation whose state is about that
   big (a count per key in one open window, built through the engine's own merge and
   snapshotted to the bucket, batch 0 recorded as done) loses its machine; 10,000 new
   events arrive, and a driver on an empty directory is timed from start to its first
   committed batch (the Spark session is up already: its start-up is not the tier's).
   Its state job is the restore of every partition plus the merge of those events.

Prints one table per part; record results with the command in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import riverbed.log
from riverbed.config import SparkConfig
from riverbed.spark import session
from riverbed.state import StateConfig, StateProvider
from riverbed.storage import open_store
from riverbed.stream import Aggregation, Count, Distinct, Tumbling, start
from riverbed.stream.batchlog import open_batches
from riverbed.testing.s3 import CephS3Server

BUCKET = "rb-durable"
SCHEMA = "user_id long, flag string, ts timestamp"
PUT_PRICE = 0.005 / 1000  # AWS S3 Standard, us-east-1: PUT, COPY, POST, LIST per request
GET_PRICE = 0.0004 / 1000  # GET and all other requests
BYTES_PER_KEY = 120  # a 96-character random key and its count, in a snapshot (measured)
T0_MS = 1_795_132_800_000  # 2026-11-20T00:00:00Z, the events' first day
WRITES = ("put_obj", "post_obj", "copy_obj", "multi_object_delete", "delete_obj")


def aggregation(name: str, window: str = "1h", distinct: bool = True) -> Aggregation:
    metrics: dict[str, Any] = {"events": Count()}
    if distinct:
        metrics["users"] = Distinct("user_id")
    return Aggregation(
        name=name,
        key="flag",
        time="ts",
        window=Tumbling(window),
        watermark="10m",
        metrics=metrics,
        state_partitions=4,
    )


def events(n: int, seed: int, users: int, start_ms: int = 0, keys: str = "flags") -> pd.DataFrame:
    """``n`` events over a day; keyed by 50 flags, or (``keys="unique"``) each by its own
    key, so that every event adds a key to the state."""
    rng = np.random.default_rng(seed)
    ts = pd.Timestamp("2026-11-20", tz="UTC") + pd.to_timedelta(
        start_ms + np.sort(rng.integers(0, 24 * 3_600_000, n)), unit="ms"
    )
    if keys == "unique":
        flags = [f"k{seed}-{i}" for i in range(n)]
    else:
        flags = [f"f{f:02d}" for f in rng.integers(0, 50, n)]
    return pd.DataFrame({"user_id": rng.integers(0, users, n), "flag": flags, "ts": ts})


def fill(url: str, frame: pd.DataFrame) -> None:
    log = riverbed.log.open(url)
    if "clicks" not in log.topics():
        log.create_topic("clicks", 4, schema=SCHEMA)
    producer = log.producer("clicks")
    for i in range(0, len(frame), 50_000):
        chunk = frame.iloc[i : i + 50_000]
        producer.send_batch(
            [{"user_id": int(u), "flag": f, "ts": t} for u, f, t in chunk.itertuples(index=False)],
            key_field="flag",
        )
    log.close()


def run_stream(
    spark: Any,
    spec: Aggregation,
    log_url: str,
    where: str,
    local: Path,
    per_batch: int,
    state: StateConfig | None = None,
) -> float:
    """Seconds to run ``spec`` over the topic to its end, checkpoint/state/results at
    ``where`` (a directory or a bucket URL)."""
    source = {
        "topic": "clicks",
        "log": log_url,
        "schema": SCHEMA,
        "maxRecordsPerBatch": str(per_batch),
        "co_locate": "true",
        "steal": "false",
    }
    began = time.perf_counter()
    query = start(
        spark,
        spec,
        source,
        checkpoint=f"{where}/{spec.name}",
        output=f"{where}/output/{spec.name}",
        state=state or StateConfig(local_dir=local, durable=f"{where}/state"),
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return time.perf_counter() - began


def server_cpu(server: CephS3Server) -> float:
    """CPU seconds the S3 server's daemons (gateway, OSD, monitor) have used: on this
    machine they share the 2 cores with Spark, which a real S3 would not."""
    total = 0.0
    for daemon in ("client.rgw.a", "osd.0", "mon.a"):
        pid = server._pid(daemon)
        if pid is not None:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def usage_delta(server: CephS3Server, before: dict[str, dict[str, int]]) -> dict[str, Any]:
    time.sleep(2)  # the gateway flushes its usage log every second
    now = server.usage()
    ops = {c: now[c]["ops"] - before.get(c, {}).get("ops", 0) for c in now}
    received = sum(now[c]["received"] - before.get(c, {}).get("received", 0) for c in now)
    writes = sum(ops.get(c, 0) for c in WRITES)
    lists = ops.get("list_bucket", 0)
    gets = ops.get("get_obj", 0) + ops.get("get_bucket_location", 0)
    return {"writes": writes, "lists": lists, "gets": gets, "bytes": received, "ops": ops}


def part_stream(spark: Any, server: CephS3Server, root: Path, args: Any) -> None:
    print(f"\n1. stream throughput: {args.events:,} events, {args.per_batch:,} a batch")
    log_url = f"file://{root / 'log-stream'}"
    fill(log_url, events(args.events, seed=1, users=500_000))
    small = f"file://{root / 'log-warm'}"
    fill(small, events(40_000, seed=9, users=5_000))
    for tier in ("file", "s3"):  # warm both paths once: Spark's first jobs, the clients
        where = str(root / "warm") if tier == "file" else f"s3://{BUCKET}/warm"
        run_stream(spark, aggregation(f"warm_{tier}"), small, where, root / "warm-local", 20_000)
    rows = []
    seconds: dict[str, list[float]] = {"file": [], "s3": []}
    cost: dict[str, Any] = {}
    for r in range(args.repeat):
        for tier in ("file", "s3"):
            name = f"agg_{tier}_{r}"
            where = str(root / "tier") if tier == "file" else f"s3://{BUCKET}/tier"
            before, cpu = server.usage(), server_cpu(server)
            s = run_stream(
                spark, aggregation(name), log_url, where, root / f"local-{name}", args.per_batch
            )
            seconds[tier].append(s)
            if tier == "s3":
                cost = usage_delta(server, before)
                cost["server_cpu"] = server_cpu(server) - cpu
                cost["batches"] = len(open_batches(f"{where}/{name}").ids())
            shutil.rmtree(root / f"local-{name}", ignore_errors=True)
    for tier in ("file", "s3"):
        s = float(np.median(seconds[tier]))
        rows.append((tier, s, args.events / s))
    print(f"{'checkpoints':<12} {'seconds':>8} {'events/s':>12}  (median of {args.repeat})")
    for tier, s, rate in rows:
        print(f"{tier:<12} {s:>8.2f} {rate:>12,.0f}")
    print(f"s3 / file throughput: {rows[1][2] / rows[0][2]:.2f}x  (goal >= 0.8x)")
    b = cost["batches"]
    per_million = args.events / 1e6
    dollars = (cost["writes"] + cost["lists"]) * PUT_PRICE + cost["gets"] * GET_PRICE
    print(
        f"requests per batch (s3, {b} batches): {cost['writes'] / b:.1f} writes, "
        f"{cost['gets'] / b:.1f} GETs, {cost['lists'] / b:.1f} LISTs; "
        f"{cost['bytes'] / b / 1e6:.2f} MB written"
    )
    print(
        f"request cost at list price: ${dollars / per_million:.4f} per million events "
        f"(${dollars / b * 86400:.2f} a day at one batch a second)"
    )
    print(f"  by category: {cost['ops']}")
    print(
        f"the S3 server's own CPU during the last s3 run: {cost['server_cpu']:.2f} s "
        f"(of {seconds['s3'][-1]:.2f} s wall on 2 cores shared with Spark)"
    )


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def part_restore(server: CephS3Server, root: Path, gb: float) -> None:
    print(f"\n2. restore: {gb:g} GB of state, 4 partitions, fresh disk")
    url = f"s3://{BUCKET}/restore"
    value = 1024
    per_partition = int(gb * 1e9 / value / 4)
    rng = np.random.default_rng(3)
    writer = StateProvider(
        StateConfig(local_dir=root / "restore-a", durable=f"{url}/state", snapshot_every=1)
    )
    began = time.perf_counter()
    for p in range(4):
        store = writer.load("big", p)
        block = rng.bytes(value * 10_000)
        for i in range(per_partition):
            j = i % 10_000
            store.put(b"k%012d" % i, block[j * value : (j + 1) * value][:-8] + i.to_bytes(8, "big"))
        store.commit(1)
    print(f"built and uploaded in {time.perf_counter() - began:.1f} s")
    shutil.rmtree(root / "restore-a")
    state = open_store(f"{url}/state")
    keys = [(i.key, i.size) for i in state.list("big/") if "/shared/" in i.key]
    total = sum(size for _, size in keys)

    def restore() -> float:
        shutil.rmtree(root / "restore-b", ignore_errors=True)
        reader = StateProvider(StateConfig(local_dir=root / "restore-b", durable=f"{url}/state"))
        t = time.perf_counter()
        # two at a time, as a 4-partition aggregation's tasks restore them on 2 cores
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: reader.load("big", p, 1), range(4)))
        return time.perf_counter() - t

    def raw() -> float:
        target = root / "raw"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: state.get_file(k[0], target / k[0].replace("/", "_")), keys))
        return time.perf_counter() - t

    restores, raws = [], []
    for _ in range(5):  # interleaved; medians (single runs vary by ±30 % here)
        raws.append(raw())
        restores.append(restore())
    r, w = float(np.median(restores)), float(np.median(raws))
    print(f"{'':<28} {'seconds':>8} {'MB/s':>8}   ({total / 1e6:,.0f} MB in {len(keys)} objects)")
    print(f"{'raw parallel download':<28} {w:>8.2f} {total / w / 1e6:>8.0f}")
    print(f"{'riverbed restore':<28} {r:>8.2f} {total / r / 1e6:>8.0f}")
    print(f"restore / raw: {w / r:.2f}x  (goal >= 0.8x; median of 5 interleaved rounds)")
    print(f"  every round, raw: {_seconds(raws)}; restore: {_seconds(restores)}")
    shutil.rmtree(root / "raw", ignore_errors=True)
    shutil.rmtree(root / "restore-b", ignore_errors=True)


def build_state(spec: Aggregation, where: str, local: Path, keys: int) -> None:
    """``keys`` counts (96-character random keys) in one open window, committed as state
    version 1 with a snapshot, through the engine's own merge (``merge_partition``, as
    a batch's tasks run it), and batch 0 recorded as done with it: what a long-running
    aggregation leaves in the bucket, made without producing its events."""
    from riverbed.stream.batchlog import BatchRecord
    from riverbed.stream.engine import EngineConfig, merge_partition, state_partition_of

    config = EngineConfig(
        spec,
        StateConfig(local_dir=local, durable=f"{where}/state", snapshot_every=1),
        f"{where}/{spec.name}",
        f"{where}/output/{spec.name}",
    )
    size = spec.window.size_ms
    window = T0_MS // size * size
    names = pd.Series([os.urandom(48).hex() for _ in range(keys)])
    owners = state_partition_of(names, 4)
    for p in range(4):
        partials = [(window, k, {"events": 1}) for k in names[owners == p]]
        merge_partition(config, p, 0, 0, 0, partials)
    batches = open_batches(f"{where}/{spec.name}")
    plan = BatchRecord(slices={str(p): [0, 0] for p in range(4)}, co_located=True)
    batches.put(0, plan)
    totals = {"input": keys, "late": 0, "malformed": 0, "batches": 1}
    batches.put(0, replace(plan, done=True, input=keys, totals=totals))


def part_fresh_start(spark: Any, root: Path, gbs: list[float]) -> None:
    print("\n3. fresh start: empty disk to the first committed batch, checkpoints in the bucket")
    print(f"{'snapshot':>10} {'keys':>12} {'first batch s':>14} {'its state job s':>16}")
    small = f"file://{root / 'log-warm-start'}"  # Spark's first jobs are not the tier's
    fill(small, events(20_000, seed=9, users=5_000))
    run_stream(spark, aggregation("warm_start"), small, f"s3://{BUCKET}/warm", root / "w", 10_000)
    for gb in gbs:
        keys = int(gb * 1e9 / BYTES_PER_KEY)
        spec = aggregation(f"start_{str(gb).replace('.', '_')}", window="30d", distinct=False)
        where = f"s3://{BUCKET}/start"
        build_state(spec, where, root / "start-a", keys)
        state = open_store(f"{where}/state/{spec.name}")
        size = sum(i.size for i in state.list() if "/shared/" in i.key)  # the snapshot
        shutil.rmtree(root / "start-a")  # the machine is gone; 10,000 new events arrive
        log_url = f"file://{root / f'log-start-{gb:g}'}"
        fill(log_url, events(10_000, seed=6, users=1000, start_ms=3_600_000, keys="unique"))
        batches = open_batches(f"{where}/{spec.name}")
        began = time.perf_counter()
        query = start(
            spark,
            spec,
            {"topic": "clicks", "log": log_url, "schema": SCHEMA, "steal": "false"},
            checkpoint=f"{where}/{spec.name}",
            output=f"{where}/output/{spec.name}",
            state=StateConfig(local_dir=root / "start-b", durable=f"{where}/state"),
            trigger={"availableNow": True},
        )
        while (record := batches.get(1)) is None or not record.done:
            if not query.isActive:
                query.awaitTermination()
            time.sleep(0.05)
        first = time.perf_counter() - began
        query.awaitTermination()
        job = (record.ms or {}).get("state_job", 0) / 1000  # restore + merge of 10k events
        print(f"{size / 1e9:>8.2f}GB {keys:>12,} {first:>14.2f} {job:>16.2f}")
        shutil.rmtree(root / "start-b", ignore_errors=True)
        shutil.rmtree(root / f"log-start-{gb:g}", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--per-batch", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--restore-gb", type=float, default=1.0)
    parser.add_argument("--start-gb", type=float, nargs="*", default=[0.1, 1.0])
    parser.add_argument("--skip", nargs="*", default=[], choices=["stream", "restore", "start"])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rb-durable-"))
    try:
        with CephS3Server(root / "s3", block_size="24G") as server:
            server.create_bucket(BUCKET)
            os.environ.update(server.env())
            spark = session(SparkConfig(master="local[2]", app_name="riverbed-durable"))
            if "stream" not in args.skip:
                part_stream(spark, server, root, args)
            if "restore" not in args.skip:
                part_restore(server, root, args.restore_gb)
            if "start" not in args.skip:
                part_fresh_start(spark, root, args.start_gb)
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
