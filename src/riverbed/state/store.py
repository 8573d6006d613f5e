"""A partition's state at one version, with staged changes until commit.

Commit protocol (:meth:`StateStore.commit`):

1. encode this batch's operations as the changelog of the new version, recording the
   version it is based on;
2. write it to durable storage atomically (temp + fsync + rename) — from here on the
   version is committed: any machine can rebuild it;
3. apply the same operations and the new version marker to the local database in one
   atomic batch;
4. let the provider write a snapshot if one is due, then release the local database.

A crash after 2 and before 3 leaves the local database one version behind; the next
load notices and replays the changelog. A crash before 2 leaves nothing.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence

from riverbed.state.base import Committer, LocalDB, Op
from riverbed.state.errors import StateValueError, StoreClosedError


def prefix_end(prefix: bytes) -> bytes | None:
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class StateStore:
    """Read and stage writes on one partition at :attr:`version`; then commit or abort."""

    def __init__(
        self,
        commit: Committer,
        namespace: str,
        partition: int,
        db: LocalDB,
        release: Callable[[LocalDB], None] | None = None,
    ) -> None:
        self._commit = commit  # the provider's: durable changelog, then the local db
        self._let_go = release  # what is done with the database after (default: closed)
        self.namespace = namespace
        self.partition = partition
        self.version, self._tag = db.marker
        self._db: LocalDB | None = db
        self._ops: list[Op] = []
        self._staged: dict[bytes, bytes | None] = {}  # None: deleted
        self._ranges: list[tuple[bytes, bytes]] = []  # deleted ranges, older than _staged

    def __repr__(self) -> str:
        state = "open" if self._db else "closed"
        return (
            f"StateStore({self.namespace!r}, partition={self.partition}, "
            f"version={self.version}, staged={len(self._ops)}, {state})"
        )

    def _live(self) -> LocalDB:
        if self._db is None:
            raise StoreClosedError(
                f"store {self.namespace}/{self.partition} was already committed or aborted; "
                "load it again"
            )
        return self._db

    # -- reads -------------------------------------------------------------------------
    def _in_ranges(self, key: bytes) -> bool:
        return any(start <= key < end for start, end in self._ranges)

    def get(self, key: bytes) -> bytes | None:
        db = self._live()
        if key in self._staged:
            return self._staged[key]
        if self._ranges and self._in_ranges(key):
            return None
        return db.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        db = self._live()
        if not self._staged and not self._ranges:
            return db.get_many(keys)
        return [self.get(k) for k in keys]

    def scan(
        self, prefix: bytes = b"", *, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs under ``prefix`` (or in ``[start, end)``), by key, staged changes included."""
        db = self._live()
        lo = prefix if start is None else start
        hi = prefix_end(prefix) if end is None and start is None else end
        staged = sorted(
            (k, v) for k, v in self._staged.items() if k >= lo and (hi is None or k < hi)
        )
        if not staged and not self._ranges:  # nothing to lay over the stored pairs
            yield from db.scan(lo, hi)
            return
        staged_keys = {k for k, _ in staged}
        stored: Iterable[tuple[bytes, bytes | None]] = (
            (k, v)
            for k, v in db.scan(lo, hi)
            if k not in staged_keys and not (self._ranges and self._in_ranges(k))
        )
        for key, value in heapq.merge(stored, staged, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def last(self, start: bytes, end: bytes) -> bytes | None:
        """The greatest key with ``start <= key < end``, staged changes included; None
        when there is none. One seek while nothing is staged (a store just loaded)."""
        db = self._live()
        if not self._staged and not self._ranges:
            return db.last(start, end)
        found = None
        for key, _ in self.scan(start=start, end=end):
            found = key
        return found

    # -- writes ------------------------------------------------------------------------
    def put(self, key: bytes, value: bytes) -> None:
        self._live()
        self._ops.append(("put", key, value))
        self._staged[key] = value

    def put_many(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        """:meth:`put` of each (key, value) pair, in order."""
        self._live()
        self._ops.extend([("put", k, v) for k, v in pairs])
        self._staged.update(pairs)

    def delete(self, key: bytes) -> None:
        self._live()
        self._ops.append(("del", key, b""))
        self._staged[key] = None

    def delete_range(self, start: bytes, end: bytes) -> None:
        """Delete every key in ``[start, end)`` — one cheap operation, however many keys."""
        self._live()
        if start >= end:
            return
        self._ops.append(("range", start, end))
        for key in [k for k in self._staged if start <= k < end]:
            del self._staged[key]
        bisect.insort(self._ranges, (start, end))

    @property
    def pending(self) -> int:
        """Operations staged since load."""
        return len(self._ops)

    # -- end of the batch --------------------------------------------------------------
    def commit(self, version: int | None = None) -> int:
        """Make ``version`` (default: loaded version + 1) from the loaded one plus the staged
        changes; returns it. See the module docstring for the protocol."""
        db = self._live()
        new = self.version + 1 if version is None else version
        if new <= self.version:
            raise StateValueError(
                f"cannot commit version {new} on top of version {self.version}; "
                "versions only grow (load an older version to redo a batch)"
            )
        try:
            self._commit(
                self.namespace, self.partition, db, (self.version, self._tag), new, self._ops
            )
        except BaseException:
            self._release(whole=False)  # the local copy may be half-way: closed
            raise
        self._release()
        self.version = new
        return new

    def abort(self) -> None:
        """Discard the staged changes and release the partition."""
        if self._db is not None:
            self._release()

    def _release(self, whole: bool = True) -> None:
        db, self._db = self._db, None
        self._ops, self._staged, self._ranges = [], {}, []
        if db is None:
            return
        if whole and self._let_go is not None:
            self._let_go(db)
        else:
            db.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Leaving the block without commit() discards the changes.
        self.abort()
