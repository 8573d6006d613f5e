"""``memory://``: topics in this process's memory (tests, notebooks)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from riverbed.log.base import LogStorage, TopicConfig, typed_values
from riverbed.log.errors import (
    LogValueError,
    OffsetOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import RawRecord
from riverbed.log.schema import from_batch


class MemoryLogStorage(LogStorage):
    waits = True

    def __init__(self) -> None:
        self.url = "memory://"
        self._topics: dict[str, TopicConfig] = {}
        self._data: dict[tuple[str, int], list[RawRecord]] = {}
        self._start: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._appended = threading.Condition(self._lock)

    def create_topic(self, config: TopicConfig) -> None:
        with self._lock:
            if config.name in self._topics:
                raise TopicExistsError(f"topic '{config.name}' already exists")
            self._topics[config.name] = config

    def topic_config(self, name: str) -> TopicConfig:
        try:
            return self._topics[name]
        except KeyError:
            raise TopicNotFoundError(name) from None

    def list_topics(self) -> list[str]:
        return sorted(self._topics)

    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        with self._lock:
            config = self.topic_config(name)
            ends = [self._end((name, p)) for p in range(config.partitions)]
            self._topics[name] = config.grown(partitions, ends)
            return self._topics[name]

    def _check(self, topic: str, partition: int) -> None:
        config = self.topic_config(topic)
        if not 0 <= partition < config.partitions:
            raise LogValueError(
                f"topic '{topic}' has partitions 0..{config.partitions - 1}, not {partition}"
            )

    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        self._check(topic, partition)
        typed = typed_values(topic, self.topic_config(topic), records, typed)
        if typed is not None:  # keep copies of the values, as the schema types them
            records = [replace(r, value=v) for r, v in zip(records, from_batch(typed), strict=True)]
        with self._lock:
            base = self._end((topic, partition))
            self._data.setdefault((topic, partition), []).extend(records)
            self._appended.notify_all()
            return base

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        self._check(topic, partition)
        with self._lock:
            data = self._data.get((topic, partition), [])
            start = self._start.get((topic, partition), 0)
            if offset < start:
                raise OffsetOutOfRangeError(
                    f"offset {offset} of {topic}/{partition} was removed by retention "
                    f"(first retained: {start})"
                )
            i = offset - start
            return [(start + i + n, r) for n, r in enumerate(data[i : i + max_records])]

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        self._check(topic, partition)
        with self._lock:
            return self._start.get((topic, partition), 0), self._end((topic, partition))

    def size(self, topic: str, partition: int) -> int:
        """Bytes of the stored keys and serialized values (typed values: not counted)."""
        self._check(topic, partition)
        with self._lock:
            return sum(
                len(r.key or b"") + (len(r.value) if isinstance(r.value, bytes) else 0)
                for r in self._data.get((topic, partition), [])
            )

    def _end(self, tp: tuple[str, int]) -> int:
        """The next offset of partition ``tp`` (the caller holds the lock)."""
        return self._start.get(tp, 0) + len(self._data.get(tp, []))

    def wait(self, positions: Mapping[tuple[str, int], int], timeout: float) -> bool:
        with self._appended:
            return self._appended.wait_for(
                lambda: any(self._end(tp) > o for tp, o in positions.items()), timeout
            )

    def enforce_retention(self, topic: str) -> int:
        return 0
