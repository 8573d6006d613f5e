"""Being woken when files in a directory change: Linux's inotify, through ``ctypes``.

A consumer of a file log waits for an append by another process. Polling the partition
on a timer costs either latency (a 50 ms timer: p99 51 ms from send to receive in
``benchmarks/log_vs_kafka.py``) or CPU (a short one, in every idle consumer); the kernel
can say instead: a directory watch reports every write to a segment file in it
(``IN_MODIFY``) and every new segment (``IN_CREATE``, ``IN_MOVED_TO``).

:class:`Watcher` is one inotify instance with watches added as directories are asked
for. Where inotify is not there (not Linux, no ``libc``, the watch limit reached),
:func:`watcher` returns ``None`` and callers poll as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import threading
from pathlib import Path

__all__ = ["Watcher", "available", "watcher"]

log = logging.getLogger(__name__)

_IN_MODIFY = 0x002
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class Watcher:
    """An inotify instance; :meth:`watch` a directory, then :meth:`wait` for a change
    in any watched one. Changes since the last :meth:`drain` are never missed: the
    kernel queues them until read."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._watched: set[Path] = set()
        self._lock = threading.Lock()

    def watch(self, directory: Path) -> bool:
        """Watch ``directory`` (once); whether it is watched."""
        with self._lock:
            if directory in self._watched:
                return True
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK)
            if wd < 0:
                err = ctypes.get_errno()
                log.debug("cannot watch %s: %s", directory, os.strerror(err))
                return False
            self._watched.add(directory)
            return True

    def drain(self) -> None:
        """Forget the changes seen so far (read them without blocking)."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._fd, 65536):
                pass

    def wait(self, timeout: float) -> bool:
        """Block until a watched directory changes or ``timeout`` seconds pass;
        whether one changed."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:  # a thread's watcher goes with its thread
        self.close()


_LIBC: list[ctypes.CDLL | None] = []


def available() -> bool:
    """Whether this system has inotify (checked once)."""
    if not _LIBC:
        libc = _libc()
        _LIBC.append(libc if libc is not None and hasattr(libc, "inotify_init1") else None)
    return _LIBC[0] is not None


def watcher() -> Watcher | None:
    """A new :class:`Watcher`, or ``None`` where inotify cannot be had (none on this
    system, or the per-user limit of instances reached)."""
    if not available():
        return None
    libc = _LIBC[0]
    assert libc is not None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    return Watcher(libc, fd)
