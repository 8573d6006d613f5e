"""riverbed's log against an Apache Kafka broker, same machine, same run, same records.

    .venv/bin/python benchmarks/log_vs_kafka.py [--records 300000] [--sends 300]

Records of 100 bytes, one partition, one producer and one consumer; the broker is the
tests' (``riverbed.testing.KafkaServer``: Kafka 4.4.0, KRaft, one node, 512 MB heap)
and its client is ``confluent-kafka`` (librdkafka), ``acks=all``. Both sides run on the
same 2 cores as the client.

* **produce**: riverbed ``send_batch(1000)`` (the call returns when the batch is in
  the log) on local files and over a ``riverbed log serve`` (``flight://``); Kafka
  ``produce()`` of every record then ``flush()`` (librdkafka batches up to 1,000
  records, ``linger.ms=5``, and keeps up to 5 requests in flight). Each durability
  level is compared with its like: riverbed ``fsync="never"`` (the OS writes back)
  with Kafka's default (no fsync: Kafka leaves it to the page cache and replication),
  and riverbed ``fsync="batch"`` (an fsync per appended batch) with a Kafka topic set
  to ``flush.messages=1`` (an fsync after every append to the partition).
* **consume**: riverbed ``read_columns`` (the Arrow read the Spark source and the
  stream engine use) and ``Log.read`` (records as objects), vs a Kafka consumer's
  ``consume(10000)`` from the earliest offset (values as bytes, not decoded).
* **latency**: a record's trip from before ``send`` to a consumer returning it,
  p50/p99 over single-record sends 10 ms apart: a riverbed group consumer of local
  files (woken by the kernel: inotify on the partition directory), through the log
  server (it wakes on the append), and a Kafka consumer (``fetch.wait.max.ms`` 100:
  the broker answers a fetch as soon as a record arrives; Nagle off and
  ``linger.ms=0`` on both Kafka clients).

Ratios are riverbed / Kafka: above 1.0x is riverbed faster (for latency, below 1.0x is
riverbed faster).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import riverbed.log
from riverbed.control import connect
from riverbed.testing import KafkaServer, log_server_process

RECORD = 100  # bytes, as benchmarks/log.py


def payloads(n: int) -> list[bytes]:
    """``n`` incompressible values (64 distinct, cycled)."""
    import os

    base = os.urandom(RECORD * 64)
    return [base[(i % 64) * RECORD : (i % 64 + 1) * RECORD] for i in range(n)]


def make_topics(url: str) -> None:
    """Topics ``never`` and ``batch``: bytes, one partition, fsync never / each batch;
    and ``warm``, for a first call that pays the one-off costs (a server's first
    request, imports) before anything is timed."""
    log = riverbed.log.open(url)
    for fsync in ("never", "batch"):
        log.create_topic(fsync, 1, serde="bytes", fsync=fsync)  # type: ignore[arg-type]
    log.create_topic("warm", 1, serde="bytes", fsync="never")
    log.close()


def riverbed_produce(url: str, values: list[bytes], topic: str) -> float:
    log = riverbed.log.open(url)
    producer = log.producer(topic)
    log.storage.offsets(topic, 0)  # connected / files found before the clock starts
    start = time.perf_counter()
    for i in range(0, len(values), 1000):
        producer.send_batch(values[i : i + 1000])
    rate = len(values) / (time.perf_counter() - start)
    log.close()
    return rate


def riverbed_columns(url: str, n: int, topic: str) -> float:
    log = riverbed.log.open(url)
    log.storage.offsets(topic, 0)  # connected / files found before the clock starts
    start = time.perf_counter()
    count = 0
    for offset in range(0, n, 50_000):
        count += len(log.storage.read_columns(topic, 0, offset, min(offset + 50_000, n)))
    rate = n / (time.perf_counter() - start)
    log.close()
    assert count == n, (count, n)
    return rate


def riverbed_read(url: str, n: int, topic: str) -> float:
    log = riverbed.log.open(url)
    log.storage.offsets(topic, 0)
    start = time.perf_counter()
    count, offset = 0, 0
    while count < n:
        records = log.read(topic, 0, offset, 5000)
        assert records, (count, n)
        count += len(records)
        offset = records[-1].offset + 1
    rate = n / (time.perf_counter() - start)
    log.close()
    return rate


def kafka_produce(bootstrap: str, values: list[bytes], topic: str) -> float:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 1000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    producer.produce(topic, value=b"warm")  # metadata fetched before the clock starts
    producer.flush(30)
    start = time.perf_counter()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    left = producer.flush(120)
    rate = len(values) / (time.perf_counter() - start)
    assert left == 0, f"{left} records not acknowledged"
    return rate


def kafka_consume(bootstrap: str, n: int, topic: str) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    consumer.consume(1, timeout=10)  # connected, fetching, the warm-up record read
    start = time.perf_counter()
    count = 0
    while count < n:
        messages = consumer.consume(10_000, timeout=10)
        assert messages, (count, n)
        count += sum(1 for m in messages if m.error() is None)
    rate = n / (time.perf_counter() - start)
    consumer.close()
    return rate


def create_kafka_topic(server: KafkaServer, name: str, config: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, config=config)]).values():
        future.result(30)


def latencies(
    send: Callable[[int], None], receive: Callable[[], list[int]], sends: int
) -> list[float]:
    """Seconds from before ``send(i)`` to ``receive()`` returning ``i``, sorted."""
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}

    def consume() -> None:
        deadline = time.monotonic() + 60 + sends * 0.05
        while len(seen) < sends and time.monotonic() < deadline:
            for i in receive():
                seen.setdefault(i, time.perf_counter())

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(1.0)  # the consumer is fetching
    for i in range(sends):
        sent[i] = time.perf_counter()
        send(i)
        time.sleep(0.01)
    reader.join()
    assert len(seen) == sends, f"{sends - len(seen)} records never arrived"
    return sorted(seen[i] - sent[i] for i in range(sends))


def riverbed_latency(url: str, sends: int) -> list[float]:
    log = riverbed.log.open(url)
    log.create_topic("lat", 1)
    cp = connect("memory://")
    producer = log.producer("lat")
    try:
        with log.consumer(cp, "lat", "lat") as consumer:
            consumer.poll(timeout=0.5)  # joined, owns the partition
            return latencies(
                lambda i: producer.send({"i": i}),
                lambda: [r.value["i"] for r in consumer.poll(timeout=0.5)],
                sends,
            )
    finally:
        log.close()


def kafka_latency(server: KafkaServer, sends: int) -> list[float]:
    import json

    from confluent_kafka import Consumer, Producer, TopicPartition

    create_kafka_topic(server, "lat", {})
    producer = Producer(
        {
            "bootstrap.servers": server.bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "socket.nagle.disable": True,  # Kafka's low-latency settings
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": "lat",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "socket.nagle.disable": True,
        }
    )
    consumer.assign([TopicPartition("lat", 0, 0)])

    def send(i: int) -> None:
        producer.produce("lat", value=json.dumps({"i": i}), partition=0)
        producer.poll(0)

    def receive() -> list[int]:  # one at a time: consume(n) would wait to gather n
        m = consumer.poll(0.5)
        return [json.loads(m.value())["i"]] if m and m.error() is None and m.value() else []

    try:
        return latencies(send, receive, sends)
    finally:
        producer.flush(10)
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--sends", type=int, default=300, help="for the latency")
    args = parser.parse_args()
    values = payloads(args.records)
    n = len(values)
    rows: list[tuple[str, float, float]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        KafkaServer(Path(tmp) / "kafka", heap="512m") as kafka,
    ):
        root = Path(tmp)
        files, served = f"file://{root / 'log'}", f"file://{root / 'served'}"
        make_topics(files)
        make_topics(served)
        with log_server_process(served) as flight:
            create_kafka_topic(kafka, "nofsync", {})
            create_kafka_topic(kafka, "fsync", {"flush.messages": "1"})
            kafka_rate = {
                "never": kafka_produce(kafka.bootstrap, values, "nofsync"),
                "batch": kafka_produce(kafka.bootstrap, values, "fsync"),
            }
            where = {"files": files, "log server": flight}
            for url in where.values():
                riverbed_produce(url, values[:2000], "warm")
                riverbed_columns(url, 2000, "warm")
            for fsync, label in (("never", "no fsync"), ("batch", "fsync each batch")):
                for side, url in where.items():
                    mine = riverbed_produce(url, values, fsync)
                    rows.append((f"produce, {label}: {side}", mine, kafka_rate[fsync]))
            k_consume = kafka_consume(kafka.bootstrap, n, "nofsync")
            for side, url in where.items():
                mine = riverbed_columns(url, n, "never")
                rows.append((f"consume read_columns: {side}", mine, k_consume))
            mine = riverbed_read(files, n, "never")
            rows.append(("consume Log.read (records): files", mine, k_consume))
            lat: dict[str, list[float]] = {
                "riverbed files (inotify)": riverbed_latency(f"file://{root / 'lat'}", args.sends),
                "riverbed log server (woken)": riverbed_latency(flight, args.sends),
            }
            lat["Kafka (acks=all)"] = kafka_latency(kafka, args.sends)
    print(f"{n:,} records of {RECORD} bytes, one partition; Kafka 4.4.0, one broker, acks=all")
    print(f"{'path':40} {'riverbed rec/s':>15} {'Kafka rec/s':>12} {'riverbed/Kafka':>15}")
    for name, mine, theirs in rows:
        print(f"{name:40} {mine:15,.0f} {theirs:12,.0f} {mine / theirs:14.2f}x")
    print(f"\nproduce -> consume, {args.sends} single-record sends 10 ms apart")
    kafka_p99 = pct(lat["Kafka (acks=all)"], 0.99)
    for name, waits in lat.items():
        p50, p99 = pct(waits, 0.5), pct(waits, 0.99)
        print(
            f"{name:40} p50 {p50 * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"
            f"   p99 vs Kafka {p99 / kafka_p99:5.2f}x"
        )


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


if __name__ == "__main__":
    main()
