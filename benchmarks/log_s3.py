"""Diskless topics (records in S3, offsets in etcd) beside the file-backed log and bare
Arrow Flight, same machine, same run.

    .venv/bin/python benchmarks/log_s3.py [--sends 300] [--records 200000]

The S3 server is the tests' Ceph RGW (``riverbed.testing.CephS3Server``: objects on
this disk), the control plane the tests' one-node etcd; everything shares the same
2 cores.

* **produce latency**: single-record ``send`` calls 10 ms apart, each timed until it
  returns (acknowledged: for diskless topics, in the bucket *and* its offsets committed
  in etcd), p50/p99: the file log (fsync per batch), diskless in this process
  (``s3://``, flush every 50 ms), diskless through a ``riverbed log serve --store
  s3://`` (``flight://``), and bare Arrow Flight (a ``do_put`` of the same record to a
  server that only acknowledges it: the network and RPC floor).
* **end to end**: from before ``send`` to a reader that waits on the partition
  (``LogStorage.wait``) returning the record, p50/p99, for the same paths.
* **PUTs per second**: objects written per second by one diskless writer while 8
  threads send as fast as they can — bounded by 1 / flush interval (the cost bound).
* **throughput**: one producer, ``send_batch`` of 1,000 and of 10,000 records, diskless
  vs the file log.
* **consumer CPU**: CPU seconds of this (client) process per record to read 200,000
  records through a log server of diskless topics, vs a bare Flight ``do_get`` of the
  same Arrow batches (each the best of 7 reads).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

import riverbed.log
from riverbed.log.diskless import FLUSH_MS
from riverbed.testing import CephS3Server, EtcdCluster
from riverbed.testing.logserver import RIVERBED

RECORD = 100

BARE_SERVER = """
import sys
import pyarrow as pa
import pyarrow.flight as flight

class Bare(flight.FlightServerBase):
    def __init__(self, table):
        super().__init__("grpc+tcp://127.0.0.1:0")
        self.table = table
    def do_put(self, context, descriptor, reader, writer):
        for chunk in reader:
            writer.write(pa.py_buffer(b"ok"))
    def do_get(self, context, ticket):
        return flight.RecordBatchStream(self.table)

n = int(sys.argv[1])
values = pa.array([b"x" * 100] * n, pa.binary())
zeros = pa.array([0] * n, pa.int64())
table = pa.table({"offset": pa.array(range(n), pa.int64()), "timestamp": zeros,
                  "key": pa.array([None] * n, pa.binary()), "value": values})
server = Bare(table.combine_chunks())
print(server.port, flush=True)
server.serve()
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def produce_latency(log: riverbed.log.Log, topic: str, sends: int) -> list[float]:
    producer = log.producer(topic)
    producer.send(b"warm")
    out = []
    for _ in range(sends):
        start = time.perf_counter()
        producer.send(b"x" * RECORD)
        out.append(time.perf_counter() - start)
        time.sleep(0.01)
    return out


def end_to_end(
    writer: riverbed.log.Log, reader: riverbed.log.Log, topic: str, sends: int
) -> list[float]:
    """Seconds from before ``send`` to a waiting reader returning the record."""
    producer = writer.producer(topic)
    seen: dict[int, float] = {}
    start_at = reader.offsets(topic)[0].end
    done = threading.Event()

    def read() -> None:
        at = start_at
        while not done.is_set():
            if reader.storage.wait({(topic, 0): at}, 1.0):
                for record in reader.read(topic, 0, at, 1000):
                    seen[record.offset - start_at] = time.perf_counter()
                    at = record.offset + 1

    thread = threading.Thread(target=read)
    thread.start()
    time.sleep(0.5)
    sent = []
    for _ in range(sends):
        sent.append(time.perf_counter())
        producer.send(b"x" * RECORD)
        time.sleep(0.01)
    deadline = time.monotonic() + 30
    while len(seen) < sends and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    thread.join()
    assert len(seen) == sends, f"{sends - len(seen)} records never arrived"
    return [seen[i] - sent[i] for i in range(sends)]


