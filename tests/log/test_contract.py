"""The log contract, on memory and file storage."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from riverbed.log import Log, LogError, SerdeError, TopicExistsError, TopicNotFoundError
from riverbed.log.partitioners import KeyHashPartitioner


def test_topics_remember_their_configuration(log: Log) -> None:
    log.create_topic("events", 4, partitioner="round-robin", serde="msgpack")
    config = log.topic("events")
    assert (config.partitions, config.partitioner, config.serde) == (4, "round-robin", "msgpack")
    assert log.topics() == ["events"]
    with pytest.raises(TopicExistsError):
        log.create_topic("events", 1)
    with pytest.raises(TopicNotFoundError, match="riverbed topic create nope"):
        log.producer("nope")


def test_records_keep_key_value_time_headers_and_get_offsets(log: Log) -> None:
    log.create_topic("t", 1)
    ts = datetime(2026, 11, 21, 10, 30, tzinfo=UTC)
    producer = log.producer("t")
    first = producer.send({"a": 1}, key="k1", timestamp=ts, headers={"h": b"v"})
    second = producer.send([1, 2], key=b"k2")
    assert (first.partition, first.offset, second.offset) == (0, 0, 1)
    records = log.read("t", 0)
    assert [r.value for r in records] == [{"a": 1}, [1, 2]]
    assert records[0].key == b"k1" and records[0].timestamp == ts
    assert records[0].headers == {"h": b"v"} and records[1].headers == {}
    with pytest.raises(ValueError, match="naive"):
        producer.send(1, timestamp=datetime(2026, 1, 1))  # noqa: DTZ001


def test_key_hash_is_stable_and_keeps_a_key_on_one_partition(log: Log) -> None:
    # CRC32, not hash(): this mapping must never change between versions
    assert [KeyHashPartitioner().partition(k, 8) for k in (b"user-1", b"user-2", b"x")] == [4, 6, 3]
    log.create_topic("t", 8)
    metas = log.producer("t").send_batch(
        [{"u": f"user-{i % 10}"} for i in range(200)], key_field="u"
    )
    by_key: dict[str, set[int]] = {}
    for i, meta in enumerate(metas):
        by_key.setdefault(f"user-{i % 10}", set()).add(meta.partition)
    assert all(len(parts) == 1 for parts in by_key.values())


def test_round_robin_spreads_evenly(log: Log) -> None:
    log.create_topic("t", 4, partitioner="round-robin")
    metas = log.producer("t").send_batch(list(range(400)))
    counts = [sum(1 for m in metas if m.partition == p) for p in range(4)]
    assert counts == [100, 100, 100, 100]


def test_bytes_and_typed_tables_sent_as_columns_read_back_as_sent(log: Log) -> None:
    """The producer's columnar paths (a list of bytes on a bytes topic, an Arrow table
    of a typed topic's types keyed by a column) on every storage: each record where
    its coordinates say, with its key and value."""
    import pyarrow as pa

    log.create_topic("raw", 3, serde="bytes")
    values = [bytes([i % 256]) * (i % 7) for i in range(50)]
    metas = log.producer("raw").send_batch(values)
    assert sorted((m.partition, m.offset) for m in metas) == sorted(
        (p, o) for p in range(3) for o in range(sum(1 for m in metas if m.partition == p))
    )
    for meta, value in zip(metas, values, strict=True):
        (record,) = log.read("raw", meta.partition, meta.offset, 1)
        assert (record.key, record.value) == (None, value)
    log.create_topic("typed", 2, schema="user_id long, flag string")
    table = pa.table({"user_id": pa.array(range(20), pa.int64()), "flag": ["a", "b"] * 10})
    metas = log.producer("typed").send_batch(table, key_field="flag")
    for meta, row in zip(metas, table.to_pylist(), strict=True):
        (record,) = log.read("typed", meta.partition, meta.offset, 1)
        assert record.key == row["flag"].encode() and record.value == row


def test_batches_buffer_flush_and_arrow_tables(log: Log) -> None:
    import pyarrow as pa

    log.create_topic("t", 2, partitioner="round-robin")
    with log.producer("t") as producer:
        for i in range(10):
            producer.buffer({"i": i})
    table = pa.table({"i": list(range(10, 15)), "who": ["a"] * 5})
    log.producer("t").send_batch(table)
    values = sorted(r.value["i"] for p in range(2) for r in log.iter_records("t", p))
    assert values == list(range(15))


def test_reading_from_an_offset_and_across_segments(log: Log) -> None:
    log.create_topic("t", 1, segment_bytes=2048)
    producer = log.producer("t")
    for i in range(50):
        producer.send_batch([{"i": i * 10 + j, "pad": "x" * 20} for j in range(10)])
    assert [o.end for o in log.offsets("t")] == [500]
    got = log.read("t", 0, offset=137, max_records=200)
    assert [r.offset for r in got] == list(range(137, 337))
    assert [r.value["i"] for r in got] == list(range(137, 337))
    assert [r.offset for r in log.iter_records("t", 0, 490)] == list(range(490, 500))


@pytest.mark.parametrize(("start", "end"), [(0, 500), (137, 337), (495, 500), (7, 8), (200, 200)])
def test_columnar_reads_equal_record_reads(log: Log, start: int, end: int) -> None:
    log.create_topic("t", 1, segment_bytes=2048)
    producer = log.producer("t")
    for i in range(50):
        producer.send_batch([{"i": i * 10 + j} for j in range(10)], key_field="i")
    columns = log.storage.read_columns("t", 0, start, end)
    records = log.storage.read("t", 0, start, max(end - start, 1)) if end > start else []
    assert columns.offsets.tolist() == list(range(start, end))
    assert columns.offsets.tolist() == [o for o, _ in records]
    assert columns.values.to_pylist() == [r.value for _, r in records]
    assert columns.keys.to_pylist() == [r.key for _, r in records]
    assert columns.timestamps_ms.tolist() == [r.timestamp_ms for _, r in records]


def test_partitions_can_be_added_never_removed(log: Log) -> None:
    log.create_topic("t", 2)
    producer = log.producer("t")
    log.add_partitions("t", 5)
    producer.refresh()
    meta = producer.send(1, partition=4)
    assert meta.partition == 4 and len(log.offsets("t")) == 5
    with pytest.raises(ValueError, match="never removed"):
        log.add_partitions("t", 3)


def test_an_alter_records_where_the_new_placement_begins(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`topic alter`: the ends at the alter are recorded; every record before them was
    placed by the old count — also with producers appending all along, which follow the
    new count within REFRESH_S (a stale one may still place by the old count past the
    boundary: readers that rely on placement check, see placed_at's users)."""
    import threading

    import riverbed.log.log as log_module
    from riverbed.log.base import next_boundary, placed_at, placed_by

    monkeypatch.setattr(log_module, "REFRESH_S", 0.05)
    log.create_topic("t", 2)
    hashing = KeyHashPartitioner()
    stop = threading.Event()

    def produce(worker: int) -> None:
        producer = log.producer("t")
        i = 0
        while not stop.is_set() or i < 200:
            producer.send_batch([{"k": f"{worker}-{i + j}"} for j in range(5)], key_field="k")
            i += 5

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    while sum(o.end for o in log.offsets("t")) < 100:
        pass
    config = log.alter_partitions("t", 5)
    stop.set()
    for t in threads:
        t.join()
    (epoch,) = config.epochs
    assert epoch.partitions == 5 and len(epoch.starts) == 2 and sum(epoch.starts) >= 100
    assert log.topic("t").epochs == config.epochs  # as stored, read back
    late = log.producer("t")
    late.send_batch([{"k": f"late-{i}"} for i in range(50)], key_field="k")
    for p in range(5):
        records = list(log.iter_records("t", p))
        for r in records:
            count = placed_at(config, p, r.offset)
            assert count == (2 if p < 2 and r.offset < epoch.starts[p] else 5)
            if count == 2:
                assert hashing.partition(r.key, 2) == p  # nothing placed by 5 before
        assert any(r.key.startswith(b"late-") for r in records)  # the new count
        for r in records:
            if r.key.startswith(b"late-"):
                assert hashing.partition(r.key, 5) == p
        if p < 2:
            end = log.offsets("t")[p].end
            assert next_boundary(config, p, 0) == (epoch.starts[p] or None)
            assert placed_by(config, p, epoch.starts[p], end) == 5
            if epoch.starts[p]:
                assert placed_by(config, p, 0, epoch.starts[p]) == 2
                assert placed_by(config, p, 0, end) is None
    assert log.alter_partitions("t", 5) == log.topic("t")  # the same count: no new epoch


