"""Object storage: one interface, three backends, one contract.

``open_store(url)`` opens ``file:///dir`` (or a plain path), ``memory://name`` or
``s3://bucket/prefix`` as an :class:`ObjectStore`. See docs/storage.md::

    from riverbed.storage import open_store, Pointer

    store = open_store("s3://my-bucket/riverbed")
    store.put("a/b", b"...")
    won = store.put_if_absent("terms/00000007", b"driver-2")
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from riverbed.locations import shown
from riverbed.storage.base import ObjectInfo, ObjectStore
from riverbed.storage.errors import (
    ObjectNotFoundError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
    StorageValueError,
)
from riverbed.storage.pointer import Pointer, Version

SCHEMES = ("file", "memory", "s3")


def storage_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that say how to reach a bucket (``AWS_*``, riverbed's
    ``RIVERBED_S3_*`` and ``RIVERBED_STORAGE_WAIT``), for processes that must reach it
    the same way — Spark's Python workers, which may have started before these were
    set. Holds secrets: never print or log it."""
    from riverbed.storage.awschain import bucket_environment

    return bucket_environment(env)


_SHARED: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}
_SHARED_LOCK = threading.Lock()


def shared_store(url: str | Path) -> ObjectStore:
    """:func:`open_store`, one per process for each location and bucket settings: a
    client is reused by every batch and task instead of being built (~5 ms) and
    connecting again (a TLS handshake, on a real S3) each time. Never close it."""
    key = (str(url), tuple(sorted(storage_environment().items())))
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None:
            store = _SHARED[key] = open_store(url)
        return store


def open_store(url: str | Path) -> ObjectStore:
    """The object store at ``url`` (``file://``, ``memory://``, ``s3://``, or a path)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        from riverbed.storage.file import FileStore

        return FileStore(text)
    if scheme == "file":
        from riverbed.storage.file import FileStore

        return FileStore(rest)
    if scheme == "memory":
        from riverbed.storage.memory import MemoryStore

        return MemoryStore(rest or "default")
    if scheme == "s3":
        from riverbed.storage.s3 import S3ObjectStore

        return S3ObjectStore(text)
    raise StorageValueError(
        f"unknown storage scheme {scheme!r} in {shown(text)!r}: use "
        "s3://bucket/prefix, file:///path or memory://name"
    )


__all__ = [
    "SCHEMES",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "Pointer",
    "StorageAccessError",
    "StorageError",
    "StorageUnavailableError",
    "StorageValueError",
    "Version",
    "open_store",
    "shared_store",
    "storage_environment",
]
