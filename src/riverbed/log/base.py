"""The storage interface of the log, and a topic's configuration."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa

from riverbed.log.errors import LogError, LogValueError
from riverbed.log.records import (
    ColumnBatch,
    Columns,
    RawRecord,
    Record,
    StoredBatch,
    encode_columns,
)


@dataclass(frozen=True)
class Damage:
    """A stretch of a partition that cannot be read: where, and which offsets."""

    path: str
    position: int  # byte of the first bad batch in ``path``
    start: int  # first offset that cannot be read
    end: int | None  # first readable offset after it (None: not known — a damaged tail)
    resume: int | None  # byte where readable batches start again in ``path``
    upper: int | None = None  # a damaged tail: no offset at or past this was written

    def describe(self) -> str:
        if self.end is not None:
            span = f"offsets {self.start}..{self.end - 1} cannot be read"
        else:
            span = (
                f"offsets from {self.start} (fewer than {self.upper}) cannot be read, and "
                "nothing readable follows"
            )
        return f"bad batch at byte {self.position} of {self.path}; {span}"

    @property
    def span_end(self) -> int:
        """The end of the offsets a skip must cover."""
        end = self.end if self.end is not None else self.upper
        assert end is not None
        return end


@dataclass(frozen=True)
class PartitionReport:
    partition: int
    start: int
    end: int
    batches: int = 0
    bytes: int = 0
    damage: tuple[Damage, ...] = ()  # not covered by a skip
    skipped: tuple[Damage, ...] = ()  # covered by a recorded skip
    index_problems: tuple[str, ...] = ()
    torn_tail: int = 0  # bytes of an unfinished append at the end (truncated on next append)

    @property
    def ok(self) -> bool:
        return not self.damage and not self.index_problems


Fsync = Literal["batch", "interval", "never"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")


def check_topic_name(name: str) -> None:
    if not _NAME.match(name):
        raise LogValueError(
            f"topic name {name!r} must be letters, digits, '_', '.', '-' and start with a "
            "letter or digit"
        )


@dataclass(frozen=True)
class SkippedRange:
    """Offsets [start, end) of one partition that an operator chose to read past after
    they were found corrupt (``riverbed topic skip``). Readers consult it only where a
    damaged batch stops them, so a skip never hides a readable record."""

    partition: int
    start: int
    end: int
    reason: str = ""

    def covers(self, partition: int, start: int, end: int) -> bool:
        return partition == self.partition and self.start <= start and end <= self.end


@dataclass(frozen=True)
class Placement:
    """One ``riverbed topic alter --partitions``: from offset ``starts[p]`` of each
    partition ``p`` the topic had before (the ends at the alter, read under the
    appends' locks), records are placed by ``partitions`` partitions; the partitions it
    added hold only records placed by it or a later alter. A producer picks the new
    count up within :data:`~riverbed.log.log.REFRESH_S`; a record a stale producer
    placed by the old count after ``starts`` is still found by the reader that relies
    on placement (a co-located aggregation checks every key and runs that batch
    shuffled), so a boundary is where placement changes, not a promise about every
    record past it."""

    partitions: int
    starts: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "starts": list(self.starts)}

    def starts_text(self) -> str:
        """``0:4120 1:3988 2:4031`` — partition:offset, as the CLI and plans show it."""
        return " ".join(f"{p}:{o}" for p, o in enumerate(self.starts))


def placed_at(config: TopicConfig, partition: int, offset: int) -> int:
    """The partition count by which the record at ``offset`` of ``partition`` was placed."""
    count = len(config.epochs[0].starts) if config.epochs else config.partitions
    for epoch in config.epochs:
        if partition < len(epoch.starts):
            if offset < epoch.starts[partition]:
                break  # written before this alter (and so before every later one)
            count = epoch.partitions
        elif partition < epoch.partitions:
            count = epoch.partitions  # a partition this alter added
    return count


def placed_by(config: TopicConfig, partition: int, start: int, end: int) -> int | None:
    """The one partition count that placed records [start, end) of ``partition``; None
    when an alter's boundary lies inside (or the range is empty)."""
    if end <= start:
        return None
    first = placed_at(config, partition, start)
    return first if placed_at(config, partition, end - 1) == first else None


def next_boundary(config: TopicConfig, partition: int, offset: int) -> int | None:
    """The first offset past ``offset`` of ``partition`` where placement changes (so a
    reader can end a batch there); None: none recorded."""
    later = [
        e.starts[partition]
        for e in config.epochs
        if partition < len(e.starts) and e.starts[partition] > offset
    ]
    return min(later) if later else None


@dataclass(frozen=True)
class TopicConfig:
    name: str
    partitions: int
    partitioner: str = "key-hash"
    serde: str = "json"
    segment_bytes: int = 64 * 1024 * 1024
    retention_bytes: int | None = None  # per partition
    retention_ms: int | None = None
    fsync: Fsync = "batch"
    fsync_interval_ms: int = 1000
    skipped: tuple[SkippedRange, ...] = ()
    schema: str | None = None  # a typed topic's fields, e.g. "user_id long, ts timestamp"
    epochs: tuple[Placement, ...] = ()  # each `topic alter --partitions`, oldest first

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TopicConfig:
        from riverbed.formats import check

        data = dict(data)
        check("topic", data.pop("format", None), f"topic {data.get('name')!r}")
        skipped = tuple(SkippedRange(**s) for s in data.get("skipped", ()))
        epochs = tuple(
            Placement(int(e["partitions"]), tuple(int(o) for o in e["starts"]))
            for e in data.get("epochs", ())
        )
        return TopicConfig(**{**data, "skipped": skipped, "epochs": epochs})

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if self.partitions < 1:
            raise LogValueError(f"a topic needs at least 1 partition, got {self.partitions}")
        if self.fsync not in ("batch", "interval", "never"):
            raise LogValueError(f"fsync must be batch, interval or never, not {self.fsync!r}")
        if self.segment_bytes < 1024:
            raise LogValueError("segment_bytes must be at least 1024")
        if self.schema is not None:
            from riverbed.log.schema import parse_schema, schema_ddl

            if self.serde not in ("json", "msgpack"):
                raise LogValueError(
                    f"a typed topic holds records of named fields; serde {self.serde!r} "
                    "holds raw bytes: use --serde json (the default) or msgpack"
                )
            # canonical spelling, so topic.json and `describe` read the same everywhere
            object.__setattr__(self, "schema", schema_ddl(parse_schema(self.schema)))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.skipped:
            del data["skipped"]  # topic.json stays as it was for healthy topics
        if self.schema is None:
            del data["schema"]  # and for untyped ones
        # version 2 only where it says more than version 1 could: a topic never altered
        # stays readable by the riverbed before alters were recorded
        data["format"] = 1
        if self.epochs:
            data["epochs"] = [e.to_dict() for e in self.epochs]
            data["format"] = 2
        else:
            del data["epochs"]
        return data

    def check_growth(self, partitions: int) -> None:
        """Refuse fewer partitions: a key's records would be split between where the old
        count and the new one put them, and readers' positions would name partitions
        gone."""
        if partitions < self.partitions:
            raise LogValueError(
                f"topic '{self.name}' has {self.partitions} partitions; partitions can be "
                "added, never removed"
            )

    def grown(self, partitions: int, ends: Sequence[int]) -> TopicConfig:
        """This topic altered to ``partitions`` partitions (:meth:`check_growth`),
        ``ends`` (one per partition it has) the offsets where the new placement
        begins."""
        self.check_growth(partitions)
        if partitions == self.partitions:
            return self
        epoch = Placement(partitions, tuple(int(e) for e in ends))
        assert len(epoch.starts) == self.partitions
        return replace(self, partitions=partitions, epochs=(*self.epochs, epoch))


def check_values(topic: str, ddl: str | None, values: Sequence[Any], scope: str) -> Any:
    """``values`` (mappings) as one Arrow record batch of the typed topic's schema
    ``ddl`` (``None`` for an untyped topic); one that does not fit raises
    :class:`RecordRejectedError` naming it, its field and why, and that nothing of the
    ``scope`` ("call", "batch") was written."""
    if ddl is None:
        return None
    from riverbed.log.errors import RecordRejectedError
    from riverbed.log.schema import ValueMismatch, schema_of, to_batch

    try:
        return to_batch(values, schema_of(ddl))
    except ValueMismatch as exc:
        where = f"record {exc.index}: " if len(values) > 1 else ""
        field = f"field '{exc.field}' " if exc.field is not None else "the record "
        raise RecordRejectedError(
            f"topic '{topic}' ({ddl}) refused {where}{field}{exc.reason}; "
            f"nothing of this {scope} was written",
            index=exc.index,
            field=exc.field,
            reason=exc.reason,
        ) from None


def typed_values(
    topic: str, config: TopicConfig, records: Sequence[RawRecord], typed: Any = None
) -> Any:
    """A typed topic's values as one Arrow record batch of its schema (``None`` for an
    untyped topic): ``typed`` when a producer checked them already, else checked here,
    for writers that bypass producers (:func:`check_values`)."""
    if config.schema is None:
        return None
    if typed is not None:
        return typed
    return check_values(topic, config.schema, [r.value for r in records], "batch")


def value_type(config: TopicConfig) -> pa.DataType:
    """The Arrow type of a topic's values as columns: serde bytes (``binary``), or a typed
    topic's struct of its schema."""
    if config.schema is None:
        return pa.binary()
    from riverbed.log.schema import schema_of

    schema = schema_of(config.schema)
    assert schema is not None
    return pa.struct(list(schema))


def values_mismatch(config: TopicConfig, got: pa.DataType | None) -> str | None:
    """Why values of Arrow type ``got`` (None: no values column) cannot be appended to
    the topic, naming both types; None when they can."""
    if got == value_type(config):
        return None
    what = f"typed ({config.schema})" if config.schema else "untyped (serde bytes)"
    return (
        f"topic '{config.name}' is {what}, but these values are {got}; the writer's view "
        "of the topic is out of date: open the log again"
    )


def check_column_values(config: TopicConfig, values: pa.Array) -> None:
    """Refuse values given as a column whose type is not the topic's, naming both."""
    problem = values_mismatch(config, values.type)
    if problem:
        raise LogValueError(problem)


class LogStorage(ABC):
    url: str
    waits = False  # whether wait() blocks until an append (else callers poll)
    read_only = False  # a storage riverbed only reads (a Kafka cluster's topics)
    idempotent = False  # whether append_once() recognises a client's retried batch
    # whether append_columns() writes the columns as they are, with no Python object per
    # record (a producer then sends an Arrow table that way: Producer.send_batch)
    columnar = False

    @abstractmethod
    def create_topic(self, config: TopicConfig) -> None: ...

    @abstractmethod
    def topic_config(self, name: str) -> TopicConfig: ...

    @abstractmethod
    def list_topics(self) -> list[str]: ...

    @abstractmethod
    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        """Grow a topic to ``partitions``; shrinking is refused."""

    @abstractmethod
    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        """Append a batch atomically; returns the offset of its first record. For a
        typed topic, ``typed`` may carry the values already checked as one Arrow record
        batch (a producer's :meth:`~riverbed.log.Producer.check`); else the storage
        checks them (:func:`typed_values`)."""

    def append_columns(self, topic: str, partition: int, batch: ColumnBatch) -> int:
        """:meth:`append` of a batch given as columns (what a log server receives), without
        a Python object per record where the storage can; returns its base offset."""
        config = self.topic_config(topic)
        check_column_values(config, batch.values)
        if config.schema is None:
            return self.append(topic, partition, batch.rows())
        # a typed topic's values go as the checked columns: records without them
        headers = batch.headers or [{}] * len(batch)
        records = [
            RawRecord(ts, key, None, h or {})
            for ts, key, h in zip(
                batch.timestamps_ms.tolist(), batch.keys.to_pylist(), headers, strict=True
            )
        ]
        return self.append(
            topic, partition, records, pa.RecordBatch.from_struct_array(batch.values)
        )

    def append_columns_parts(
        self, topic: str, parts: Sequence[tuple[int, ColumnBatch]]
    ) -> list[int]:
        """:meth:`append_columns` of a batch for each of several partitions — (partition,
        columns) — returning each one's base offset; each batch is atomic, not the whole
        call. Storages that commit many batches at once (diskless topics) take them
        together."""
        return [self.append_columns(topic, p, batch) for p, batch in parts]

    def append_parts(
        self, topic: str, parts: Sequence[tuple[int, Sequence[RawRecord], Any]]
    ) -> list[int]:
        """:meth:`append` of a batch for each of several partitions — (partition,
        records, typed) — returning each one's base offset; each batch is atomic, not
        the whole call. Storages that commit many batches at once (diskless topics: one
        object and one transaction per flush) take them together."""
        return [self.append(topic, p, records, typed) for p, records, typed in parts]

    def append_parts_async(
        self, topic: str, parts: Sequence[tuple[int, Sequence[RawRecord], Any]]
    ) -> list[Future[int]]:
        """:meth:`append_parts` without waiting: a future of each part's base offset.
        Storages that group appends (diskless topics) let many calls share a flush; the
        others append here and return futures already done."""
        out: list[Future[int]] = []
        for p, records, typed in parts:
            done: Future[int] = Future()
            try:
                done.set_result(self.append(topic, p, records, typed))
            except Exception as exc:
                done.set_exception(exc)
            out.append(done)
        return out

    def append_once(
        self, topic: str, partition: int, batch: ColumnBatch, producer: str, sequence: int
    ) -> int:
        """:meth:`append_columns`, where a batch this ``producer`` appended before under
        the same ``sequence`` is not written again: its first offset is returned again
        (what lets a client retry an append whose answer it never got, on any server).
        Only storages whose ``idempotent`` is true."""
        raise LogValueError(
            f"{self.url} cannot recognise a retried batch; only diskless topics "
            "(s3://bucket/prefix) can"
        )

    @abstractmethod
    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        """Up to ``max_records`` whole records from ``offset`` on (fewer at the end)."""

    def read_only_error(self, what: str) -> LogError:
        """The error for a write to a storage riverbed only reads (:attr:`read_only`)."""
        return LogValueError(f"{self.url} is read-only through riverbed's log: {what}")

    def read_waiting(
        self, topic: str, partition: int, offset: int, max_records: int, wait: float
    ) -> list[tuple[int, RawRecord]]:
        """:meth:`read`, and at the end wait up to ``wait`` seconds for an append (here:
        :meth:`wait`, then read again; a log server does both in one fetch)."""
        rows = self.read(topic, partition, offset, max_records)
        if rows or wait <= 0 or not self.wait({(topic, partition): offset}, wait):
            return rows
        return self.read(topic, partition, offset, max_records)

    def read_stored(
        self, topic: str, partition: int, start: int, end: int, max_bytes: int
    ) -> Iterator[StoredBatch]:
        """The batches holding records [start, end) as stored, in order, up to
        ``max_bytes`` of them (always at least one, so a reader moves on): what a log
        server streams for a fetch. Storages that keep no encoded batches encode what they
        read."""
        from riverbed.log.schema import schema_of

        schema = schema_of(self.topic_config(topic).schema)
        rows = self.read(topic, partition, start, min(end - start, 10_000))
        size = 0
        i = 0
        while i < len(rows) and (not size or size < max_bytes):
            j = i + 1  # a contiguous run, cut until it fits what is left of max_bytes
            while j < len(rows) and rows[j][0] == rows[j - 1][0] + 1:
                j += 1
            while True:
                run = [r for _, r in rows[i:j]]
                body = encode_columns(ColumnBatch.from_rows(run, schema)).body
                if size + len(body) <= max_bytes or j - i == 1:
                    break
                j = i + (j - i) // 2
            if size and size + len(body) > max_bytes:
                return
            yield StoredBatch(rows[i][0], len(run), body)
            size += len(body)
            i = j

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        """Records [start, end) column by column, without a Python object per record
        (what the Spark source and the stream engine read). Storages may do better than
        this default."""
        from riverbed.log.schema import schema_of

        schema = schema_of(self.topic_config(topic).schema)
        chunks = []
        offset = start
        while offset < end:
            records = self.read(topic, partition, offset, min(end - offset, 10_000))
            if not records:
                break
            chunks.append(ColumnBatch.from_rows([r for _, r in records], schema))
            offset = records[-1][0] + 1
        return Columns.concat(start, chunks)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record's timestamp is at or after ``timestamp_ms``, or
        the partition's end when none is (Kafka's offsetsForTimes). Exact also when
        producers stamped records out of order: it looks at every timestamp before the
        one it finds (storages read only their timestamps)."""
        start, end = self.offsets(topic, partition)
        at = start
        while at < end:
            columns = self.read_columns(topic, partition, at, min(end, at + 100_000))
            if not len(columns):
                break
            hits = np.flatnonzero(columns.timestamps_ms >= timestamp_ms)
            if len(hits):
                return int(columns.offsets[hits[0]])
            at = int(columns.offsets[-1]) + 1
        return end

    @abstractmethod
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first retained offset, next offset to be written)."""

    def object_stats(self) -> dict[str, Any] | None:
        """Diskless topics: what their processes wrote to and read from the bucket lately
        (:func:`riverbed.log.diskless.summarize`); None for storages without objects."""
        return None

    def size(self, topic: str, partition: int) -> int | None:
        """Bytes a partition takes where it is stored (None: this storage cannot tell)."""
        return None

    def wait(self, positions: Mapping[tuple[str, int], int], timeout: float) -> bool:
        """Block until one of ``positions`` ((topic, partition) → offset) holds a record
        at or past its offset, or ``timeout`` seconds pass; whether one does. Storages
        that cannot be told of appends (``waits`` is false) only look once."""
        return any(self.offsets(t, p)[1] > o for (t, p), o in positions.items())

    def verify(self, topic: str, rebuild_indexes: bool = False) -> list[PartitionReport]:
        """Check every stored batch of ``topic``. Storages that cannot be damaged on
        disk report each partition's offsets."""
        config = self.topic_config(topic)
        return [PartitionReport(p, *self.offsets(topic, p)) for p in range(config.partitions)]

    def skip(self, topic: str, partition: int, start: int, end: int, reason: str) -> TopicConfig:
        """Record that readers may read past damaged offsets [start, end) of a partition."""
        raise LogValueError(
            f"{self.url} topics cannot be damaged on disk; there is nothing to skip"
        )

    @abstractmethod
    def enforce_retention(self, topic: str) -> int:
        """Drop whole old segments beyond the topic's retention; returns how many."""

    def close(self) -> None:  # noqa: B027 - optional hook: most storages hold nothing
        """Release files and locks."""


class Sender(Protocol):
    """What a consumer needs of a producer (the dead-letter topic's; a transform's
    output, :mod:`riverbed.log.group.transform`)."""

    @property
    def topic(self) -> str: ...

    @property
    def typed(self) -> bool: ...

    def send(
        self,
        value: Any,
        *,
        key: bytes | str | int | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> Any: ...

    def batches(
        self, values: Sequence[Any], key_field: str | None = None
    ) -> list[tuple[int, ColumnBatch]]: ...


class TopicLog(Protocol):
    """What consumer groups need of a log (:class:`riverbed.log.Log` is one): so the
    group package depends on this interface, and the log on the group package."""

    storage: LogStorage

    def topic(self, name: str) -> TopicConfig: ...

    def read(
        self, topic: str, partition: int, offset: int = 0, max_records: int = 1000, wait: float = 0
    ) -> list[Record]: ...

    def producer(self, topic: str) -> Sender: ...
