"""Event-log throughput for 100-byte records, against the raw disk in the same run.

    .venv/bin/python benchmarks/log.py [--records 300000]

Baseline: the same payload bytes written with plain buffered file writes (one
fsync at the end) and read back in 1 MB chunks — what the disk and page cache give
a process that does nothing else. riverbed rows:

* produce, per-record API (``send``: one append, one lock, one write per record);
* produce, batch API (``send_batch`` of 1,000), fsync never / fsync every batch;
* consume with ``Log.read`` (sequential scan) and with a consumer group (``poll``,
  memory control plane, commits every poll).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import riverbed.log
from riverbed.control import connect

RECORD = 100


def payloads(n: int) -> list[bytes]:
    base = os.urandom(RECORD * 64)
    return [base[(i % 64) * RECORD : (i % 64 + 1) * RECORD] for i in range(n)]


def raw_disk(root: Path, values: list[bytes]) -> tuple[float, float]:
    path = root / "raw.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for value in values:
            f.write(value)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    read_s = time.perf_counter() - start
    return len(values) / write_s, len(values) / read_s


def produce_per_record(root: Path, values: list[bytes]) -> float:
    log = riverbed.log.open(root / "per-record")
    log.create_topic("t", 1, serde="bytes", fsync="never")
    producer = log.producer("t")
    start = time.perf_counter()
    for value in values:
        producer.send(value)
    rate = len(values) / (time.perf_counter() - start)
    log.close()
    return rate


def produce_batches(root: Path, values: list[bytes], fsync: str) -> tuple[float, riverbed.log.Log]:
    log = riverbed.log.open(root / f"batch-{fsync}")
    log.create_topic("t", 1, serde="bytes", fsync=fsync)  # type: ignore[arg-type]
    producer = log.producer("t")
    start = time.perf_counter()
    for i in range(0, len(values), 1000):
        producer.send_batch(values[i : i + 1000])
    return len(values) / (time.perf_counter() - start), log


def consume_read(log: riverbed.log.Log, n: int) -> float:
    start = time.perf_counter()
    count, offset = 0, 0
    while True:
        records = log.read("t", 0, offset, 5000)
        if not records:
            break
        count += len(records)
        offset = records[-1].offset + 1
    assert count == n
    return n / (time.perf_counter() - start)


def consume_columns(log: riverbed.log.Log, n: int) -> float:
    """The columnar read the Spark source and the stream engine use (Arrow arrays)."""
    start = time.perf_counter()
    count = 0
    for offset in range(0, n, 50_000):
        count += len(log.storage.read_columns("t", 0, offset, min(offset + 50_000, n)))
    assert count == n
    return n / (time.perf_counter() - start)


def consume_group(log: riverbed.log.Log, n: int) -> float:
    cp = connect("memory://")
    start = time.perf_counter()
    count = 0
    with log.consumer(cp, "bench", "t", session_ttl=10) as consumer:
        while count < n:
            count += len(consumer.poll(timeout=1.0, max_records=5000))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--per-record", type=int, default=30_000)
    args = parser.parse_args()
    values = payloads(args.records)
    mb = RECORD / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw_w, raw_r = raw_disk(root, values)
        rows = [
            ("raw buffered write (baseline)", raw_w, raw_w),
            ("raw sequential read (baseline)", raw_r, raw_r),
        ]
        rows.append(
            (
                "produce send() per record",
                produce_per_record(root, values[: args.per_record]),
                raw_w,
            )
        )
        rate, log_never = produce_batches(root, values, "never")
        rows.append(("produce send_batch(1000), fsync never", rate, raw_w))
        rate, log_batch = produce_batches(root, values, "batch")
        rows.append(("produce send_batch(1000), fsync batch", rate, raw_w))
        rows.append(("consume Log.read", consume_read(log_never, args.records), raw_r))
        rows.append(
            ("consume storage.read_columns", consume_columns(log_never, args.records), raw_r)
        )
        rows.append(("consume group poll()", consume_group(log_never, args.records), raw_r))
        log_never.close()
        log_batch.close()
    print(f"{'path':40} {'records/s':>12} {'MB/s':>8} {'vs baseline':>12}")
    for name, rate, base in rows:
        print(f"{name:40} {rate:12,.0f} {rate * mb:8.1f} {rate / base:11.3f}x")


if __name__ == "__main__":
    main()
