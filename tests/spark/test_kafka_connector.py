"""The tests' Kafka broker (riverbed.testing.kafkaserver) and Spark's own Kafka connector on
riverbed's Spark sessions (``spark-sql-kafka-0-10`` from the jar cache): what a Kafka
client wrote, Spark reads — in a batch query and in a streaming one."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from riverbed.testing import KafkaServer
from tests.stream.test_kafka_sink import topic_ends

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    # idempotent: a retried batch (a slow broker, a partition whose leader is not known
    # yet) keeps its place in the partition — without it librdkafka may reorder on retry
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for i in range(n):
        value = json.dumps({"i": i, "k": i % 7})
        producer.produce(topic, key=str(i % 7), value=value, partition=i % 3)
    assert producer.flush(30) == 0


def _read_back(bootstrap: str, topic: str, n: int) -> dict[int, list[int]]:
    """Every record's ``i`` by partition, in offset order, read by a Kafka consumer
    assigned each partition from its start to its end (no group, no rebalance)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    deadline = time.monotonic() + 60
    while True:  # just after a restart a partition may not have its leader yet
        try:
            ends = topic_ends(bootstrap, topic, "read_committed")  # the client's default
            break
        except KafkaException as exc:
            assert time.monotonic() < deadline, f"no leader for a partition in 60 s: {exc}"
            time.sleep(0.5)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readback"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    found: dict[int, list[int]] = {p: [] for p in ends if ends[p] > 0}
    try:
        while sum(map(len, found.values())) < sum(ends.values()):
            message = consumer.poll(10)
            assert message is not None, f"read {found} of {ends}: the broker went quiet"
            if message.error():
                continue
            found[message.partition()].append(json.loads(message.value())["i"])
    finally:
        consumer.close()
    assert sum(ends.values()) == n, f"the topic holds {ends}, not {n} records"
    return found


def test_the_broker_starts_and_keeps_acknowledged_records_across_a_restart(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    assert kafka_server.ready_after < 60
    kafka_server.create_topic(kafka_topic, partitions=3)
    _produce(kafka_server.bootstrap, kafka_topic, 300)
    kafka_server.restart()
    found = _read_back(kafka_server.bootstrap, kafka_topic, 300)
    assert sorted(i for part in found.values() for i in part) == list(range(300))
    assert len(found) == 3 and all(part == sorted(part) for part in found.values())


@pytest.mark.spark
def test_sparks_own_kafka_source_reads_what_a_kafka_client_wrote(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any
) -> None:
    kafka_server.create_topic(kafka_topic, partitions=3)
    _produce(kafka_server.bootstrap, kafka_topic, 1000)
    expected = _read_back(kafka_server.bootstrap, kafka_topic, 1000)
    options = {"kafka.bootstrap.servers": kafka_server.bootstrap, "subscribe": kafka_topic}
    rows = spark.read.format("kafka").options(**options).load().collect()
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append((row.offset, json.loads(row.value)["i"]))
    assert {p: [i for _, i in sorted(v)] for p, v in by_partition.items()} == expected

    name = f"kafka_{kafka_topic.replace('-', '_')}"
    query = (
        spark.readStream.format("kafka")
        .options(**options, startingOffsets="earliest")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    streamed = spark.sql(f"SELECT partition, count(*) AS n FROM {name} GROUP BY partition")
    assert {r.partition: r.n for r in streamed.collect()} == {
        p: len(v) for p, v in expected.items()
    }
