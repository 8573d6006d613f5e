"""Results to a Kafka topic (``riverbed.stream.sinks.KafkaSink``) against a real broker:
drivers killed after a batch's transaction committed but before the batch did, and
inside a transaction; a ``read_committed`` consumer sees every batch's rows once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.stream.kafkasource import watermarks
from riverbed.stream.sinks import MARKERS, KafkaSink, KafkaSinkError
from riverbed.testing import KafkaServer, free_port
from tests.jobs.cluster import until

pytestmark = pytest.mark.kafka

AGGREGATION = "flags"


def rows(batch_id: int, n: int = 6, events: int | None = None) -> pd.DataFrame:
    start = pd.Timestamp("2026-11-21", tz="UTC") + pd.Timedelta(hours=batch_id)
    return pd.DataFrame(
        {
            "window_start": [start] * n,
            "window_end": [start + pd.Timedelta(hours=1)] * n,
            "key": [f"f{i}" for i in range(n)],
            "events": [batch_id * 100 + i if events is None else events for i in range(n)],
        }
    )


# A driver process: writes the batches given on its command line through the sink, then
# for the last one either stops after the sink's transaction committed ("after-commit":
# the batch's own commit would come next) or inside the transaction ("in-transaction"),
# says so, and sleeps until it is SIGKILLed.
DRIVER = """
import json, sys, time
sys.path.insert(0, {root!r})
from tests.stream.test_kafka_sink import rows, AGGREGATION
from riverbed.stream.sinks import KafkaSink

label, mode, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
sink = KafkaSink(label, AGGREGATION, partitions=3)
for b in batches[:-1]:
    print("wrote", b, sink.write(b, rows(b)), flush=True)
last = batches[-1]
if mode == "after-commit":
    print("wrote", last, sink.write(last, rows(last)), flush=True)
else:  # the rows are in the log, the transaction is open: what a kill mid-write leaves
    p = sink.producer
    p.begin_transaction()
    for row in rows(last, events=-1).to_dict("records"):
        p.produce(sink.topic, key=row["key"], value=json.dumps({{"batch_id": last, "events": -1}}))
    p.flush(30)
    print("open", last, flush=True)
