"""Objects in this process's memory: ``memory://name`` (every store opened with the
same name shares the objects, until the process ends). For tests and examples."""

from __future__ import annotations

import threading
import time

from riverbed.storage.base import ObjectInfo, ObjectStore, check_key
from riverbed.storage.errors import ObjectNotFoundError, StorageValueError

_SPACES: dict[str, dict[str, bytes]] = {}
_TIMES: dict[tuple[str, str], float] = {}
_LOCK = threading.Lock()


class MemoryStore(ObjectStore):
    def __init__(self, name: str = "default") -> None:
        self.url = f"memory://{name}"
        with _LOCK:
            self._objects = _SPACES.setdefault(name, {})

    def _check_tree(self, key: str) -> None:
        """As the file backend: a key is not also a directory of keys (base.py)."""
        check_key(key)
        parts = key.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self._objects:
                raise StorageValueError(
                    f"object key {key!r} is below a key that is an object itself"
                )
        if any(k.startswith(key + "/") for k in self._objects):
            raise StorageValueError(f"object key {key!r} is already the directory of other keys")

    def put(self, key: str, data: bytes) -> None:
        with _LOCK:
            self._check_tree(key)
            self._objects[key] = bytes(data)
            _TIMES[self.url, key] = time.time()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with _LOCK:
            if check_key(key) in self._objects:
                return False
            self._check_tree(key)
            self._objects[key] = bytes(data)
            _TIMES[self.url, key] = time.time()
            return True

    def get(self, key: str) -> bytes:
        with _LOCK:
            try:
                return self._objects[check_key(key)]
            except KeyError:
                raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.get(key)[start:end]

    def get_prefix(self, key: str, n: int) -> tuple[bytes, int]:
        data = self.get(key)
        return data[:n], len(data)

    def head(self, key: str) -> ObjectInfo | None:
        with _LOCK:
            data = self._objects.get(check_key(key))
        return None if data is None else ObjectInfo(key, len(data), _TIMES.get((self.url, key), 0))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        with _LOCK:
            found = [
                ObjectInfo(k, len(v), _TIMES.get((self.url, k), 0.0))
                for k, v in self._objects.items()
                if k.startswith(prefix)
            ]
        return sorted(found, key=lambda o: o.key)

    def move(self, src: str, dst: str) -> None:
        with _LOCK:
            try:
                data = self._objects.pop(check_key(src))
            except KeyError:
                raise ObjectNotFoundError(f"no object {src!r} in {self.url}") from None
            try:
                self._check_tree(check_key(dst))
            except BaseException:
                self._objects[src] = data
                raise
            self._objects[dst] = data
            _TIMES[self.url, dst] = time.time()

    def delete(self, key: str) -> None:
        with _LOCK:
            self._objects.pop(check_key(key), None)


__all__ = ["MemoryStore"]
