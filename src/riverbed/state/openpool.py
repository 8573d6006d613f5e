"""Local databases a process keeps open between loads of its partitions.

Opening a RocksDB partition and closing it again costs ~10 ms here (a new MANIFEST, an
OPTIONS file, the WAL's recovery flush: ~18 fsyncs), paid per partition per batch by
a process that loads, commits and lets go. A long-lived process that runs batch after
batch itself — a stream driver running small batches in its own threads — keeps them
open instead, inside :func:`keep_open`: a committed (or aborted) partition goes back
to this process's pool, and the next load of it takes it from there (checked, as
any local copy is, against the durable tier's newest changelog before use).

A kept partition is held (its lock is this process's), so it must be let go before
any other process needs it: :func:`let_go` before work runs elsewhere (a Spark job's
tasks), and the end of the outermost :func:`keep_open` closes them all.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from riverbed.state.base import LocalDB


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0  # open keep_open() blocks: none, and databases are closed
        self.dbs: dict[Path, LocalDB] = {}

    def take(self, path: Path) -> LocalDB | None:
        with self.lock:
            return self.dbs.pop(path, None)

    def give(self, path: Path, db: LocalDB) -> bool:
        """Keep ``db`` open for the next load of ``path``; False: close it yourself."""
        with self.lock:
            if self.depth == 0 or path in self.dbs:
                return False
            self.dbs[path] = db
            return True

    def let_go(self, under: Path | None = None) -> None:
        with self.lock:
            if under is None:
                dbs, self.dbs = self.dbs, {}
            else:
                dbs = {p: db for p, db in self.dbs.items() if p.is_relative_to(under)}
                self.dbs = {p: db for p, db in self.dbs.items() if p not in dbs}
        for db in dbs.values():
            db.close()


_POOL = _Pool()


@contextlib.contextmanager
def keep_open() -> Iterator[None]:
    """Within this block, this process keeps the partitions it commits open for its
    next load of them; leaving the outermost block closes them."""
    with _POOL.lock:
        _POOL.depth += 1
    try:
        yield
    finally:
        with _POOL.lock:
            _POOL.depth -= 1
            last = _POOL.depth == 0
        if last:
            _POOL.let_go()


def let_go(under: Path | None = None) -> None:
    """Close the partitions this process keeps open (other processes need them now):
    every one, or those under ``under`` (one state namespace's:
    :func:`riverbed.state.provider.local_root` — a Spark job of one aggregation, while
    its driver keeps another's open)."""
    _POOL.let_go(under)


def take(path: Path) -> LocalDB | None:
    """The database kept open at ``path``, now the caller's; None if there is none."""
    return _POOL.take(path)


def give_back(path: Path, db: LocalDB) -> None:
    """A partition its user is done with: kept open inside :func:`keep_open`, else closed."""
    if not _POOL.give(path, db):
        db.close()


def held() -> list[Path]:
    """The partitions kept open now (for tests)."""
    with _POOL.lock:
        return sorted(_POOL.dbs)
