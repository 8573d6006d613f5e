"""Interfaces of the state layer: local engines and their atomic version marker.

A :class:`LocalDB` is one partition's state on this machine. It is written only by
:meth:`LocalDB.apply`, which applies a whole batch of operations *and* the new
version marker atomically, so a local database is always exactly at some version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol, TypeAlias

# ("put", key, value) | ("del", key, b"") | ("range", start, end): delete start <= key < end
OpKind = Literal["put", "del", "range"]
Op: TypeAlias = tuple[OpKind, bytes, bytes]


class LocalDB(ABC):
    """One partition's local state, at one version."""

    @property
    @abstractmethod
    def marker(self) -> tuple[int, int]:
        """(version, tag) this database holds: (0, 0) when empty. The tag is the checksum
        of the version's changelog, so a database from another history is recognised."""

    @property
    def version(self) -> int:
        return self.marker[0]

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    @abstractmethod
    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` (``end=None``: to the last key), by key."""

    def last(self, start: bytes, end: bytes) -> bytes | None:
        """The greatest key with ``start <= key < end``; None when there is none (an
        engine answers with one seek; this default walks the range)."""
        found = None
        for key, _ in self.scan(start, end):
            found = key
        return found

    @abstractmethod
    def apply(self, ops: Sequence[Op], version: int, tag: int) -> None:
        """Apply ``ops`` and set the (version, tag) marker, atomically."""

    @abstractmethod
    def checkpoint(self, dest: Path) -> None:
        """Write a consistent copy of the database into the new directory ``dest``."""

    @abstractmethod
    def close(self) -> None: ...


class Engine(ABC):
    """Opens and restores local databases of one kind."""

    name: str

    @abstractmethod
    def open(self, path: Path) -> LocalDB:
        """Open (or create) the database at ``path``; PartitionBusyError if held elsewhere."""

    @abstractmethod
    def replace(self, db: LocalDB, path: Path, checkpoint: Path | None) -> LocalDB:
        """Close ``db`` (open at ``path``) and open in its place the checkpoint directory
        (consumed), or an empty database (version 0) when ``checkpoint`` is None —
        without letting go of the partition in between: no other opener gets it while
        its contents are swapped. On failure the partition is let go."""


class Committer(Protocol):
    """How a store hands its staged batch to whoever keeps it durable (the provider):
    ``(namespace, partition, db, (base version, base tag), new version, ops)``."""

    def __call__(
        self,
        namespace: str,
        partition: int,
        db: LocalDB,
        base: tuple[int, int],
        new: int,
        ops: Sequence[Op],
    ) -> None: ...
