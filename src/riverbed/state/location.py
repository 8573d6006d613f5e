"""Where a partition's durable state lives: a location string to its storage.

``file:///abs/path`` or a plain path is a directory tree (:class:`FileStorage`, every
write fsynced); ``s3://bucket/prefix`` or ``memory://name`` is an object store with
incremental snapshots (:class:`~riverbed.state.objects.ObjectStorage`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from riverbed.state.durable import DurableStorage, FileStorage
from riverbed.state.errors import StateError
from riverbed.state.objects import ObjectStorage
from riverbed.storage import shared_store


def open_storage(url: str | Path) -> DurableStorage:
    """``file:///abs/path`` or a plain path (a directory tree, fsynced); ``s3://bucket/prefix``
    or ``memory://name`` (an object store, incremental snapshots:
    :mod:`riverbed.state.objects`)."""
    if isinstance(url, Path):
        return FileStorage(url.resolve())
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else url
        if not path:
            raise StateError(f"durable location {url!r} has no path; e.g. file:///data/state")
        return FileStorage(Path(path).resolve())
    if parts.scheme in ("s3", "memory"):
        return ObjectStorage(shared_store(url))
    raise StateError(
        f"unsupported durable location {url.split('@')[-1]!r}; use a path, file:///path, "
        "s3://bucket/prefix or memory://name"
    )


__all__ = ["open_storage"]
