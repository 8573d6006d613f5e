"""A stream-stream join at a steady rate for a long time: does its state stay flat once
the watermark moves?

    .venv/bin/python benchmarks/join_state.py [--minutes 30] [--rate 1000]

A producer writes orders at ``--rate`` a second (event time = now) and each order's
payment (9 in 10 orders) when its time comes, 0 to 2 minutes later; a join of each
order with its payments within 2 minutes (``how="left"``, watermark 30 s) runs in this
process (``local[2]``, a batch a second). Every minute it prints the events written, the
pairs and unmatched orders the join emitted, its lag, the size of its state on disk
(RocksDB's local files, and the durable tier: snapshots and changelogs) and the
process's resident memory ("local MB": the partitions' data — SST files, write-ahead
logs, manifests; "logs MB": RocksDB's info logs beside them, rolled at 1 MiB, 3 kept).
Flat state and memory after the first minutes, while the counts grow, is the answer;
growth, where it grows.
"""

from __future__ import annotations

import argparse
import heapq
import random
import tempfile
import threading
import time
from pathlib import Path

import riverbed.log
from riverbed.stream import Join, Topic
from riverbed.stream.batchlog import open_batches
from riverbed.stream.joinquery import start_join
from riverbed.stream.layout import Checkpoint, state_root


def _size(path: Path, logs: bool | None = None) -> int:
    """Bytes of the files under ``path``; ``logs``: only RocksDB's info logs (``LOG*``,
    True) or all but them (False)."""
    return sum(
        p.stat().st_size
        for p in path.rglob("*")
        if p.is_file() and (logs is None or p.name.startswith("LOG") == logs)
    )


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def produce(url: str, rate: int, stop: threading.Event, written: list[int]) -> None:
    """Orders at ``rate`` a second, event time now; payments when their time comes."""
    log = riverbed.log.open(url)
    orders, payments = log.producer("orders"), log.producer("payments")
    rng = random.Random(1)
    due: list[tuple[float, int]] = []  # (when, order id)
    next_id = 0
    while not stop.is_set():
        began = time.time()
        batch = []
        for _ in range(rate // 10):  # ten sends a second
            batch.append({"order_id": next_id, "amount": 1.0, "ts": began})
            if rng.random() < 0.9:
                heapq.heappush(due, (began + rng.uniform(0, 120), next_id))
            next_id += 1
        orders.send_batch(
            [{**o, "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(o["ts"]))
              + f".{int(o['ts'] * 1000) % 1000:03d}Z"} for o in batch],
            key_field="order_id",
        )  # fmt: skip
        paid = []
        while due and due[0][0] <= time.time():
            when, order = heapq.heappop(due)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
            paid.append(
                {"order_id": order, "paid": 1.0, "ts": f"{stamp}.{int(when * 1000) % 1000:03d}Z"}
            )
        if paid:
            payments.send_batch(paid, key_field="order_id")
        written[0] += len(batch) + len(paid)
        stop.wait(max(0.0, 0.1 - (time.time() - began)))
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=1000, help="orders a second")
    args = parser.parse_args()
    from riverbed.config import SparkConfig
    from riverbed.spark import session

    spark = session(SparkConfig(master="local[2]", app_name="riverbed-join-state"))
    with tempfile.TemporaryDirectory(prefix="rb-join-state-") as tmp:
        root = Path(tmp)
        url = f"file://{root / 'log'}"
        log = riverbed.log.open(url)
        log.create_topic("orders", 4, schema="order_id long, amount double, ts timestamp")
        log.create_topic("payments", 4, schema="order_id long, paid double, ts timestamp")
        log.close()
        join = Join(
            name="paid", left=Topic("orders"), right=Topic("payments"), on="order_id",
            time="ts", within=("0s", "2m"), how="left", watermark="30s",
        )  # fmt: skip
        stop, written = threading.Event(), [0]
        producer = threading.Thread(target=produce, args=(url, args.rate, stop, written))
        producer.start()
        query = start_join(
            spark, join, checkpoint=root / "cp", output=root / "out", log_url=url,
            trigger={"processingTime": "1 second"},
        )  # fmt: skip
        batches = open_batches(root / "cp")
        began = time.time()
        print(f"{'min':>4}{'written':>11}{'joined':>11}{'unmatched':>11}{'batches':>9}"
              f"{'local MB':>10}{'logs MB':>9}{'durable MB':>12}{'RSS MB':>9}",
              flush=True)  # fmt: skip
        try:
            while time.time() - began < args.minutes * 60:
                time.sleep(60 - (time.time() - began) % 60)
                if query.exception() is not None:
                    raise query.exception()  # type: ignore[misc]
                ids = batches.ids()
                done = next((r for b in reversed(ids) if (r := batches.get(b)) and r.done), None)
                totals = (done.totals or {}) if done is not None else {}
                local = _size(Checkpoint(root / "cp").local_state, logs=False) / 2**20
                logs = _size(Checkpoint(root / "cp").local_state, logs=True) / 2**20
                durable = _size(state_root(root / "cp")) / 2**20
                print(
                    f"{(time.time() - began) / 60:>4.0f}{written[0]:>11,}"
                    f"{totals.get('joined', 0):>11,}{totals.get('unmatched', 0):>11,}"
                    f"{totals.get('batches', 0):>9,}{local:>10.1f}{logs:>9.1f}{durable:>12.1f}"
                    f"{_rss_mb():>9.0f}",
                    flush=True,
                )
        finally:
            stop.set()
            producer.join()
            query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
