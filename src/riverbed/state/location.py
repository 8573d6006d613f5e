"""Where a partition's durable state lives: a location string to its storage.

A directory (``file:///abs/path`` or a plain path), ``s3://bucket/prefix`` and
``memory://name`` are all object stores (:mod:`riverbed.storage`), with incremental
snapshots (:class:`~riverbed.state.objects.ObjectStorage`): a directory's snapshots
share RocksDB's unchanged files as a bucket's do. Snapshots a directory holds from
before (full copies beside their manifest) still restore.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from riverbed.locations import shown
from riverbed.state.durable import DurableStorage
from riverbed.state.errors import StateError, StateValueError
from riverbed.state.objects import ObjectStorage
from riverbed.storage import StorageValueError, shared_store


def open_storage(url: str | Path) -> DurableStorage:
    """``file:///abs/path`` or a plain path, ``s3://bucket/prefix`` or ``memory://name``."""
    if isinstance(url, Path):
        url = str(url.resolve())
    parts = urlsplit(url)
    if parts.scheme in ("", "file") and not (parts.path if parts.scheme else url):
        raise StateError(f"durable location {url!r} has no path; e.g. file:///data/state")
    if parts.scheme not in ("", "file", "s3", "memory"):
        raise StateError(
            f"unsupported durable location {shown(url)!r}; use a path, file:///path, "
            "s3://bucket/prefix or memory://name"
        )
    try:
        return ObjectStorage(shared_store(url))
    except StorageValueError as exc:
        raise StateValueError(f"durable state location {url}: {exc}") from None


__all__ = ["open_storage"]
