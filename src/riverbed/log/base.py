"""The storage interface of the log, and a topic's configuration."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from riverbed.log.records import Columns, RawRecord

Fsync = Literal["batch", "interval", "never"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")


def check_topic_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(
            f"topic name {name!r} must be letters, digits, '_', '.', '-' and start with a "
            "letter or digit"
        )


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

    def __post_init__(self) -> None:
        check_topic_name(self.name)
        if self.partitions < 1:
            raise ValueError(f"a topic needs at least 1 partition, got {self.partitions}")
        if self.fsync not in ("batch", "interval", "never"):
            raise ValueError(f"fsync must be batch, interval or never, not {self.fsync!r}")
        if self.segment_bytes < 1024:
            raise ValueError("segment_bytes must be at least 1024")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LogStorage(ABC):
    url: str

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
    def append(self, topic: str, partition: int, records: Sequence[RawRecord]) -> int:
        """Append a batch atomically; returns the offset of its first record."""

    @abstractmethod
    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        """Up to ``max_records`` whole records from ``offset`` on (fewer at the end)."""

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        """Records [start, end) column by column, without a Python object per record
        (what the Spark source and the stream engine read). Storages may do better than
        this default."""
        from riverbed.log.records import ColumnBatch

        chunks = []
        offset = start
        while offset < end:
            records = self.read(topic, partition, offset, min(end - offset, 10_000))
            if not records:
                break
            chunks.append(ColumnBatch.from_rows([r for _, r in records]))
            offset = records[-1][0] + 1
        return Columns.concat(start, chunks)

    @abstractmethod
    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(first retained offset, next offset to be written)."""

    @abstractmethod
    def enforce_retention(self, topic: str) -> int:
        """Drop whole old segments beyond the topic's retention; returns how many."""

    def close(self) -> None:  # noqa: B027 - optional hook: most storages hold nothing
        """Release files and locks."""
