"""``sqlite:///path/control.db``: the embedded control plane, safe across processes.

One SQLite file in WAL mode mirrors etcd's data model (see :mod:`._engine` for the
semantics, shared with ``memory://``):

* ``kv``       — live keys with create/mod revision, version and lease;
* ``leases``   — id, TTL and deadline (wall-clock seconds; all processes share one clock);
* ``events``   — the history that watches replay, trimmed by compaction;
* ``meta``     — the global ``revision`` and ``compact_revision``.

Writes: an ``flock`` on ``control.db.lock`` serializes write transactions between
processes fairly (SQLite's own busy handler can starve a process for seconds, long
enough to lose a lease), then ``BEGIN IMMEDIATE`` … ``COMMIT``. ``synchronous=NORMAL``:
a committed write survives a killed process; an OS crash may lose the last commits.

Watches: each watch owns a thread and a connection that polls ``PRAGMA data_version``
(it changes when another connection commits) every ``poll`` seconds, then reads new
events in one read transaction. The same thread reaps expired leases when the
earliest deadline passes, so deletes reach watchers even when nobody writes.

URL options: ``?poll=0.005`` (watch poll seconds), ``?history=100000`` (revisions of
history kept before automatic compaction).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from riverbed.control import _engine
from riverbed.control._watch import KeyFilter, ThreadedWatch
from riverbed.control.base import (
    Bytes,
    Compare,
    ControlPlane,
    Event,
    EventType,
    KeyValue,
    LeaseGrant,
    Op,
    TxnResult,
    Watch,
    to_bytes,
)
from riverbed.control.errors import CompactedError, ControlError, UnavailableError
from riverbed.files import writer_lock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('revision', 1), ('compact_revision', 0);
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
    mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL, deadline REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_deadline ON leases (deadline);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, revision INTEGER NOT NULL, type TEXT NOT NULL,
    key BLOB NOT NULL, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
    mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL,
    prev_value BLOB, prev_create INTEGER, prev_mod INTEGER, prev_version INTEGER,
    prev_lease INTEGER
);
CREATE INDEX IF NOT EXISTS events_by_revision ON events (revision);
"""

_KV_COLS = "key, value, create_rev, mod_rev, version, lease"
_COMPACT_EVERY = 1000


def _row_kv(row: tuple[bytes, bytes, int, int, int, int]) -> KeyValue:
    return KeyValue(bytes(row[0]), bytes(row[1]), row[2], row[3], row[4], row[5])


