"""A readable fd that becomes ready when the jobs database may have new work: PostgreSQL's
``LISTEN``, SQLite's ``PRAGMA data_version`` polled, MariaDB's wake counter polled (a
primary-key read; :meth:`Database.notify` counts up in the notifying transaction, so a
change is seen once it commits). A worker waits on it beside its executors' pipes."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading

from sqlalchemy import select

from riverbed.jobs.queue import JobQueue
from riverbed.jobs.schema import WAKES, Database, signals

log = logging.getLogger(__name__)
MARIADB_POLL_S = 0.05  # a round trip to MariaDB every 50 ms per idle worker


class Waker:
    """A readable fd that becomes ready when the jobs database may have new work."""

    def __init__(self, queue: JobQueue, poll: float = 0.01) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._stop = threading.Event()
        self._poll = poll
        self._queue = queue
        self._thread = threading.Thread(target=self._run, name="riverbed-jobs-waker", daemon=True)
        self._thread.start()

    def _signal(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write_fd, b"!")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def _run(self) -> None:
        backoff = 0.25
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # the database is away: listen again when it is back
                log.warning("jobs waker: %s; listening again in %.2fs", exc, backoff)
                self._signal()  # meanwhile the worker looks for itself
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _listen(self) -> None:
        db = self._queue.db
        if db.dialect == "sqlite" and db.path is not None:
            conn = sqlite3.connect(db.path)
            try:
                last = conn.execute("PRAGMA data_version").fetchone()[0]
                while not self._stop.wait(self._poll):
                    now = conn.execute("PRAGMA data_version").fetchone()[0]
                    if now != last:
                        last = now
                        self._signal()
            finally:
                conn.close()
            return
        if db.dialect == "mariadb":
            self._poll_mariadb(db)
            return
        import psycopg

        dsn = db.url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute("LISTEN rb_jobs")
            self._signal()  # anything sent while nobody listened
            while not self._stop.is_set():
                for _ in pg.notifies(timeout=0.5, stop_after=1):
                    self._signal()

    def _poll_mariadb(self, db: Database) -> None:
        poll = max(self._poll, MARIADB_POLL_S)
        count = select(signals.c.value).where(signals.c.name == WAKES)
        with db.reader.connect() as conn:
            last = conn.execute(count).scalar()
            conn.rollback()
            self._signal()  # anything sent before the first reading
            while not self._stop.wait(poll):
                now = conn.execute(count).scalar()
                conn.rollback()  # the next reading in a new snapshot
                if now != last:
                    last = now
                    self._signal()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self.read_fd)
        os.close(self._write_fd)