def test_user_defined_serde_and_partitioner_live_on_the_log_object(log: Log) -> None:
    class Upper:
        name = "upper"

        def serialize(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def deserialize(self, data: bytes) -> Any:
            return data.decode()

    class Last:
        name = "last"

        def partition(self, key: bytes | None, partitions: int) -> int:
            return partitions - 1

    with pytest.raises(LogError, match="register"):
        log.create_topic("t", 3, serde="upper")
    log.register_serde(Upper())
    log.register_partitioner("last", Last)
    log.create_topic("t", 3, serde="upper", partitioner="last")
    meta = log.producer("t").send("hello")
    assert meta.partition == 2 and log.read("t", 2)[0].value == "HELLO"


def test_bad_values_name_the_problem(log: Log) -> None:
    log.create_topic("j", 1, serde="json")
    with pytest.raises(SerdeError, match="JSON"):
        log.producer("j").send(object())
    log.create_topic("b", 1, serde="bytes")
    with pytest.raises(SerdeError, match="bytes"):
        log.producer("b").send(12)
    with pytest.raises(ValueError, match="topic name"):
        log.create_topic("../escape", 1)
    with pytest.raises(ValueError, match=r"partitions 0\.\.0"):
        log.producer("j").send(1, partition=3)


def test_size_grows_with_what_a_partition_holds(log: Log) -> None:
    """What the console shows as a partition's bytes: it grows by at least the payload."""
    log.create_topic("sized", 2)
    empty = log.storage.size("sized", 0)
    assert empty is not None and empty >= 0
    log.producer("sized").send_batch([{"n": "x" * 100, "k": "k"}] * 50, key_field="k")
    written = [log.storage.size("sized", p) for p in (0, 1)]
    grown = max(w or 0 for w in written)
    assert grown >= empty + 50 * 100, written
    with pytest.raises(TopicNotFoundError):
        log.storage.size("nope", 0)


def test_offsets_for_time_find_the_first_record_at_or_after_it(log: Log) -> None:
    """Kafka's offsetsForTimes, exact also for records stamped out of order, across
    batches and segments; past every timestamp it is the end (read from there = tail)."""
    import random

    rng = random.Random(7)
    log.create_topic("t", 2, segment_bytes=2048)
    producer = log.producer("t")
    stamps: list[int] = []
    for b in range(30):
        batch = [1_000_000 + b * 100 + rng.randint(-250, 250) for _ in range(7)]
        stamps += batch
        producer.send_batch([{"i": i, "ts": t} for i, t in enumerate(batch)], timestamp_field="ts")
    by_partition = {
        p: [int(r.timestamp.timestamp() * 1000) for r in log.iter_records("t", p)] for p in range(2)
    }
    assert sorted(by_partition[0] + by_partition[1]) == sorted(stamps)
    assert all(ts != sorted(ts) for ts in by_partition.values())  # out of order in each
    for when in (0, 1_000_000, 1_001_234, 1_002_000, 1_002_900, 1_004_000):
        expected = [
            next((o for o, t in enumerate(ts) if t >= when), len(ts))
            for ts in by_partition.values()
        ]
        assert log.offsets_for_time("t", when) == expected, when
    moment = datetime.fromtimestamp(1_001.5, tz=UTC)
    assert log.offsets_for_time("t", moment) == log.offsets_for_time("t", 1_001_500)


def test_batches_sent_without_waiting_land_in_order_with_their_offsets(log: Log) -> None:
    log.create_topic("t", 2, partitioner="round-robin")
    producer = log.producer("t")
    futures = [producer.send_batch_async([{"i": i * 10 + j} for j in range(10)]) for i in range(8)]
    metas = [m for f in futures for m in f.result(timeout=60)]
    assert len({(m.partition, m.offset) for m in metas}) == 80
    for p in range(2):
        values = [r.value["i"] for r in log.read("t", p, 0, 1000)]
        assert values == sorted(values) and len(values) == 40  # in the order sent
    assert producer.send_batch_async([]).result(timeout=5) == []