class _SqliteStorage(_engine.Storage):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.c = conn

    def read(self, key: bytes) -> KeyValue | None:
        row = self.c.execute(f"SELECT {_KV_COLS} FROM kv WHERE key = ?", (key,)).fetchone()  # noqa: S608
        return _row_kv(row) if row else None

    def read_range(self, start: bytes, end: bytes) -> list[KeyValue]:
        if end == b"":
            sql = f"SELECT {_KV_COLS} FROM kv WHERE key >= ? ORDER BY key"  # noqa: S608
            rows = self.c.execute(sql, (start,)).fetchall()
        else:
            sql = f"SELECT {_KV_COLS} FROM kv WHERE key >= ? AND key < ? ORDER BY key"  # noqa: S608
            rows = self.c.execute(sql, (start, end)).fetchall()
        return [_row_kv(r) for r in rows]

    def write(self, kv: KeyValue) -> None:
        self.c.execute(
            f"INSERT OR REPLACE INTO kv ({_KV_COLS}) VALUES (?, ?, ?, ?, ?, ?)",  # noqa: S608
            (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease),
        )

    def remove(self, key: bytes) -> None:
        self.c.execute("DELETE FROM kv WHERE key = ?", (key,))

    def append_events(self, events: Sequence[Event]) -> None:
        rows = []
        for e in events:
            p = e.prev_kv
            rows.append(
                (
                    e.revision,
                    e.type.value,
                    e.kv.key,
                    e.kv.value,
                    e.kv.create_revision,
                    e.kv.mod_revision,
                    e.kv.version,
                    e.kv.lease,
                    p.value if p else None,
                    p.create_revision if p else None,
                    p.mod_revision if p else None,
                    p.version if p else None,
                    p.lease if p else None,
                )
            )
        self.c.executemany(
            "INSERT INTO events (revision, type, key, value, create_rev, mod_rev, version, lease,"
            " prev_value, prev_create, prev_mod, prev_version, prev_lease)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def get_revision(self) -> int:
        return int(self.c.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0])

    def set_revision(self, revision: int) -> None:
        self.c.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))

    def lease_deadline(self, lease: int) -> float | None:
        row = self.c.execute("SELECT deadline FROM leases WHERE id = ?", (lease,)).fetchone()
        return float(row[0]) if row else None

    def put_lease(self, lease: int, ttl: int, deadline: float) -> None:
        self.c.execute(
            "INSERT OR REPLACE INTO leases (id, ttl, deadline) VALUES (?, ?, ?)",
            (lease, ttl, deadline),
        )

    def drop_lease(self, lease: int) -> None:
        self.c.execute("DELETE FROM leases WHERE id = ?", (lease,))

    def lease_ttl(self, lease: int) -> int:
        return int(self.c.execute("SELECT ttl FROM leases WHERE id = ?", (lease,)).fetchone()[0])

    def expired_leases(self, now: float) -> list[int]:
        rows = self.c.execute("SELECT id FROM leases WHERE deadline <= ?", (now,)).fetchall()
        return [int(r[0]) for r in rows]

    def keys_of_lease(self, lease: int) -> list[bytes]:
        rows = self.c.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease,))
        return [bytes(r[0]) for r in rows]

    def next_deadline(self) -> float | None:
        row = self.c.execute("SELECT min(deadline) FROM leases").fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def compact_revision(self) -> int:
        sql = "SELECT value FROM meta WHERE name = 'compact_revision'"
        return int(self.c.execute(sql).fetchone()[0])

    def compact(self, revision: int) -> None:
        if revision <= self.compact_revision():
            return
        self.c.execute("DELETE FROM events WHERE revision < ?", (revision,))
        self.c.execute("UPDATE meta SET value = ? WHERE name = 'compact_revision'", (revision,))

    def events_since(self, start: int) -> list[Event]:
        rows = self.c.execute(
            "SELECT type, key, value, create_rev, mod_rev, version, lease, prev_value,"
            " prev_create, prev_mod, prev_version, prev_lease FROM events"
            " WHERE revision >= ? ORDER BY seq",
            (start,),
        ).fetchall()
        out = []
        for r in rows:
            kv = KeyValue(bytes(r[1]), bytes(r[2]), r[3], r[4], r[5], r[6])
            prev = None
            if r[7] is not None:
                prev = KeyValue(kv.key, bytes(r[7]), r[8], r[9], r[10], r[11])
            out.append(Event(EventType(r[0]), kv, prev))
        return out


class _Connection:
    """One SQLite connection plus the cross-process write lock."""

    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        self.path = path
        self.clock = clock
        self._mutex = threading.Lock()
        self._lockfile = open(writer_lock(path), "a+b")  # noqa: SIM115 - owned until close()
        try:
            self.conn = sqlite3.connect(
                str(path), timeout=30, isolation_level=None, check_same_thread=False
            )
            self.storage = _SqliteStorage(self.conn)
            with self._exclusive():
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
            self.conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError as exc:
            self._lockfile.close()
            raise ControlError(
                f"{path} is not a riverbed control database ({exc}); point the control URL "
                "at a new file, e.g. sqlite:///.riverbed/control.db"
            ) from exc

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._mutex:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lockfile, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def write(self) -> Iterator[_SqliteStorage]:
        with self._exclusive(), self._errors():
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.storage
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[_SqliteStorage]:
        with self._mutex, self._errors():
            self.conn.execute("BEGIN")
            try:
                yield self.storage
            finally:
                self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite failures (disk full, I/O error, locked too long) as UnavailableError."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise UnavailableError(
                f"control database {self.path} failed ({exc}); check disk space and permissions"
            ) from exc

    def data_version(self) -> int:
        with self._mutex:
            return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        with self._mutex:
            self.conn.close()
            self._lockfile.close()


