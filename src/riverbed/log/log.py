"""The :class:`Log`: topics, producers and readers over one storage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.durations import epoch_ms
from riverbed.log.base import Fsync, LogStorage, TopicConfig, check_values
from riverbed.log.errors import LogError, LogValueError, SerdeError
from riverbed.log.group.consumer import Consumer
from riverbed.log.partitioners import BUILTIN_PARTITIONERS, Partitioner
from riverbed.log.records import (
    ColumnBatch,
    RawRecord,
    Record,
    RecordMetadata,
    as_struct,
    now_ms,
)
from riverbed.log.schema import schema_of
from riverbed.log.serdes import BUILTIN_SERDES, Serde

if TYPE_CHECKING:
    from riverbed.control import ControlPlane


def _key_bytes(key: bytes | str | int | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return str(key).encode()


def _ts_ms(ts: datetime | int | None) -> int:
    if ts is None:
        return now_ms()
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise LogValueError(f"naive timestamp {ts!r}: use a timezone-aware (UTC) datetime")
        return epoch_ms(ts)
    return int(ts)


@dataclass(frozen=True)
class PartitionOffsets:
    partition: int
    start: int
    end: int


class Log:
    """Topics on one storage. Partitioners and serdes are registered on this object."""

    def __init__(self, storage: LogStorage) -> None:
        self.storage = storage
        self.url = storage.url
        self._partitioner_factories: dict[str, Callable[[], Partitioner]] = dict(
            BUILTIN_PARTITIONERS
        )
        self._serdes: dict[str, Serde] = dict(BUILTIN_SERDES)
        self._lock = threading.Lock()

    # -- registries (owned by this object) ----------------------------------------------
    def register_partitioner(self, name: str, factory: Callable[[], Partitioner]) -> None:
        self._partitioner_factories[name] = factory

    def register_serde(self, serde: Serde) -> None:
        self._serdes[serde.name] = serde

    def serde(self, name: str) -> Serde:
        try:
            return self._serdes[name]
        except KeyError:
            raise LogError(
                f"serde '{name}' is not registered on this log; register it with "
                f"log.register_serde(...) (known: {', '.join(sorted(self._serdes))})"
            ) from None

    def partitioner(self, name: str) -> Partitioner:
        try:
            return self._partitioner_factories[name]()
        except KeyError:
            raise LogError(
                f"partitioner '{name}' is not registered on this log; register it with "
                f"log.register_partitioner(...) "
                f"(known: {', '.join(sorted(self._partitioner_factories))})"
            ) from None

    # -- topics -------------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        partitioner: str = "key-hash",
        serde: str = "json",
        segment_bytes: int = 64 * 1024 * 1024,
        retention_bytes: int | None = None,
        retention_ms: int | None = None,
        fsync: Fsync = "batch",
        fsync_interval_ms: int = 1000,
        schema: str | None = None,
    ) -> TopicConfig:
        """Create a topic. ``schema`` (``"user_id long, flag string, ts timestamp"``)
        makes it typed: producers check every value against it (see
        :mod:`riverbed.log.schema`)."""
        self.partitioner(partitioner)  # fail before creating anything
        self.serde(serde)
        config = TopicConfig(
            name,
            partitions,
            partitioner,
            serde,
            segment_bytes,
            retention_bytes,
            retention_ms,
            fsync,
            fsync_interval_ms,
            schema=schema,
        )
        self.storage.create_topic(config)
        return config

    def topic(self, name: str) -> TopicConfig:
        return self.storage.topic_config(name)

    def topics(self) -> list[str]:
        return self.storage.list_topics()

    def alter_partitions(self, name: str, partitions: int) -> TopicConfig:
        """Grow ``name`` to ``partitions`` partitions (never fewer), recording where in
        each partition the new count begins to place records (:class:`~riverbed.log.
        base.Placement`); producers follow within :data:`REFRESH_S`."""
        return self.storage.set_partitions(name, partitions)

    add_partitions = alter_partitions

    def offsets(self, topic: str) -> list[PartitionOffsets]:
        config = self.topic(topic)
        return [
            PartitionOffsets(p, *self.storage.offsets(topic, p)) for p in range(config.partitions)
        ]

    def offsets_for_time(self, topic: str, when: datetime | int) -> list[int]:
        """Per partition, the first offset whose record's timestamp is at or after
        ``when`` (a datetime, or ms since the epoch), or its end when none is — where to
        start reading to replay from a time. Exact also for records stamped out of
        order (it reads every timestamp before the one it finds)."""
        config = self.topic(topic)
        at = _ts_ms(when)
        return [self.storage.offset_for_time(topic, p, at) for p in range(config.partitions)]

    # -- producing and reading ----------------------------------------------------------
    def producer(self, topic: str) -> Producer:
        if self.storage.read_only:
            raise self.storage.read_only_error(f"produce to {topic!r}")
        return Producer(self, topic)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int = 0,
        max_records: int = 1000,
        wait: float = 0,
        *,
        malformed: Literal["raise", "skip"] = "raise",
    ) -> list[Record]:
        """Up to ``max_records`` records from ``offset``; at the end, wait up to ``wait``
        seconds for one to be appended. A value the topic's serde cannot decode raises
        :class:`SerdeError` naming the record, or with ``malformed="skip"`` is left out
        (a reader that only looks — a sample, an inference — must not stop on the bad
        bytes a topic of other producers can hold; the stream counts them itself)."""
        config = self.topic(topic)
        serde = self.serde(config.serde)
        storage = self.storage
        raws = (
            storage.read_waiting(topic, partition, offset, max_records, wait)
            if wait > 0
            else storage.read(topic, partition, offset, max_records)
        )
        if malformed == "raise":
            return [_decode(topic, partition, o, raw, serde) for o, raw in raws]
        records = []
        for o, raw in raws:
            try:
                records.append(_decode(topic, partition, o, raw, serde))
            except SerdeError:
                continue
        return records

    def iter_records(self, topic: str, partition: int, offset: int = 0) -> Iterator[Record]:
        """Every record from ``offset`` to the current end."""
        while True:
            batch = self.read(topic, partition, offset, 1000)
            if not batch:
                return
            yield from batch
            offset = batch[-1].offset + 1

    def consumer(
        self, cp: ControlPlane, group: str, topics: Sequence[str] | str, **options: Any
    ) -> Consumer:
        """Join consumer ``group`` for ``topics``; see :class:`riverbed.log.group.Consumer`."""
        return Consumer(self, cp, group, [topics] if isinstance(topics, str) else topics, **options)

    def close(self) -> None:
        self.storage.close()


def _decode(topic: str, partition: int, offset: int, raw: RawRecord, serde: Serde) -> Record:
    if isinstance(raw.value, bytes):
        try:
            value = serde.deserialize(raw.value)
        except SerdeError as exc:
            raise SerdeError(f"{topic}/{partition}@{offset}: {exc}") from exc
    else:  # a typed topic's record: its fields, typed already
        value = raw.value
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=datetime.fromtimestamp(raw.timestamp_ms / 1000, tz=UTC),
        key=raw.key,
        value=value,
        headers=raw.headers,
    )


# how long a producer places records by a partition count before it reads the topic's
# again (a `topic alter --partitions` elsewhere is followed within this)
REFRESH_S = 1.0


class Producer:
    """Appends records to one topic with its partitioner and serde.

    ``send`` appends one record now; ``send_batch`` appends many as one batch per
    partition (much faster); ``buffer`` + ``flush`` collect records and write them in
    batches, returning their coordinates at flush.
    """

    def __init__(self, log: Log, topic: str) -> None:
        self.log = log
        self.topic = topic
        config = log.topic(topic)  # TopicNotFoundError names the fix
        self._serde = log.serde(config.serde)
        self._partitioner = log.partitioner(config.partitioner)
        self._partitions = config.partitions
        self._refresh_at = time.monotonic() + REFRESH_S
        self._pending: list[tuple[int, RawRecord]] = []
        self._schema = config.schema  # a typed topic's fields, else None

    def check(self, values: Sequence[Any]) -> Any:
        """Raise :class:`RecordRejectedError` unless every value fits the topic's schema
        (untyped topics take anything their serde can write). Returns a typed topic's
        values as an Arrow record batch (``None`` for an untyped topic)."""
        return check_values(self.topic, self._schema, values, "call")

    def record(
        self,
        value: Any,
        key: bytes | str | int | None = None,
        timestamp: datetime | int | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
        *,
        checked: bool = False,
    ) -> tuple[int, RawRecord]:
        """The stored form of a record and the partition it goes to, without writing it
        (for writers that append per partition themselves). A typed topic's value is
        checked against its schema unless ``checked`` says :meth:`check` already did."""
        if not checked:
            self.check([value])
        kb = _key_bytes(key)
        if partition is None:
            partition = self._partitioner.partition(kb, self._count())
        # a typed topic's value is stored as columns by the storage (a copy: a buffered
        # value may be changed by the caller before the flush); others as serde bytes
        stored = dict(value) if self._schema is not None else self._serde.serialize(value)
        raw = RawRecord(_ts_ms(timestamp), kb, stored, dict(headers or {}))
        return partition, raw

    def refresh(self) -> None:
        """Pick up partitions added since this producer was created."""
        self._partitions = self.log.topic(self.topic).partitions
        self._refresh_at = time.monotonic() + REFRESH_S

    def _count(self) -> int:
        """The partition count to place records by: the topic's, read again every
        :data:`REFRESH_S`."""
        if time.monotonic() >= self._refresh_at:
            self.refresh()
        return self._partitions

    def send(
        self,
        value: Any,
        *,
        key: bytes | str | int | None = None,
        timestamp: datetime | int | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> RecordMetadata:
        typed = self.check([value])
        p, raw = self.record(value, key, timestamp, headers, partition, checked=True)
        offset = self.log.storage.append(self.topic, p, [raw], typed)
        return RecordMetadata(self.topic, p, offset)

    def buffer(
        self,
        value: Any,
        *,
        key: bytes | str | int | None = None,
        timestamp: datetime | int | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> None:
        self._pending.append(self.record(value, key, timestamp, headers, None))

    def flush(self) -> list[RecordMetadata]:
        """Write buffered records, one batch per partition; their coordinates in order."""
        pending, self._pending = self._pending, []
        return self._append(pending)

    def send_batch(
        self,
        values: Iterable[Any] | Any,
        *,
        key_field: str | None = None,
        timestamp_field: str | None = None,
    ) -> list[RecordMetadata]:
        """Append many values (dicts, or rows of a ``pyarrow.Table``) as batches. An Arrow
        table whose columns already have a typed topic's types, keyed by a column, goes
        to storages that write columns as they are (:attr:`LogStorage.columnar`)
        without a Python object per record."""
        columns = self._columns(values, key_field, timestamp_field)
        if columns is None and key_field is None and timestamp_field is None:
            columns = self._bytes_columns(values)
        if columns is not None:
            return self._append_columns(*columns)
        items, typed = self._items(values, key_field, timestamp_field)
        return self._append(items, typed)

    def column_partitions(self, table: pa.Table, key_field: str) -> np.ndarray | None:
        """Each row's partition when :meth:`send_batch` would write ``table`` (keyed by
        ``key_field``) as columns — the partitions it will append to — else ``None``
        (it would take the row path)."""
        columns = self._columns(table, key_field, None)
        return None if columns is None else columns[0]

    def _columns(
        self, values: Any, key_field: str | None, timestamp_field: str | None
    ) -> tuple[np.ndarray, ColumnBatch] | None:
        """An Arrow table (or record batch) as one batch of columns and each row's
        partition — when it can go that way with exactly the row path's outcome: a
        typed topic on a columnar storage, the key-hash partitioner and a key column
        without nulls, every column of the topic's type (timestamps of any unit), an
        aware or integer timestamp column without nulls. ``None``: take the row path
        (which also names a value that does not fit)."""
        if not (
            self.log.storage.columnar
            and self._schema is not None
            and isinstance(values, pa.Table | pa.RecordBatch)
            and len(values)
            and key_field in values.column_names
            and self._partitioner.name == "key-hash"
        ):
            return None
        schema = schema_of(self._schema)
        names = values.column_names
        if schema is None or not set(names) <= set(schema.names):
            return None
        n = len(values)

        def column(name: str) -> pa.Array:
            col = values.column(name)
            return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col

        arrays = []
        for field in schema:
            if field.name not in names:
                arrays.append(pa.nulls(n, field.type))
                continue
            col = column(field.name)
            if col.type != field.type:
                if not (pa.types.is_timestamp(col.type) and pa.types.is_timestamp(field.type)):
                    return None
                try:
                    col = pc.cast(col, field.type)  # a lossless unit change, naive = UTC
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return None
            arrays.append(col)
        keys = column(str(key_field))
        if keys.null_count:
            return None
        if timestamp_field is None:
            stamps = np.full(n, now_ms(), dtype=np.int64)
        else:
            if timestamp_field not in names:
                return None
            col = column(timestamp_field)
            if col.null_count:
                return None
            if pa.types.is_timestamp(col.type) and col.type.tz is not None:
                ms = pc.cast(col, pa.timestamp("ms", tz=col.type.tz), safe=False)
                stamps = ms.cast(pa.int64()).to_numpy()
            elif pa.types.is_integer(col.type):
                stamps = col.to_numpy().astype(np.int64)
            else:
                return None  # naive or not a time: the row path says why
        # the partitioner runs once per distinct key, as the row path would per record
        encoded = pc.dictionary_encode(keys)
        distinct = [_key_bytes(k) for k in encoded.dictionary.to_pylist()]
        count = self._count()
        parts = np.array([self._partitioner.partition(k, count) for k in distinct], np.int64)
        indices = encoded.indices
        batch = ColumnBatch(
            stamps,
            pa.array(distinct, pa.binary()).take(indices),
            pa.StructArray.from_arrays(arrays, fields=list(schema)),
            None,
        )
        return parts[indices.to_numpy()], batch

    def _bytes_columns(self, values: Any) -> tuple[np.ndarray, ColumnBatch] | None:
        """A list of ``bytes`` for a ``bytes`` topic as one batch of columns and each
        value's partition — on a columnar storage, with a partitioner that can place
        records without a key in one step (the built-in ones), every value ``bytes``
        (anything else: the row path, which encodes a str or names what it cannot
        take). What the row path would store: no key, the time of the call."""
        spread = getattr(self._partitioner, "spread", None)
        if not (
            self.log.storage.columnar
            and self._schema is None
            and self._serde.name == "bytes"
            and spread is not None
            and isinstance(values, list)
            and values
            and all(type(v) is bytes for v in values)
        ):
            return None
        n = len(values)
        batch = ColumnBatch(
            np.full(n, now_ms(), dtype=np.int64),
            pa.nulls(n, pa.binary()),
            pa.array(values, pa.binary()),
            None,
        )
        return spread(n, self._count()), batch

    def _append_columns(self, partitions: np.ndarray, batch: ColumnBatch) -> list[RecordMetadata]:
        """Append ``batch`` as one batch per partition; its rows' coordinates in order."""
        by_partition: dict[int, list[int]] = {}
        parts = []
        for p in np.unique(partitions).tolist():
            rows = np.flatnonzero(partitions == p)
            take = pa.array(rows)
            part = ColumnBatch(
                batch.timestamps_ms[rows], batch.keys.take(take), batch.values.take(take), None
            )
            parts.append((p, part))
            by_partition[p] = rows.tolist()
        bases = self.log.storage.append_columns_parts(self.topic, parts)
        return self._metadata(len(batch), by_partition, bases)

    def send_batch_async(
        self,
        values: Iterable[Any] | Any,
        *,
        key_field: str | None = None,
        timestamp_field: str | None = None,
    ) -> Future[list[RecordMetadata]]:
        """:meth:`send_batch` without waiting for the log: a future of the records'
        coordinates. On diskless topics many calls in flight share one flush (one
        object, one commit), which is where a producer's throughput comes from; other
        logs append before returning. The values are checked here, all or nothing."""
        items, typed = self._items(values, key_field, timestamp_field)
        by_partition, parts = self._parts(items, typed)
        futures = self.log.storage.append_parts_async(self.topic, parts)
        done: Future[list[RecordMetadata]] = Future()
        left = [len(futures)]
        lock = threading.Lock()

        def one_done(_: Future[int]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                bases = [f.result() for f in futures]
            except Exception as exc:
                done.set_exception(exc)
            else:
                done.set_result(self._metadata(len(items), by_partition, bases))

        if not futures:  # nothing to send
            done.set_result([])
        for f in futures:
            f.add_done_callback(one_done)
        return done

    def _items(
        self, values: Iterable[Any] | Any, key_field: str | None, timestamp_field: str | None
    ) -> tuple[list[tuple[int, RawRecord]], Any]:
        if hasattr(values, "to_pylist"):
            values = values.to_pylist()
        values = values if isinstance(values, Sequence) else list(values)
        typed = self.check(values)  # all or nothing: one bad value and nothing is written
        items = []
        for value in values:
            key = value.get(key_field) if key_field and isinstance(value, dict) else None
            ts = value.get(timestamp_field) if timestamp_field and isinstance(value, dict) else None
            items.append(self.record(value, key, ts, None, None, checked=True))
        return items, typed

    @property
    def typed(self) -> bool:
        """Whether the topic is typed (a schema of fields) rather than serde bytes."""
        return self._schema is not None

    def batches(
        self, values: Sequence[Any], key_field: str | None = None
    ) -> list[tuple[int, ColumnBatch]]:
        """``values`` as this producer would append them — checked, encoded, placed by
        the topic's partitioner — one batch per partition, not appended (a caller that
        appends them its own way: :mod:`riverbed.log.group.transform`). A typed topic's
        values go as the checked columns (a struct of its fields), as its appends do."""
        items, typed = self._items(values, key_field, None)
        _, parts = self._parts(items, typed)
        out = []
        for p, rows, checked in parts:
            if checked is None:
                out.append((p, ColumnBatch.from_rows(rows)))
                continue
            stamps = np.array([r.timestamp_ms for r in rows], dtype=np.int64)
            keys = pa.array([r.key for r in rows], pa.binary())
            headers = [dict(r.headers) for r in rows] if any(r.headers for r in rows) else None
            out.append((p, ColumnBatch(stamps, keys, as_struct(checked), headers)))
        return out

    def _parts(
        self, items: Sequence[tuple[int, RawRecord]], typed: Any
    ) -> tuple[dict[int, list[int]], list[tuple[int, list[RawRecord], Any]]]:
        """``items`` per partition: their indexes, and (partition, records, typed)."""
        by_partition: dict[int, list[int]] = {}
        for i, (p, _) in enumerate(items):
            by_partition.setdefault(p, []).append(i)
        parts = []
        for p, indexes in by_partition.items():
            part = None
            if typed is not None:
                part = typed if len(by_partition) == 1 else typed.take(indexes)
            parts.append((p, [items[i][1] for i in indexes], part))
        return by_partition, parts

    def _metadata(
        self, count: int, by_partition: Mapping[int, list[int]], bases: Sequence[int]
    ) -> list[RecordMetadata]:
        """The coordinates of ``count`` records in the caller's order: those at
        ``by_partition[p]`` were appended to partition p from ``bases``' offset on."""
        if len(by_partition) == 1:  # all in one partition, in order
            ((p, _),), (base,) = by_partition.items(), bases
            return [RecordMetadata(self.topic, p, offset) for offset in range(base, base + count)]
        out: list[RecordMetadata | None] = [None] * count
        for (p, indexes), base in zip(by_partition.items(), bases, strict=True):
            for n, i in enumerate(indexes):
                out[i] = RecordMetadata(self.topic, p, base + n)
        return [m for m in out if m is not None]

    def _append(
        self, items: Sequence[tuple[int, RawRecord]], typed: Any = None
    ) -> list[RecordMetadata]:
        """Append ``items`` per partition; ``typed``: their checked values, if known."""
        by_partition, parts = self._parts(items, typed)
        bases = self.log.storage.append_parts(self.topic, parts)
        return self._metadata(len(items), by_partition, bases)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.flush()
