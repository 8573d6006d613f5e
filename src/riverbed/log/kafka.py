"""A Kafka cluster read as a riverbed log (read-only): ``kafka://host:9092[,host:9092]``.

The log-native stream path (:mod:`riverbed.stream.lognative`) plans each batch as
offset slices of a topic's partitions and has its state tasks read their slices
themselves, as Arrow columns; this storage gives it a Kafka topic's partitions the same
way, with ``confluent-kafka`` (librdkafka): a partition's offsets are Kafka's low and
high watermarks, and a read of [start, end) is an assigned consumer from ``start``
until it has passed ``end - 1`` — records Kafka never hands out (transaction markers,
aborted records with ``read_committed``) are skipped over by offset.

Topics are read, never written: creating a topic, appending and retention are Kafka's
(its own tools and clients). A topic's values are ``bytes`` unless the URL says how to
decode them (``?serde=json``). Client settings (``security.protocol``, SASL, TLS — the
librdkafka names, which are Kafka's) are given to :class:`KafkaLogStorage` directly,
never in the URL: a URL is shown to people and written in manifests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pyarrow as pa

from riverbed.log.base import LogStorage, TopicConfig
from riverbed.log.errors import LogError, LogValueError, OffsetOutOfRangeError
from riverbed.log.records import Columns, RawRecord

__all__ = ["PATIENCE_S", "SCHEME", "KafkaLogStorage"]

log = logging.getLogger(__name__)

SCHEME = "kafka"
_BATCH = 10_000  # messages a consume() call may return
PATIENCE_S = 120.0  # how long a read rides out brokers that do not answer


def _fatal_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    names = (
        "UNKNOWN_TOPIC_OR_PART",
        "_UNKNOWN_TOPIC",
        "_UNKNOWN_PARTITION",
        "TOPIC_AUTHORIZATION_FAILED",
        "SASL_AUTHENTICATION_FAILED",
        "_AUTHENTICATION",
        "_SSL",
        "OFFSET_OUT_OF_RANGE",
    )
    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


_FATAL = _fatal_codes()


class KafkaLogStorage(LogStorage):
    """Kafka topics as a read-only riverbed log (see the module doc)."""

    read_only = True

    def __init__(
        self, url: str, settings: Mapping[str, Any] | None = None, timeout: float = 10.0
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != SCHEME or not parts.netloc:
            raise LogError(f"not a Kafka log URL: {url!r}; e.g. kafka://broker-1:9092")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.serde_name = query.get("serde", "bytes")
        self.bootstrap = parts.netloc
        self.url = f"{SCHEME}://{self.bootstrap}"
        self.timeout = timeout
        self.patience = PATIENCE_S
        self._known: set[str] = set()  # topics the brokers answered for (then: ride out)
        self._settings = {
            # as Spark's Kafka source reads: every record the brokers hold, unless the
            # settings ask for read_committed
            "isolation.level": "read_uncommitted",
            **dict(settings or {}),
            "bootstrap.servers": self.bootstrap,
            "group.id": "riverbed-log",  # assigned partitions only: never joins or commits
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "log_level": 2,
        }
        self._local = threading.local()  # a consumer per thread (librdkafka's are not shared)
        self._consumers: list[Any] = []
        self._lock = threading.Lock()

    def _consumer(self) -> Any:
        consumer = getattr(self._local, "consumer", None)
        if consumer is None:
            from confluent_kafka import Consumer

            consumer = self._local.consumer = Consumer(self._settings)
            with self._lock:
                self._consumers.append(consumer)
        return consumer

    # -- topics -------------------------------------------------------------------------
    def _partitions(self, name: str) -> int:
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.patience
        while True:
            try:
                meta = self._consumer().list_topics(name, timeout=self.timeout).topics.get(name)
                break
            except KafkaException as exc:
                if name not in self._known:  # never answered: the address, most likely
                    raise LogError(
                        f"no Kafka broker at {self.bootstrap} answered within "
                        f"{self.timeout:g} s ({exc}); is it running, and is the address right?"
                    ) from None
                self._ride_out(exc, deadline, f"the partitions of {name!r}")
        if meta is None or meta.error is not None or not meta.partitions:
            raise LogValueError(
                f"Kafka topic {name!r} does not exist at {self.bootstrap}; create it with "
                "Kafka's tools (kafka-topics.sh --create)"
            )
        self._known.add(name)
        return len(meta.partitions)

    def topic_config(self, name: str) -> TopicConfig:
        # Kafka's default partitioner (murmur2 of the key) is not riverbed's key-hash:
        # the stream never co-locates a Kafka topic with its state partitions
        return TopicConfig(name, self._partitions(name), partitioner="kafka", serde=self.serde_name)

    def list_topics(self) -> list[str]:
        meta = self._consumer().list_topics(timeout=self.timeout)
        return sorted(t for t in meta.topics if not t.startswith("__"))

    def create_topic(self, config: TopicConfig) -> None:
        raise self.read_only_error("create topics")

    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        raise self.read_only_error("add partitions")

    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        raise self.read_only_error("produce")

    def enforce_retention(self, topic: str) -> int:
        return 0  # Kafka's brokers enforce their own

    def read_only_error(self, what: str) -> LogError:
        return LogValueError(
            f"{self.url} is a Kafka cluster read through riverbed's log (read-only): "
            f"{what} with Kafka's own tools and clients"
        )

    # -- records ------------------------------------------------------------------------
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        deadline = time.monotonic() + self.patience
        while True:
            try:
                low, high = self._consumer().get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self.timeout
                )
                return int(low), int(high)
            except KafkaException as exc:  # a broker lost, a leader moving: ask again
                self._ride_out(exc, deadline, f"the offsets of {topic!r} partition {partition}")

    def _ride_out(self, exc: Exception, deadline: float, what: str) -> None:
        """Wait a little before asking again after a transient failure; past
        ``deadline`` (or for one that will not pass), a :class:`LogError` naming it."""
        error = exc.args[0] if exc.args else None
        fatal = (
            getattr(error, "fatal", lambda: False)()
            or getattr(error, "code", lambda: None)() in _FATAL
        )
        if fatal or time.monotonic() > deadline:
            raise LogError(
                f"Kafka at {self.bootstrap} could not give {what} for {self.patience:g} s: "
                f"{getattr(error, 'str', lambda: str(exc))()}"
            ) from None
        log.warning("Kafka at %s: %s failed (%s); trying again", self.bootstrap, what, exc)
        time.sleep(0.5)

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        """Records of [start, end) as columns, with their offsets (Kafka's can skip)."""
        if end <= start:
            empty = pa.array([], pa.binary())
            return Columns(start, np.zeros(0, np.int64), empty, empty)
        low, high = self.offsets(topic, partition)
        if start < low:
            raise OffsetOutOfRangeError(
                f"offset {start} of Kafka topic {topic!r} partition {partition} was deleted "
                f"(its retention); the oldest kept is {low}"
            )
        end = min(end, high)
        values: list[bytes | None] = []
        keys: list[bytes | None] = []
        stamps: list[int] = []
        offsets: list[int] = []
        for message in self._messages(topic, partition, start, end):
            values.append(message.value())
            keys.append(message.key())
            stamps.append(message.timestamp()[1])
            offsets.append(message.offset())
        picked = np.array(offsets, np.int64)
        contiguous = len(offsets) == 0 or (
            offsets[0] == start and offsets[-1] == start + len(offsets) - 1
        )
        return Columns(
            start,
            np.array(stamps, np.int64),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            picked=None if contiguous else picked,
        )

    def _messages(self, topic: str, partition: int, start: int, end: int) -> Any:
        """The messages of [start, end) in order, as Kafka hands them out. Offsets it
        never hands out (a transaction's marker; aborted records under
        ``read_committed``) are passed over: the consumer's position moves past them,
        which is how the end is known when the last offsets are such."""
        from confluent_kafka import KafkaError, TopicPartition

        consumer = self._consumer()
        consumer.assign([TopicPartition(topic, partition, start)])
        what = f"records {start} to {end - 1} of {topic!r} partition {partition}"
        try:
            at, deadline = start, time.monotonic() + self.patience
            while at < end:
                batch = consumer.consume(min(_BATCH, end - at), timeout=0.1)
                if not batch:
                    (where,) = consumer.position([TopicPartition(topic, partition)])
                    if where.offset > at:
                        at, deadline = where.offset, time.monotonic() + self.patience
                    elif time.monotonic() > deadline:  # brokers down, or a leader lost
                        raise LogError(
                            f"Kafka at {self.bootstrap} gave none of {what} for "
                            f"{self.patience:g} s; are its brokers up?"
                        )
                    continue
                deadline = time.monotonic() + self.patience
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        if error.fatal() or error.code() in _FATAL:
                            raise LogError(f"Kafka at {self.bootstrap}: {what}: {error.str()}")
                        log.warning("Kafka at %s: %s: %s", self.bootstrap, what, error.str())
                        continue  # librdkafka recovers by itself (a broker back, a new leader)
                    offset = message.offset()
                    if offset >= end:
                        return
                    at = offset + 1
                    yield message
        finally:
            consumer.unassign()

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        _, high = self.offsets(topic, partition)
        columns = self.read_columns(topic, partition, offset, min(high, offset + max_records))
        return [
            (int(o), RawRecord(int(ts), key, value, {}))
            for o, ts, key, value in zip(
                columns.offsets.tolist(),
                columns.timestamps_ms.tolist(),
                columns.keys.to_pylist(),
                columns.values.to_pylist(),
                strict=True,
            )
        ]

    def close(self) -> None:
        with self._lock:
            consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            consumer.close()
