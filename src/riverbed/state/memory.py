"""The memory engine: same contract as RocksDB, nothing on local disk but checkpoints.

Databases live in the engine object (one per provider), keyed by path, so a
"re-open" in the same process sees what was committed — like a local disk would.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgpack

from riverbed.state.base import Engine, LocalDB, Op
from riverbed.state.errors import PartitionBusyError, StateError

_FILE = "state.msgpack"


class _Data:
    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}
        self.version = 0
        self.tag = 0

    def dump(self) -> bytes:
        packed: bytes = msgpack.packb(
            {
                "version": self.version,
                "tag": self.tag,
                "items": [[k, self.values[k]] for k in self.keys],
            }
        )
        return packed

    @classmethod
    def load(cls, raw: bytes) -> _Data:
        doc = msgpack.unpackb(raw)
        data = cls()
        data.version = int(doc["version"])
        data.tag = int(doc["tag"])
        data.keys = [bytes(k) for k, _ in doc["items"]]
        data.values = {bytes(k): bytes(v) for k, v in doc["items"]}
        return data


class MemoryLocalDB(LocalDB):
    def __init__(self, data: _Data, release: threading.Lock | None) -> None:
        self._d = data
        self._release = release

    @property
    def marker(self) -> tuple[int, int]:
        return (self._d.version, self._d.tag)

    def get(self, key: bytes) -> bytes | None:
        return self._d.values.get(key)

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        keys = self._d.keys
        lo = bisect.bisect_left(keys, start)
        hi = len(keys) if end is None else bisect.bisect_left(keys, end)
        for key in keys[lo:hi]:
            yield key, self._d.values[key]

    def last(self, start: bytes, end: bytes) -> bytes | None:
        keys = self._d.keys
        at = bisect.bisect_left(keys, end) - 1
        return keys[at] if at >= 0 and keys[at] >= start else None

    def apply(self, ops: Sequence[Op], version: int, tag: int) -> None:
        if self._release is None:
            raise StateError("this state database was opened read-only")
        d = self._d
        for kind, a, b in ops:
            if kind == "put":
                if a not in d.values:
                    bisect.insort(d.keys, a)
                d.values[a] = b
            elif kind == "del":
                if d.values.pop(a, None) is not None:
                    del d.keys[bisect.bisect_left(d.keys, a)]
            else:
                lo, hi = bisect.bisect_left(d.keys, a), bisect.bisect_left(d.keys, b)
                for key in d.keys[lo:hi]:
                    del d.values[key]
                del d.keys[lo:hi]
        d.version, d.tag = version, tag

    def checkpoint(self, dest: Path) -> None:
        dest.mkdir(parents=True)
        (dest / _FILE).write_bytes(self._d.dump())

    def close(self) -> None:
        if self._release is not None:
            self._release.release()
            self._release = None


class MemoryEngine(Engine):
    name = "memory"

    def __init__(self) -> None:
        self._dbs: dict[Path, _Data] = {}
        self._locks: dict[Path, threading.Lock] = {}
        self._mutex = threading.Lock()

    def open(self, path: Path) -> LocalDB:
        with self._mutex:
            lock = self._locks.setdefault(path, threading.Lock())
            data = self._dbs.setdefault(path, _Data())
        if not lock.acquire(blocking=False):
            raise PartitionBusyError(f"state database {path} is already open")
        return MemoryLocalDB(data, lock)

    def replace(self, db: LocalDB, path: Path, checkpoint: Path | None) -> LocalDB:
        assert isinstance(db, MemoryLocalDB)
        lock, db._release = db._release, None
        if lock is None:
            raise StateError(f"state database {path} was closed before its restore")
        try:
            data = _Data() if checkpoint is None else _Data.load((checkpoint / _FILE).read_bytes())
        except (OSError, ValueError) as exc:
            lock.release()
            raise StateError(f"cannot read state checkpoint {checkpoint}: {exc}") from exc
        with self._mutex:
            self._dbs[path] = data
        return MemoryLocalDB(data, lock)

    def reset(self, path: Path) -> None:
        """Forget the partition at ``path``: what losing the local disk is to RocksDB."""
        with self._mutex:
            self._dbs[path] = _Data()
