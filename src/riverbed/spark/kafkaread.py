"""Kafka topics read by Spark's own connector (``spark-sql-kafka-0-10``), for the stream
and for time-range jobs alike: the rule for topic names, Kafka's offsets for a time,
and a batch read of an exact offset range with JSON values as columns.

Offsets for a time come from the brokers (``offsets_for_times``: per partition, the
earliest offset whose record timestamp is at or after it — Kafka's own time index), so
a read of ``[lo, hi)`` by record time starts exactly where ``lo`` begins; where it may
stop depends on how late records can be (the caller decides).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from riverbed.errors import InvalidValueError, RiverbedError

__all__ = [
    "TOPIC",
    "KafkaReadError",
    "check_topic",
    "client_settings",
    "ends",
    "json_columns",
    "offsets_for_time",
    "read_range",
]

TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule for topic names


def client_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """A Kafka client's settings from Spark-style source options: each ``kafka.<name>``
    is the client's ``<name>`` (security protocol, SASL, TLS), as Spark's Kafka source
    passes them on."""
    return {k.removeprefix("kafka."): v for k, v in options.items() if k.startswith("kafka.")}


class KafkaReadError(RiverbedError):
    """The brokers could not tell a topic's partitions or offsets."""


def check_topic(topic: Any, where: str) -> str:
    """``topic`` if Kafka would accept it as a topic name, else an error naming it."""
    if not isinstance(topic, str) or not TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise InvalidValueError(
            f"{where}: {topic!r} is not a Kafka topic name (1-249 of letters, digits, "
            "'.', '_', '-')"
        )
    return topic


def _consumer(bootstrap: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "riverbed-offsets",  # never joins or commits: lookups only
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )


def _partitions(consumer: Any, bootstrap: str, topic: str, timeout: float) -> list[int]:
    from confluent_kafka import KafkaException

    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise KafkaReadError(
            f"no Kafka broker at {bootstrap} answered within {timeout:g} s ({exc}); is it "
            "running, and is the address right?"
        ) from None
    if meta is None or meta.error is not None or not meta.partitions:
        raise KafkaReadError(f"Kafka topic '{topic}' does not exist at {bootstrap}")
    return sorted(meta.partitions)


def ends(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """Each partition's end offset now (the next offset to be written)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in _partitions(consumer, bootstrap, topic, timeout)
        }
    finally:
        consumer.close()


def offsets_for_time(
    bootstrap: str, topic: str, timestamp_ms: int, timeout: float = 10.0
) -> dict[int, int]:
    """Per partition, the earliest offset whose record timestamp is at or after
    ``timestamp_ms`` — the partition's end when no record is (Kafka's
    ``offsetsForTimes``)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap)
    try:
        parts = _partitions(consumer, bootstrap, topic, timeout)
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, timestamp_ms) for p in parts], timeout=timeout
        )
        out = {}
        for tp in found:
            if tp.offset < 0:  # no record at or after it: the end
                tp.offset = consumer.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=timeout
                )[1]
            out[tp.partition] = tp.offset
        return out
    finally:
        consumer.close()


def read_range(
    spark: Any,
    bootstrap: str,
    topic: str,
    starts: Mapping[int, int],
    stops: Mapping[int, int],
    options: Mapping[str, str] | None = None,
) -> Any:
    """A batch DataFrame of Spark's Kafka columns (``key``, ``value``, ``partition``,
    ``offset``, ``timestamp``, …) holding offsets ``[starts[p], stops[p])`` of each
    partition."""
    begin = {topic: {str(p): int(o) for p, o in starts.items()}}
    end = {topic: {str(p): int(stops.get(p, o)) for p, o in starts.items()}}
    return (
        spark.read.format("kafka")
        .options(**dict(options or {}))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps(begin))
        .option("endingOffsets", json.dumps(end))
        .load()
    )


def json_columns(df: Any, schema: str) -> Any:
    """The JSON values of a Kafka DataFrame as the columns of ``schema`` (a Spark DDL
    string), beside ``key`` (a string) and ``timestamp`` (the record's)."""
    from pyspark.sql import functions as F

    parsed = F.from_json(F.col("value").cast("string"), schema)
    return df.select(
        parsed.alias("_v"), F.col("key").cast("string").alias("key"), F.col("timestamp")
    ).select("_v.*", "key", "timestamp")
