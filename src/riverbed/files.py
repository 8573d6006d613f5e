"""Small durable-file helpers shared by the packages that write files."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from riverbed.errors import InvalidValueError

__all__ = ["flocked", "fsync_dir", "fsync_file"]


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block:
    one holder at a time across the processes of this machine."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sqlite_path(url: str, example: str) -> Path | None:
    """The database file a ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
    URL names (SQLAlchemy's spelling); None for a URL of another scheme. A malformed one
    raises InvalidValueError (a ValueError) with a fix built on ``example`` (e.g.
    ``.riverbed/jobs.db``)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        return None
    if parts.netloc:
        raise InvalidValueError(
            f"{url}: a SQLite URL has three slashes and a path, e.g. sqlite:///{example} "
            f"(relative) or sqlite:////var/riverbed/{Path(example).name}"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ".":
        raise InvalidValueError(f"{url}: no database path; e.g. sqlite:///{example}")
    return Path(path)


def writer_lock(database: Path) -> Path:
    """The file whose ``flock`` every writer of SQLite ``database`` on this machine holds
    for a write transaction (the control plane's and the jobs queue's): SQLite's own
    busy handler can starve a process for seconds, the flock queues writers fairly.
    Holding it holds every writer back — and a process paused while it holds it does
    the same (docs/control.md)."""
    return database.with_name(database.name + ".lock")


def fsync_file(path: Path) -> None:
    """Make a file's bytes durable (before a rename publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in directory ``path`` durable."""
    fsync_file(path)  # a directory opens read-only like a file, and syncs the same way