time.sleep(600)
"""


def _driver(label: str, mode: str, *batches: int) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a driver and wait for its last line; returns it and what it printed."""
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(root=root), label, mode, *map(str, batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while len(lines) < len(batches):
        line = proc.stdout.readline()
        assert line, f"the driver died: {proc.stderr.read() if proc.stderr else ''}"
        lines.append(line.strip())
        assert time.monotonic() < deadline, lines
    return proc, lines


def _consumer(bootstrap: str, isolation: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )


def topic_ends(bootstrap: str, topic: str, isolation: str) -> dict[int, int]:
    """Each partition's end as a reader at ``isolation`` sees it."""
    marks = watermarks(
        {"bootstrap.servers": bootstrap, "isolation.level": isolation}, topic, None, 10
    )
    assert marks is not None, f"no topic {topic} on {bootstrap}"
    return {p: end for p, (_, end) in marks.items()}


def read_topic(bootstrap: str, topic: str, isolation: str) -> list[dict[str, Any]]:
    """Every value of ``topic`` a consumer at ``isolation`` sees, from the start — under
    read_committed once every transaction's markers are written: Kafka's commit returns
    when the coordinator has logged it, and writes the partitions' markers after (until
    then a read_committed end stops before the transaction's records)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    if isolation == "read_committed":
        until(
            lambda: (
                topic_ends(bootstrap, topic, isolation)
                == topic_ends(bootstrap, topic, "read_uncommitted")
            ),
            30,
            f"the markers of {topic}'s transactions",
        )
    ends = topic_ends(bootstrap, topic, isolation)
    tps = [TopicPartition(topic, p) for p in ends]
    consumer = _consumer(bootstrap, isolation)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        values: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in consumer.position(tps)}
            if all(positions[p] >= ends[p] for p in ends):
                break
            message = consumer.poll(0.5)
            if message is not None and message.error() is None and message.value():
                values.append(json.loads(message.value()))
        return values
    finally:
        consumer.close()


def test_killed_drivers_leave_each_batch_once_for_read_committed_readers(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    label = f"kafka://{kafka_server.bootstrap}/{kafka_topic}"
    # killed after batch 2's transaction committed, before the batch itself would have
    first, lines = _driver(label, "after-commit", 0, 1, 2)
    assert lines == ["wrote 0 6", "wrote 1 6", "wrote 2 6"]
    first.kill()
    first.wait()
    # its successor replays batch 2, then is killed with batch 3's transaction open
    second, lines = _driver(label, "in-transaction", 2, 3)
    assert lines == ["wrote 2 0", "open 3"]  # the replay found batch 2's marker
    second.kill()
    second.wait()
    # the next driver's producer aborts the open transaction; batch 3 is written once
    sink = KafkaSink(label, AGGREGATION, partitions=3)
    assert sink.last_batch() == 2
    assert sink.write(3, rows(3)) == 6
    assert sink.write(3, rows(3)) == 0  # a replay in the same process, too
    assert sink.write(4, rows(4)) == 6
    sink.close()

    seen = read_topic(kafka_server.bootstrap, kafka_topic, "read_committed")
    per_batch = pd.Series([v["batch_id"] for v in seen]).value_counts().sort_index()
    assert per_batch.to_dict() == {0: 6, 1: 6, 2: 6, 3: 6, 4: 6}, "a batch twice, or lost"
    assert all(v["events"] >= 0 for v in seen), "rows of an aborted transaction were read"
    assert sorted(v["events"] for v in seen if v["batch_id"] == 3) == list(range(300, 306))
    # the killed transaction's rows are in the log: only the isolation level hides them
    raw = read_topic(kafka_server.bootstrap, kafka_topic, "read_uncommitted")
    assert sum(v["events"] == -1 for v in raw) == 6
    markers = read_topic(kafka_server.bootstrap, kafka_topic + MARKERS, "read_committed")
    assert [m["batch_id"] for m in markers] == [0, 1, 2, 3, 4]


def test_a_replaced_driver_is_fenced_and_bad_addresses_are_one_error(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    label = f"kafka://{kafka_server.bootstrap}/{kafka_topic}"
    old = KafkaSink(label, AGGREGATION)
    assert old.write(0, rows(0)) == 6
    new = KafkaSink(label, AGGREGATION)  # a new driver: same transactional id
    with pytest.raises(KafkaSinkError, match="fenced"):
        old.write(1, rows(1))
    assert new.write(1, rows(1)) == 6
    new.close()
    seen = read_topic(kafka_server.bootstrap, kafka_topic, "read_committed")
    assert sorted(v["batch_id"] for v in seen) == [0] * 6 + [1] * 6

    nobody = f"kafka://127.0.0.1:{free_port()}/results"
    with pytest.raises(KafkaSinkError, match=r"no Kafka broker answered at 127\.0\.0\.1:"):
        KafkaSink(nobody, AGGREGATION)


def test_a_commit_that_timed_out_on_a_stalled_broker_is_tried_again_and_written_once(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    import threading

    label = f"kafka://{kafka_server.bootstrap}/{kafka_topic}"
    sink = KafkaSink(label, AGGREGATION, partitions=3)
    assert sink.write(0, rows(0)) == 6
    sink.commit_s = 2.0  # a commit gives up after 2 s: the broker is stalled for 6
    result: list[Any] = []
    kafka_server.pause()
    try:
        writer = threading.Thread(target=lambda: result.append(_write(sink, 1)))
        writer.start()
        time.sleep(6)
    finally:
        kafka_server.resume()
    writer.join(180)
    assert result == [6], result
    sink.close()
    seen = read_topic(kafka_server.bootstrap, kafka_topic, "read_committed")
    assert sorted(v["batch_id"] for v in seen) == [0] * 6 + [1] * 6


def _write(sink: KafkaSink, batch_id: int) -> Any:
    try:
        return sink.write(batch_id, rows(batch_id))
    except KafkaSinkError as exc:
        return exc


def _topic_config(kafka_server: KafkaServer, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    resource = ConfigResource("topic", topic)
    admin = kafka_server.admin()  # alive until the answer: its futures die with it
    described = admin.describe_configs([resource])[resource].result(10)
    return {name: entry.value for name, entry in described.items()}


def _old_rows(batch_id: int, days: int = 9) -> pd.DataFrame:
    """Rows of windows that ended ``days`` ago: a backfill, a replay, a late source."""
    shifted = pd.Timestamp.now(tz="UTC").floor("h") - pd.Timedelta(days=days)
    old = rows(batch_id)
    delta = shifted - old["window_start"].iloc[0]
    return old.assign(
        window_start=old["window_start"] + delta, window_end=old["window_end"] + delta
    )


def test_results_of_windows_older_than_the_retention_outlive_its_check(
    kafka_server: KafkaServer, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Result records are stamped when they are written, never with their window's
    time, so a topic's time retention does not delete the results of old windows; a
    topic riverbed creates keeps them all, and one made beforehand with a retention is
    named at start with what it will delete."""
    import logging

    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    made = f"kafka://{kafka_server.bootstrap}/{kafka_topic}"
    sink = KafkaSink(made, AGGREGATION, partitions=2)
    assert _topic_config(kafka_server, kafka_topic)["retention.ms"] == "-1"
    assert _topic_config(kafka_server, kafka_topic)["message.timestamp.type"] == "LogAppendTime"
    before = time.time() * 1000
    assert sink.write(0, _old_rows(0)) == 6
    sink.close()

    # a results topic made beforehand with Kafka's default retention (7 days)
    theirs = f"{kafka_topic}-7d"
    week = str(7 * 24 * 3_600_000)
    admin = kafka_server.admin()  # alive until the answer: its futures die with it
    made_theirs = admin.create_topics([NewTopic(theirs, 2, 1, config={"retention.ms": week})])
    made_theirs[theirs].result(30)
    with caplog.at_level(logging.WARNING, logger="riverbed.stream.sinks"):
        other = KafkaSink(f"kafka://{kafka_server.bootstrap}/{theirs}", AGGREGATION)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"{theirs} deletes records 7 days after they are written" in said
    assert f"retention.ms={week}" in said and "--add-config retention.ms=-1" in said
    assert other.write(0, _old_rows(0)) == 6
    other.close()

    time.sleep(3 * 2)  # three of the test broker's retention checks (every 2 s)
    for topic in (kafka_topic, theirs):
        kept = read_topic(kafka_server.bootstrap, topic, "read_uncommitted")
        assert sorted(v["key"] for v in kept) == [f"f{i}" for i in range(6)], topic
        assert {v["window_end"] for v in kept} == {_old_rows(0)["window_end"].iloc[0].isoformat()}
    stamps = _timestamps(kafka_server.bootstrap, theirs)
    assert stamps and all(before - 1000 <= t <= time.time() * 1000 for t in stamps)


def _timestamps(bootstrap: str, topic: str) -> list[int]:
    """The record timestamps of ``topic`` (ms)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "stamps"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        stamps: list[int] = []
        for message in iter(lambda: consumer.poll(2.0), None):
            if message.error() is None:
                stamps.append(message.timestamp()[1])
        return stamps
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("config", "warned"),
    [
        ({"retention.ms": "604800000"}, "7 days"),
        ({"retention.ms": "3600000", "cleanup.policy": "delete"}, "1 hour"),
        ({"retention.ms": "90000", "cleanup.policy": "compact,delete"}, "1.5 minutes"),
        ({"retention.ms": "-1"}, None),
        ({"retention.ms": "604800000", "cleanup.policy": "compact"}, None),
        ({}, None),
    ],
)
def test_the_retention_warning_names_what_is_deleted_or_says_nothing(
    config: dict[str, str], warned: str | None
) -> None:
    from riverbed.stream.sinks import retention_warning

    words = retention_warning("kafka://b:9092/results", dict(config))
    if warned is None:
        assert words is None
    else:
        assert words is not None and f"deletes records {warned} after" in words
        assert "--entity-name results --add-config retention.ms=-1" in words