def bare_put_latency(port: int, sends: int) -> list[float]:
    client = flight.connect(f"grpc+tcp://127.0.0.1:{port}")
    batch = pa.record_batch({"value": pa.array([b"x" * RECORD], pa.binary())})
    out = []
    for _ in range(sends + 1):
        start = time.perf_counter()
        writer, acks = client.do_put(flight.FlightDescriptor.for_command(b"t"), batch.schema)
        writer.write_batch(batch)
        writer.done_writing()
        acks.read()
        writer.close()
        out.append(time.perf_counter() - start)
        time.sleep(0.01)
    client.close()
    return out[1:]


def throughput(log: riverbed.log.Log, topic: str, batch: int, total: int) -> float:
    producer = log.producer(topic)
    values = [b"x" * RECORD] * batch
    producer.send_batch(values)  # warm
    start = time.perf_counter()
    for _ in range(total // batch):
        producer.send_batch(values)
    return total / (time.perf_counter() - start)


def throughput_in_flight(log: riverbed.log.Log, topic: str, batch: int, total: int) -> float:
    """One producer keeping up to 32 ``send_batch_async`` calls in flight."""
    producer = log.producer(topic)
    values = [b"x" * RECORD] * batch
    producer.send_batch(values)  # warm
    start = time.perf_counter()
    flying: list[Any] = []
    for _ in range(total // batch):
        flying.append(producer.send_batch_async(values))
        if len(flying) >= 32:
            flying.pop(0).result()
    for f in flying:
        f.result()
    return total / (time.perf_counter() - start)


def puts_per_second(log: riverbed.log.Log, topic: str, seconds: float) -> tuple[float, float]:
    """(objects/s, records/s) of one diskless writer under 8 threads sending records."""
    storage = log.storage
    before = storage.stats["objects"]  # type: ignore[attr-defined]
    stop = time.monotonic() + seconds
    sent = [0] * 8

    def send(n: int) -> None:
        producer = log.producer(topic)
        while time.monotonic() < stop:
            producer.send(b"x" * RECORD, key=str(n))
            sent[n] += 1

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    objects = storage.stats["objects"] - before  # type: ignore[attr-defined]
    return objects / elapsed, sum(sent) / elapsed


def cpu_per_record(read: Callable[[], int], rounds: int = 7) -> float:
    """CPU seconds of this process per record read, the best of ``rounds`` reads after a
    warm-up (one read of 20 MB is a few tens of ms: a single one swings with the
    allocator's first touches and gRPC's threads)."""
    read()  # warm: connections, imports, caches
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        n = read()
        best = min(best, (time.process_time() - start) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sends", type=int, default=300)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also: produce latency and PUTs/s at flush intervals of 5 to 250 ms",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, CephS3Server() as s3, EtcdCluster(1) as etcd:
        root = Path(tmp)
        s3.create_bucket("bench")
        os.environ.update(s3.env())
        store = "s3://bench/log"
        files = riverbed.log.open(f"file://{root / 'files'}")
        diskless = riverbed.log.open(store, control=etcd.url)
        for log in (files, diskless):
            log.create_topic("lat", 1, serde="bytes")
            log.create_topic("e2e", 1, serde="bytes")
            log.create_topic("bulk", 1, serde="bytes")
            log.create_topic("many", 8, serde="bytes")
            log.create_topic("read", 1, serde="bytes")
        env = {**os.environ, "RIVERBED_CONTROL": etcd.url}
        server = subprocess.Popen(
            [RIVERBED, "log", "serve", "--store", store, "--port", "0"],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        bare = subprocess.Popen(
            [sys.executable, "-c", BARE_SERVER, str(args.records)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and bare.stdout is not None
            served_url = server.stdout.readline().split(" at ")[1].split()[0]
            bare_port = int(bare.stdout.readline())
            served = riverbed.log.open(served_url)
            lat = {
                "file log (fsync each batch)": produce_latency(files, "lat", args.sends),
                "diskless, in process (s3://)": produce_latency(diskless, "lat", args.sends),
                "diskless, log server (flight://)": produce_latency(served, "lat", args.sends),
                "bare Arrow Flight do_put": bare_put_latency(bare_port, args.sends),
            }
            e2e = {
                "file log": end_to_end(files, files, "e2e", args.sends),
                "diskless, in process": end_to_end(diskless, diskless, "e2e", args.sends),
                "diskless, log server": end_to_end(served, served, "e2e", args.sends),
            }
            puts, rate = puts_per_second(diskless, "many", 10)
            tput = {
                batch: (
                    throughput(files, "bulk", batch, 100_000),
                    throughput(diskless, "bulk", batch, 100_000),
                )
                for batch in (1000, 10_000)
            }
            in_flight = {
                batch: (
                    throughput_in_flight(files, "bulk", batch, 100_000),
                    throughput_in_flight(diskless, "bulk", batch, 100_000),
                )
                for batch in (1000,)
            }
            diskless.producer("read").send_batch([b"x" * RECORD] * args.records)

            def served_read() -> int:
                return len(served.storage.read_columns("read", 0, 0, args.records))

            def bare_read() -> int:
                client = flight.connect(f"grpc+tcp://127.0.0.1:{bare_port}")
                table = client.do_get(flight.Ticket(b"all")).read_all()
                client.close()
                return int(table.num_rows)

            cpu = cpu_per_record(served_read), cpu_per_record(bare_read)
            served.close()
            sweep = {}
            for flush_ms in (5, 20, 50, 100, 250) if args.sweep else ():
                log = riverbed.log.open(f"{store}-{flush_ms}", control=etcd.url, flush_ms=flush_ms)
                log.create_topic("lat", 1, serde="bytes")
                log.create_topic("many", 8, serde="bytes")
                waits = produce_latency(log, "lat", min(args.sends, 150))
                sweep[flush_ms] = (
                    pct(waits, 0.5),
                    pct(waits, 0.99),
                    *puts_per_second(log, "many", 5),
                )
                log.close()
        finally:
            server.kill()
            bare.kill()
            files.close()
            diskless.close()
    print(f"diskless topics on Ceph RGW + etcd (flush every {FLUSH_MS} ms), 100-byte records")
    print(f"\nproduce latency, {args.sends} single-record sends 10 ms apart")
    for name, values in lat.items():
        print(
            f"  {name:36} p50 {pct(values, 0.5) * 1000:7.1f} ms   "
            f"p99 {pct(values, 0.99) * 1000:7.1f} ms"
        )
    print("  goal: diskless p99 <= 120 ms")
    print("\nend to end (send -> a waiting reader has it)")
    for name, values in e2e.items():
        print(
            f"  {name:36} p50 {pct(values, 0.5) * 1000:7.1f} ms   "
            f"p99 {pct(values, 0.99) * 1000:7.1f} ms"
        )
    print("  goal: diskless p99 <= 250 ms")
    print(
        f"\nPUTs: {puts:.1f} objects/s from one writer under 8 sending threads "
        f"({rate:,.0f} records/s); bound 1/flush = {1000 / FLUSH_MS:.0f}/s"
    )
    print("\none producer, send_batch, 100,000 records")
    for batch, (f, d) in tput.items():
        print(
            f"  batches of {batch:>6,}: file {f:10,.0f} rec/s   diskless {d:10,.0f} rec/s   "
            f"diskless/file {d / f:5.2f}x   (goal >= 0.5x)"
        )
    for batch, (f, d) in in_flight.items():
        print(
            f"  batches of {batch:>6,}, 32 in flight (send_batch_async): file {f:10,.0f} rec/s   "
            f"diskless {d:10,.0f} rec/s   diskless/file {d / f:5.2f}x   (goal >= 0.5x)"
        )
    if sweep:
        print("\nflush interval: one producer's latency; 8 sending threads' PUTs and records")
        for flush_ms, (p50, p99, puts_s, rate_s) in sweep.items():
            print(
                f"  {flush_ms:4} ms   p50 {p50 * 1000:6.1f} ms   p99 {p99 * 1000:6.1f} ms   "
                f"{puts_s:5.1f} PUT/s   {rate_s:6,.0f} rec/s"
            )
    print(
        f"\nconsumer CPU per record ({args.records:,} records): log server of diskless "
        f"topics {cpu[0] * 1e6:.2f} us, bare Flight {cpu[1] * 1e6:.2f} us: "
        f"{cpu[0] / cpu[1]:.2f}x (goal <= 1.5x)"
    )


if __name__ == "__main__":
    main()
