"""Partitioners: which partition a record goes to. A topic remembers its partitioner by
name; user-defined ones are registered on the :class:`~riverbed.log.Log` object."""

from __future__ import annotations

import itertools
import threading
import zlib
from collections.abc import Callable
from typing import Protocol

import numpy as np


class Partitioner(Protocol):
    name: str

    def partition(self, key: bytes | None, partitions: int) -> int: ...


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a key: CRC-32 of its bytes mod N — the one rule a keyed topic
    places records by and an aggregation places its state by (co-location needs both
    the same: :func:`riverbed.stream.rescale.partition_of`)."""
    return zlib.crc32(key) % partitions


class KeyHashPartitioner:
    """CRC32 of the key bytes mod N: the same on every process, machine and Python
    version (unlike ``hash()``). Records without a key are spread round-robin."""

    name = "key-hash"

    def __init__(self) -> None:
        self._fallback = RoundRobinPartitioner()

    def partition(self, key: bytes | None, partitions: int) -> int:
        if key is None:
            return self._fallback.partition(None, partitions)
        return key_partition(key, partitions)

    def spread(self, n: int, partitions: int) -> np.ndarray:
        """The partitions of ``n`` records without a key, in order: what ``n`` calls of
        :meth:`partition` with no key give."""
        return self._fallback.spread(n, partitions)


class RoundRobinPartitioner:
    name = "round-robin"

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def partition(self, key: bytes | None, partitions: int) -> int:
        with self._lock:
            return next(self._counter) % partitions

    def spread(self, n: int, partitions: int) -> np.ndarray:
        """What ``n`` calls of :meth:`partition` give, in one step."""
        with self._lock:
            first = next(self._counter)
            self._counter = itertools.count(first + n)
        return np.arange(first, first + n, dtype=np.int64) % partitions


BUILTIN_PARTITIONERS: dict[str, Callable[[], Partitioner]] = {
    "key-hash": KeyHashPartitioner,
    "round-robin": RoundRobinPartitioner,
}
