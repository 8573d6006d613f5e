"""Snapshot uploads off the committing thread, for a process that commits batch after batch.

Every ``snapshot_every`` versions a commit snapshots its partition: a RocksDB checkpoint
(hard links, after a flush of the memtable: milliseconds) and its upload to the durable
tier (a copy and an fsync of every new file, or PUTs to a bucket: tens of milliseconds
and more). A stream driver running small batches in its own threads pays that on one
batch in ``snapshot_every`` — the tail of its latency. Inside :func:`in_background`
the checkpoint is still taken by the commit (it must hold exactly the committed
version), but the upload runs on one background thread of this process.

Nothing depends on a snapshot being there: a snapshot only shortens a rebuild, every
version stays loadable from its changelogs (a purge keeps those no snapshot covers),
and an upload appears whole or not at all (:meth:`DurableStorage.upload_dir`). So an
upload cut short by a crash costs nothing but the leftover the next sweep removes, and
one that fails is logged and tried again ``snapshot_every`` versions later. While a
partition's upload runs, its later commits take no other snapshot. Leaving the
outermost block waits for the uploads still running.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait

log = logging.getLogger(__name__)

__all__ = ["active", "busy", "in_background", "submit", "wait_all"]


class _Uploads:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.pool: ThreadPoolExecutor | None = None
        self.running: dict[Hashable, Future[None]] = {}


_U = _Uploads()


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Within this block, this process's commits upload their snapshots in the
    background; leaving the outermost block waits for those still running."""
    with _U.lock:
        _U.depth += 1
    try:
        yield
    finally:
        with _U.lock:
            _U.depth -= 1
            last = _U.depth == 0
        if last:
            wait_all()


def active() -> bool:
    """Whether commits in this process upload snapshots in the background now."""
    return _U.depth > 0


def busy(key: Hashable) -> bool:
    """Whether an upload for ``key`` (a partition) is still running."""
    with _U.lock:
        return key in _U.running


def submit(key: Hashable, upload: Callable[[], None], done: Callable[[], None]) -> bool:
    """Run ``upload`` in the background unless one for ``key`` is running (False);
    ``done`` runs after it whatever happened (it removes what the upload read)."""
    with _U.lock:
        if key in _U.running:
            return False
        if _U.pool is None:
            _U.pool = ThreadPoolExecutor(1, thread_name_prefix="riverbed-snapshot")

        def run() -> None:
            try:
                upload()
            except Exception as exc:  # the changelogs still hold every version
                log.warning("a snapshot upload of %s failed (tried again later): %s", key, exc)
            finally:
                try:
                    done()
                finally:
                    with _U.lock:
                        _U.running.pop(key, None)

        _U.running[key] = _U.pool.submit(run)
        return True


def wait_all(timeout: float | None = None) -> bool:
    """Wait for every upload running now; False if some were still running at
    ``timeout`` seconds."""
    with _U.lock:
        futures = list(_U.running.values())
    if not futures:
        return True
    _, pending = wait(futures, timeout)
    return not pending