class SqliteControlPlane(ControlPlane):
    """A control plane in one SQLite file, shared by every process on the machine."""

    def __init__(
        self,
        path: Path,
        *,
        poll: float = 0.005,
        history: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{path}"
        self.path = path
        self._poll = poll
        self._history = history
        self._clock = clock
        self._db = _Connection(path, clock)
        self._watches: list[Watch] = []

    def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        if _engine.read_only(success) and _engine.read_only(failure):
            with self._db.read() as s:
                now = self._clock()
                ok = _engine.evaluate(s, compare, now)
                responses = _engine.run_reads(s, success if ok else failure, now)
                return TxnResult(ok, s.get_revision(), responses)
        with self._db.write() as s:
            result, _ = _engine.apply_txn(s, compare, success, failure, self._clock())
            if result.revision % _COMPACT_EVERY == 0 and result.revision > self._history:
                s.compact(result.revision - self._history)
            return result

    def revision(self) -> int:
        with self._db.read() as s:
            return s.get_revision()

    def compact(self, revision: int) -> None:
        with self._db.write() as s:
            s.compact(min(revision, s.get_revision()))

    def grant(self, ttl: int) -> LeaseGrant:
        with self._db.write() as s:
            return LeaseGrant(_engine.grant(s, ttl, self._clock()), ttl)

    def keepalive(self, lease: int) -> int:
        # A failed keepalive still reaps, so the reap must commit: catch, commit, raise.
        error: Exception | None = None
        ttl = 0
        with self._db.write() as s:
            try:
                ttl = _engine.keepalive(s, lease, self._clock())
            except ControlError as exc:
                error = exc
        if error is not None:
            raise error
        return ttl

    def revoke(self, lease: int) -> None:
        with self._db.write() as s:
            _engine.revoke(s, lease, self._clock())

    def time_to_live(self, lease: int) -> int | None:
        with self._db.read() as s:
            return _engine.time_to_live(s, lease, self._clock())

    def watch(
        self, key: Bytes, *, prefix: bool = False, start_revision: int | None = None
    ) -> Watch:
        if start_revision is None:
            start_revision = self.revision() + 1
        match = KeyFilter(to_bytes(key), prefix)
        start = start_revision

        def run(w: ThreadedWatch) -> None:
            db = _Connection(self.path, self._clock)
            try:
                self._follow(db, w, match, start)
            finally:
                db.close()

        watch = ThreadedWatch(f"riverbed-watch-{key!r}", run)
        self._watches = [w for w in self._watches if not w.closed] + [watch]
        return watch

    def _follow(self, db: _Connection, w: ThreadedWatch, match: KeyFilter, start: int) -> None:
        next_rev = start
        seen_version = -1
        next_deadline: float | None = None
        while not w.stopping.is_set():
            version = db.data_version()
            reaped = False
            if next_deadline is not None and self._clock() >= next_deadline:
                with db.write() as s:
                    _engine.reap(s, self._clock())
                reaped = True  # re-read: our own commit does not change data_version
            if version != seen_version or reaped:
                seen_version = version
                with db.read() as s:
                    compacted = s.compact_revision()
                    if next_rev < compacted:
                        raise CompactedError(next_rev, compacted)
                    events = s.events_since(next_rev)
                    next_deadline = s.next_deadline()
                    revision = s.get_revision()
                for event in events:
                    if match(event.kv.key):
                        w.emit(event)
                next_rev = max(next_rev, revision + 1)
            w.stopping.wait(self._poll)

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        self._watches = []
        self._db.close()
