"""Time-range jobs over a Kafka topic (Spark's own connector, the tests' broker): chunks
read from Kafka's time index and equal pandas on the same records, late ones included;
bad inputs are named."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from riverbed.control import connect
from riverbed.jobs.timerange import (
    Driver,
    KafkaInput,
    MissingInputError,
    Rolling,
    SpecError,
    TimeRangeJob,
    Tumbling,
)
from riverbed.spark import kafkaread as spark_kafka
from riverbed.testing import KafkaServer
from tests.jobs.test_timerange_topic import assert_chunks_equal_pandas, readings, spec_for

pytestmark = pytest.mark.spark


def _produce(bootstrap: str, topic: str, rows: list[tuple[int, datetime, float | None]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for sensor, ts, value in rows:  # the record's Kafka timestamp is its event time
        producer.produce(
            topic,
            key=str(sensor),
            value=json.dumps({"sensor": sensor, "value": value}),
            partition=sensor % 2,
            timestamp=int(ts.timestamp() * 1000),
        )
    assert producer.flush(30) == 0


@pytest.mark.parametrize("lateness", [None, "5h"])  # to the topic's end, or bounded
def test_a_kafka_topic_in_chunks_gives_what_pandas_gives(
    spark: Any, kafka_server: KafkaServer, kafka_topic: str, tmp_path: Path, lateness: str | None
) -> None:
    kafka_server.create_topic(kafka_topic, partitions=2)
    rows = readings(400, hours=4, seed=3)
    rows.sort(key=lambda r: r[1])
    late = rows[::8]  # an eighth of the records arrive after newer ones (up to 4 h late)
    rows = [r for i, r in enumerate(rows) if i % 8] + late
    _produce(kafka_server.bootstrap, kafka_topic, rows)
    # the chunks start where Kafka's time index says, not at the beginning
    starts = spark_kafka.offsets_for_time(
        kafka_server.bootstrap, kafka_topic, int(rows[200][1].timestamp() * 1000)
    )
    assert 0 < sum(starts.values()) < len(rows)
    job = TimeRangeJob(
        input=KafkaInput(
            kafka_server.bootstrap, kafka_topic, "sensor bigint, value double", lateness
        ),
        key="sensor",
        time="timestamp",
        metrics=[Rolling("45min", "value", ["mean", "count"])],
        tumbling=[Tumbling("1h", "value", ["sum"])],
        chunk="1h",
    )
    assert_chunks_equal_pandas(spark, job, rows, tmp_path / "out")


def test_bad_kafka_inputs_are_named(spark: Any, kafka_server: KafkaServer, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="bootstrap must be host:port"):
        KafkaInput("nohost", "t", "a long")
    with pytest.raises(SpecError, match="not a Kafka topic name"):
        KafkaInput("127.0.0.1:9092", "bad topic", "a long")
    with pytest.raises(SpecError, match="sets startingOffsets itself"):
        KafkaInput("127.0.0.1:9092", "t", "a long", options={"startingOffsets": "latest"})
    job = TimeRangeJob(
        input=KafkaInput(kafka_server.bootstrap, "no-such-topic-here", "sensor bigint"),
        key="sensor",
        time="timestamp",
        tumbling=[Tumbling("1h", "sensor", ["count"])],
    )
    driver = Driver(spec_for(job, tmp_path / "out"), connect("memory://"), lambda: spark, ttl=5)
    with pytest.raises(MissingInputError, match="'no-such-topic-here' does not exist"):
        driver.run("2026-01-01", "2026-01-01T01:00")
