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
from riverbed.log.records import ColumnBatch, Columns, RawRecord

__all__ = ["PATIENCE_S", "SCHEME", "KafkaLogStorage"]

log = logging.getLogger(__name__)

SCHEME = "kafka"
_BATCH = 10_000  # messages a consume() call may return
# a Kafka topic's partitioner, as its TopicConfig names it: its producers' own, which
# riverbed does not know (the stream checks the placement before it co-locates)
PARTITIONER = "kafka"
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
            # a slice is read from start to end at once: keep fetching ahead while fewer
            # than a million records wait (librdkafka's default, 100,000, stalls every
            # few fetches: 200k -> 550k records/s from one partition here), in fetches
            # of up to 4 MiB a partition — at most 16 MiB held ahead per consumer (a thread
            # has one per partition it reads: see _reader; 64 MiB was no faster here)
            "queued.min.messages": 1_000_000,
            # a start before the oldest record kept is an error, not a silent jump
            "auto.offset.reset": "error",
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "queued.max.messages.kbytes": 16 * 1024,
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

    def _reader(self, topic: str, partition: int) -> Any:
        """This thread's consumer for reading ``partition``: one per partition, so that
        what librdkafka fetched ahead for one is not dropped when the thread reads
        another (a co-located task reads its partitions, and pieces of others', in
        turns; re-assigning one consumer between them made each read wait for a fresh
        fetch)."""
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        consumer = readers.get((topic, partition))
        if consumer is None:
            from confluent_kafka import Consumer

            consumer = readers[(topic, partition)] = Consumer(self._settings)
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
        # how the producers placed the records is not known here: librdkafka's default
        # partitioner is the CRC-32 of the key (riverbed's key-hash), Java's murmur2; the
        # stream checks a topic's placement before it co-locates (stream/lognative.py)
        return TopicConfig(
            name, self._partitions(name), partitioner=PARTITIONER, serde=self.serde_name
        )

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
        end = self._within(topic, partition, end)
        values: list[bytes | None] = []
        keys: list[bytes | None] = []
        stamps: list[int] = []
        offsets: list[int] = []
        for batch in self._batches(topic, partition, start, end):  # a list per consume()
            values += [m.value() for m in batch]
            keys += [m.key() for m in batch]
            stamps += [m.timestamp()[1] for m in batch]
            offsets += [m.offset() for m in batch]
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

    def _within(self, topic: str, partition: int, end: int) -> int:
        """``end``, or the partition's end if that is sooner: a read never waits for
        records that are not there. What the consumer last heard of the partition's end
        answers without a call to the brokers when it is far enough (a planned slice
        read in chunks); else the brokers are asked."""
        from confluent_kafka import TopicPartition

        try:
            _, high = self._reader(topic, partition).get_watermark_offsets(
                TopicPartition(topic, partition), cached=True
            )
        except Exception:  # nothing cached for this partition yet
            high = -1
        if high is None or high < end:
            _, high = self.offsets(topic, partition)
        return min(end, int(high))

    def _batches(self, topic: str, partition: int, start: int, end: int) -> Any:
        """The messages of [start, end) in order, a list per ``consume()``, as Kafka
        hands them out; fewer when the partition ends before ``end``. Offsets it never
        hands out (a transaction's marker; aborted records under ``read_committed``)
        are passed over: the consumer's position moves past them, which is how the end
        is known when the last offsets are such. A read that starts where this
        thread's last one of the partition ended goes on with the same assignment, and so
        with what librdkafka fetched ahead for it (a slice is read in chunks)."""
        from confluent_kafka import TopicPartition

        consumer = self._reader(topic, partition)
        ends: dict[tuple[str, int], int] = getattr(self._local, "ends", None) or {}
        self._local.ends = ends
        if ends.pop((topic, partition), None) != start:  # gone until this read ends well
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
                if any(m.error() is not None for m in batch):
                    batch = self._good(batch, what, topic, partition, at)
                if batch and batch[-1].offset() >= end:  # past a gap: not this read's
                    batch = [m for m in batch if m.offset() < end]
                    consumer.seek(TopicPartition(topic, partition, end))
                    at = end
                elif batch:
                    at = batch[-1].offset() + 1
                if batch:
                    yield batch
            ends[(topic, partition)] = at
        except BaseException:
            consumer.unassign()
            raise

    def _good(self, batch: list[Any], what: str, topic: str, partition: int, at: int) -> list[Any]:
        """The messages of ``batch`` that are records; a start before the oldest record
        kept is :class:`OffsetOutOfRangeError`, errors that librdkafka recovers from by
        itself (a broker back, a new leader) are logged, others raised."""
        from confluent_kafka import KafkaError

        good = []
        for message in batch:
            error = message.error()
            if error is None:
                good.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                continue
            elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                low, _ = self.offsets(topic, partition)
                raise OffsetOutOfRangeError(
                    f"offset {at} of Kafka topic {topic!r} partition {partition} was deleted "
                    f"(its retention); the oldest kept is {low}"
                )
            elif error.fatal() or error.code() in _FATAL:
                raise LogError(f"Kafka at {self.bootstrap}: {what}: {error.str()}")
            else:
                log.warning("Kafka at %s: %s: %s", self.bootstrap, what, error.str())
        return good

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        # read_columns stops at the partition's end itself
        columns = self.read_columns(topic, partition, offset, offset + max_records)
        rows = ColumnBatch(columns.timestamps_ms, columns.keys, columns.values, None).rows()
        return list(zip(columns.offsets.tolist(), rows, strict=True))

    def close(self) -> None:
        with self._lock:
            consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            consumer.close()
