"""A Kafka cluster read as a riverbed log (riverbed.log.kafkalog), against a real broker:
offsets, slices as columns, transaction markers and aborted records, clear errors."""

from __future__ import annotations

import time

import pytest

import riverbed.log
from riverbed.log import LogError
from riverbed.testing import KafkaServer
from tests.jobs.cluster import until

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, n: int, partitions: int) -> list[tuple[int, bytes]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    sent = []
    for i in range(n):
        value = f'{{"i": {i}}}'.encode()
        producer.produce(topic, key=f"k{i % 5}".encode(), value=value, partition=i % partitions,
                         timestamp=1_700_000_000_000 + i)  # fmt: skip
        sent.append((i % partitions, value))
    assert producer.flush(30) == 0
    return sent


def test_a_topics_partitions_read_as_slices_of_columns(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    kafka_server.create_topic(kafka_topic, partitions=2)
    sent = _produce(kafka_server.bootstrap, kafka_topic, 300, 2)
    log = riverbed.log.open(f"kafka://{kafka_server.bootstrap}?serde=json")
    try:
        config = log.topic(kafka_topic)
        assert (config.partitions, config.serde, config.partitioner) == (2, "json", "kafka")
        assert [(o.partition, o.start, o.end) for o in log.offsets(kafka_topic)] == [
            (0, 0, 150),
            (1, 0, 150),
        ]
        columns = log.storage.read_columns(kafka_topic, 1, 20, 70)
        want = [v for p, v in sent if p == 1][20:70]
        assert columns.values.to_pylist() == want
        assert columns.offsets.tolist() == list(range(20, 70))
        assert columns.keys.to_pylist()[0] == f"k{(20 * 2 + 1) % 5}".encode()
        assert columns.timestamps_ms.tolist()[0] == 1_700_000_000_000 + 20 * 2 + 1
        assert len(log.storage.read_columns(kafka_topic, 0, 150, 150)) == 0
        # past the end: what is there, at once; then on from where it ended (the same
        # assignment), and from elsewhere again
        began = time.monotonic()
        tail = log.storage.read_columns(kafka_topic, 0, 140, 400)
        assert tail.offsets.tolist() == list(range(140, 150))
        assert time.monotonic() - began < 10
        parts = [log.storage.read_columns(kafka_topic, 1, a, a + 25) for a in (0, 25, 50)]
        assert [int(o) for c in parts for o in c.offsets] == list(range(75))
        assert log.storage.read_columns(kafka_topic, 1, 10, 12).offsets.tolist() == [10, 11]
        # partitions read in turns by one thread (a co-located task and the pieces it
        # helps with): each goes on where its last read ended, none mixes in the other's
        turns = [(0, 0, 30), (1, 100, 130), (0, 30, 60), (1, 130, 150), (0, 60, 61), (1, 5, 8)]
        for p, a, b in turns:
            got = log.storage.read_columns(kafka_topic, p, a, b)
            assert got.offsets.tolist() == list(range(a, b))
            assert got.values.to_pylist() == [v for q, v in sent if q == p][a:b]
        records = log.read(kafka_topic, 0, 148, 10)  # to the end: two
        assert [(r.offset, r.value) for r in records] == [(148, {"i": 296}), (149, {"i": 298})]
        with pytest.raises(LogError, match="read-only"):
            log.producer(kafka_topic).send({"i": 1})
        with pytest.raises(LogError, match="read-only"):
            log.create_topic("other", 1)
        with pytest.raises(LogError, match=r"Kafka topic 'nope' does not exist"):
            log.topic("nope")
    finally:
        log.close()


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_transaction_markers_and_aborted_records_are_passed_over(
    kafka_server: KafkaServer, kafka_topic: str, isolation: str
) -> None:
    """Offsets Kafka never hands out — a transaction's commit or abort marker, and
    aborted records under read_committed — are skipped, also at a slice's end: the
    read ends instead of waiting for them."""
    from confluent_kafka import Producer

    kafka_server.create_topic(kafka_topic, partitions=1)
    producer = Producer(
        {"bootstrap.servers": kafka_server.bootstrap, "transactional.id": kafka_topic}
    )
    producer.init_transactions()
    for round_ in range(3):  # offsets 0-4 + marker 5, 6-10 aborted + 11, 12-16 + 17
        producer.begin_transaction()
        for i in range(5):
            producer.produce(kafka_topic, value=f"{round_}-{i}".encode(), partition=0)
        if round_ == 1:
            producer.flush(30)  # on the broker, then aborted (unsent ones would be purged)
            producer.abort_transaction()
        else:
            producer.commit_transaction()
    log = riverbed.log.open(
        f"kafka://{kafka_server.bootstrap}", kafka={"isolation.level": isolation}
    )
    try:
        # commit_transaction returns once the coordinator has logged the commit; it
        # writes the partition's marker (offset 17) after that (Kafka's EndTxn does not
        # wait for markers, KAFKA-10073): until then the end is 12 (read_committed: the
        # open transaction's first offset) or 17
        until(lambda: log.storage.offsets(kafka_topic, 0) == (0, 18), 30, "the last marker")
        began = time.monotonic()
        columns = log.storage.read_columns(kafka_topic, 0, 0, 18)
        assert time.monotonic() - began < 10, "the read waited for offsets never handed out"
        aborted = list(range(6, 11))
        kept = [o for o in range(18) if o not in (5, 11, 17)]
        if isolation == "read_committed":
            kept = [o for o in kept if o not in aborted]
        assert columns.offsets.tolist() == kept
        assert columns.values.to_pylist()[0] == b"0-0"
    finally:
        log.close()


def test_a_slice_deleted_by_retention_is_out_of_range(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from riverbed.log import OffsetOutOfRangeError

    kafka_server.create_topic(kafka_topic, partitions=1)
    _produce(kafka_server.bootstrap, kafka_topic, 40, 1)
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    for future in admin.delete_records([TopicPartition(kafka_topic, 0, 30)]).values():
        future.result(timeout=30)
    log = riverbed.log.open(f"kafka://{kafka_server.bootstrap}")
    try:
        assert log.storage.offsets(kafka_topic, 0) == (30, 40)
        with pytest.raises(OffsetOutOfRangeError, match=r"was deleted .*the oldest kept is 30"):
            log.storage.read_columns(kafka_topic, 0, 10, 35)
        assert log.storage.read_columns(kafka_topic, 0, 30, 35).offsets.tolist() == list(
            range(30, 35)
        )
    finally:
        log.close()


def test_a_wrong_address_is_one_line_at_once() -> None:
    from riverbed.testing import free_port

    log = riverbed.log.open(f"kafka://127.0.0.1:{free_port()}")
    log.storage.timeout = 2.0
    began = time.monotonic()
    try:
        with pytest.raises(LogError, match=r"no Kafka broker at 127\.0\.0\.1:\d+ answered"):
            log.topic("t")
    finally:
        log.close()
    assert time.monotonic() - began < 15
    with pytest.raises(LogError, match="Kafka client settings are for kafka:// logs"):
        riverbed.log.open("memory://", kafka={"security.protocol": "SSL"})
