"""The jobs database: one schema (SQLAlchemy Core) for SQLite and PostgreSQL.

Times are seconds since the epoch taken from **the database's clock**
(:func:`db_now`), so every process compares timestamps from one clock.

SQLite (the embedded default, many processes on one machine): WAL,
``synchronous=NORMAL``, and every write transaction is ``BEGIN IMMEDIATE`` under an
``flock`` on ``<db>.lock`` (SQLite's busy handler can starve one process for seconds;
the flock queues writers fairly — the control plane measured the same). PostgreSQL:
claims use ``FOR UPDATE SKIP LOCKED``; ``NOTIFY rb_jobs`` wakes workers.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from riverbed.fencing import Fence, Term
from riverbed.files import flocked, sqlite_path, writer_lock
from riverbed.formats import CURRENT, check
from riverbed.jobs.errors import FencedError, QueueError
from riverbed.locations import shown

SCHEMA_VERSION = CURRENT["jobs database"]
_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only

metadata = MetaData()

meta = Table(
    "rb_jobs_meta",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("schema_version", Integer, nullable=False),
    Column("term", BigInteger, nullable=False),  # the acting orchestrator's election term
    Column("leader", Text, nullable=False),
    Column("since", Float, nullable=False),
)

chunks = Table(
    "rb_jobs_chunks",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("master", BigInteger),  # the run that created it (None for a master row)
    Column("job", Text, nullable=False),
    Column("kind", Text, nullable=False),  # master | python | spark
    Column("state", Text, nullable=False),
    Column("kwargs", Text, nullable=False),  # canonical JSON
    Column("work_ids", Text, nullable=False),  # JSON list
    Column("n_ids", Integer, nullable=False),
    Column("deps_left", Integer, nullable=False, default=0),
    Column("active_left", Integer, nullable=False, default=0),  # masters: members not ended
    Column("failed", Integer, nullable=False, default=0),  # masters: members failed
    Column("attempt", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False, default=1),
    Column("backoff", Float, nullable=False, default=5.0),
    Column("timeout", Float),
    Column("bisect", Boolean, nullable=False, default=False),
    Column("not_before", Float, nullable=False, default=0.0),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("heartbeat_at", Float),
    Column("finished_at", Float),
    Column("worker", Text),
    Column("host", Text),
    Column("code_version", Text, nullable=False, default=""),
    Column("error", Text),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("output_attempt", Integer),
    Column("materialized", Boolean, nullable=False, default=False),
    Column("parent", BigInteger),  # bisected from / rerun of
    Column("schedule", Text),
    Column("fire_time", Float),
)
# Claims pick the lowest PENDING ids: a partial index of just the pending chunks, in id
# order, answers ``ORDER BY id LIMIT n`` by reading n entries, however many chunks are
# done (an index on (state, not_before, id) made every claim read and sort every pending
# chunk; the primary key, every done one before them).
_PENDING = chunks.c.state == "PENDING"
Index("rb_jobs_pending", chunks.c.id, postgresql_where=_PENDING, sqlite_where=_PENDING)
Index("rb_jobs_by_master", chunks.c.master)
Index("rb_jobs_by_job", chunks.c.job, chunks.c.kwargs, chunks.c.state)

edges = Table(
    "rb_jobs_edges",
    metadata,
    Column("upstream", BigInteger, primary_key=True),
    Column("downstream", BigInteger, primary_key=True),
)
Index("rb_jobs_edges_down", edges.c.downstream)

members = Table(
    "rb_jobs_members",
    metadata,
    Column("master", BigInteger, primary_key=True),
    Column("chunk", BigInteger, primary_key=True),
)
Index("rb_jobs_members_chunk", members.c.chunk)

attempts = Table(
    "rb_jobs_attempts",
    metadata,
    Column("chunk", BigInteger, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("worker", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("code_version", Text, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float),
    Column("state", Text, nullable=False),
    Column("error", Text),
)

freshness = Table(
    "rb_jobs_freshness",
    metadata,
    Column("job", Text, primary_key=True),
    Column("kwargs", Text, primary_key=True),
    Column("work_id", BigInteger, primary_key=True),
    Column("succeeded_at", Float, nullable=False),
    # the code version that success ran (riverbed.specfiles.code_version); added after
    # version 1 (older rows: "", taken as the current code)
    Column("code_version", Text, nullable=False, server_default=""),
)

# The last success of a (job, kwargs) run without work ids; with work ids, the last
# success is the newest of rb_jobs_freshness (kept apart: one row every chunk updated
# would serialize them).
latest = Table(
    "rb_jobs_latest",
    metadata,
    Column("job", Text, primary_key=True),
    Column("kwargs", Text, primary_key=True),
    Column("succeeded_at", Float, nullable=False),
    Column("code_version", Text, nullable=False, server_default=""),  # added after version 1
)

schedules = Table(
    "rb_jobs_schedules",
    metadata,
    # the schedule's key (riverbed.jobs.spec.Schedule.key): the job's name for its one
    # unnamed schedule, else "job:name" — and so in rb_jobs_fires and a run's `schedule`
    Column("job", Text, primary_key=True),
    Column("cron", Text, nullable=False),
    Column("kwargs", Text, nullable=False),
    Column("work_ids", Text),
    Column("grace", Float, nullable=False),
    Column("catchup", Text, nullable=False, server_default="all"),  # added after version 1
    Column("last_fire", Float),
    Column("updated_at", Float, nullable=False),
)

fires = Table(
    "rb_jobs_fires",
    metadata,
    Column("job", Text, primary_key=True),
    Column("fire_time", Float, primary_key=True),
    Column("master", BigInteger),  # None: skipped (previous run still active)
    Column("note", Text),
)


def db_now(dialect: str) -> Any:
    """An SQL expression for the database's clock, in epoch seconds."""
    if dialect == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    return literal_column("extract(epoch from clock_timestamp())::double precision")


class Database:
    """Engines for one jobs database URL, plus the write-transaction discipline."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.lock_path: Path | None = None
        if parts.scheme == "sqlite":
            try:
                path = sqlite_path(url, ".riverbed/jobs.db")
            except ValueError as exc:
                raise QueueError(str(exc)) from None
            assert path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            self.dialect = "sqlite"
            self.path: Path | None = path
            self.lock_path = writer_lock(path)
            self.engine = self._sqlite_engine(path, immediate=True)
            self.reader = self._sqlite_engine(path, immediate=False)
        elif parts.scheme in ("postgresql", "postgres", "postgresql+psycopg"):
            try:
                import psycopg
            except ImportError:
                raise QueueError(
                    "a PostgreSQL jobs database needs psycopg: pip install 'riverbed[postgres]'"
                ) from None
            self.dialect = "postgresql"
            self.path = None
            sa_url = "postgresql+psycopg://" + url.split("://", 1)[1]
            # Every use is a begin() block that commits or rolls back, so a connection
            # goes back to the pool clean: no reset ROLLBACK, and no pre-ping SELECT
            # (two round trips per transaction). A connection PostgreSQL dropped fails
            # one transaction (QueueError), SQLAlchemy discards the pool, and the
            # worker or orchestrator retries.
            self.engine = create_engine(
                sa_url, pool_size=4, max_overflow=4, pool_reset_on_return=None
            )
            # Reads (the CLI, the console, an idle worker's look) ping first: a read
            # is safe to retry, so a dropped connection costs nobody an error.
            self.reader = create_engine(sa_url, pool_size=2, max_overflow=4, pool_pre_ping=True)
        else:
            raise QueueError(
                f"unsupported jobs database {url!r}; use sqlite:///path/jobs.db or "
                "postgresql://user@host:port/db (RIVERBED_JOBS_DB)"
            )
        self.now = db_now(self.dialect)
        # The hot path (riverbed.jobs.statements) runs on the DBAPI cursor: its errors too.
        self.errors: tuple[type[BaseException], ...] = (SQLAlchemyError, sqlite3.Error)
        if self.dialect == "postgresql":
            import psycopg

            self.errors = (SQLAlchemyError, psycopg.Error)

    @staticmethod
    def _sqlite_engine(path: Path, immediate: bool) -> Engine:
        # Pooled connections: opening one (and its PRAGMAs) per transaction cost more
        # than the transaction. Processes do not share a pool (workers are spawned).
        engine = create_engine(f"sqlite:///{path}", pool_size=4, max_overflow=8)

        @event.listens_for(engine, "connect")
        def _connect(dbapi: sqlite3.Connection, _record: Any) -> None:
            dbapi.isolation_level = None  # we issue BEGIN ourselves
            dbapi.execute("PRAGMA busy_timeout = 30000")
            dbapi.execute("PRAGMA journal_mode = WAL")
            dbapi.execute("PRAGMA synchronous = NORMAL")

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    def __repr__(self) -> str:
        return f"Database({shown(self.url)!r})"

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction (serialized fairly across processes on SQLite)."""
        try:
            with self._flock(), self.engine.begin() as conn:
                yield conn
        except self.errors as exc:
            raise QueueError(f"jobs database {shown(self.url)}: {_first_line(exc)}") from exc

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        try:
            with self.reader.begin() as conn:
                yield conn
        except self.errors as exc:
            raise QueueError(f"jobs database {shown(self.url)}: {_first_line(exc)}") from exc

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        if self.lock_path is None:
            yield
            return
        with flocked(self.lock_path):
            yield

    def create(self) -> None:
        """Create the tables if missing, add what newer versions added; refuse a
        database of another schema version.

        Processes started together (a supervisor starting orchestrators and workers at
        once) all run this. On PostgreSQL concurrent ``CREATE TABLE``/``CREATE INDEX``
        race inside the catalog, so the whole step holds a transaction-level advisory
        lock: one process creates or upgrades, the others wait, then find everything
        there (each check runs after the lock, on a fresh snapshot). On SQLite the
        write transaction (``BEGIN IMMEDIATE`` under the flock) serializes already.
        """
        with self.write() as conn:
            if self.dialect == "postgresql":
                conn.execute(_SCHEMA_LOCK)
            metadata.create_all(conn)
            # Indexes added since a database was created (create_all makes a table's
            # indexes only with the table); the claim index they replace goes.
            for table in metadata.tables.values():
                for index in table.indexes:
                    index.create(conn, checkfirst=True)
            conn.execute(text("DROP INDEX IF EXISTS rb_jobs_claim"))
            # Columns added since (create_all adds none to an existing table): each one
            # has a default, so a riverbed of the same schema version without it still
            # writes rows.
            for added_to, column, default in _ADDED:
                have = {c["name"] for c in inspect(conn).get_columns(added_to)}
                if column not in have:
                    conn.execute(
                        text(
                            f"ALTER TABLE {added_to} ADD COLUMN {column} TEXT NOT NULL "
                            f"DEFAULT '{default}'"
                        )
                    )
            row = conn.execute(select(meta.c.schema_version).where(meta.c.id == 1)).first()
            if row is None:
                conn.execute(
                    meta.insert().values(
                        id=1, schema_version=SCHEMA_VERSION, term=0, leader="", since=0.0
                    )
                )
            elif row[0] != SCHEMA_VERSION:
                check("jobs database", row[0], f"jobs database {shown(self.url)}")
                raise QueueError(
                    f"jobs database {shown(self.url)} has schema version {row[0]}, this riverbed "
                    f"uses {SCHEMA_VERSION}; point RIVERBED_JOBS_DB at a new database"
                )

    def notify(self, conn: Connection) -> None:
        """Wake waiting workers when the transaction commits (PostgreSQL)."""
        if self.dialect == "postgresql":
            conn.execute(_NOTIFY)

    def dispose(self) -> None:
        self.engine.dispose()
        if self.reader is not self.engine:
            self.reader.dispose()


# (table, column, default) of the TEXT columns added after a schema version's first release
_ADDED = (
    ("rb_jobs_schedules", "catchup", "all"),
    ("rb_jobs_freshness", "code_version", ""),
    ("rb_jobs_latest", "code_version", ""),
)
_NOTIFY = text("SELECT pg_notify('rb_jobs', '')")
# One advisory lock key for schema changes of this database (any constant works; this
# one spells "rbschema" in ASCII so it is recognisable in pg_locks).
_SCHEMA_LOCK = text("SELECT pg_advisory_xact_lock(8242277138831863137)")


def _first_line(exc: BaseException) -> str:
    msg = str(getattr(exc, "orig", None) or exc).strip()
    return msg.splitlines()[0] if msg else type(exc).__name__


class SqlFence(Fence):
    """The acting orchestrator's term as the jobs database's one meta row
    (:mod:`riverbed.fencing`): a claim is one ``UPDATE … WHERE term <= :term``, and
    :meth:`check_in` checks inside the transaction of the write it guards (PostgreSQL:
    under a share lock of the row, so a claim waits for the writes of the older term
    in flight)."""

    def __init__(self, db: Database, now: Callable[[Connection], float]) -> None:
        super().__init__("the orchestrator", FencedError)
        self.db, self.now = db, now

    def _record(self, term: int, holder: str, since: str) -> bool:
        with self.db.write() as conn:
            done = conn.execute(
                update(meta)
                .where(meta.c.id == 1, meta.c.term <= term)
                .values(term=term, leader=holder, since=self.now(conn))
            ).rowcount
            return bool(done)

    def _row(self, conn: Connection, lock: bool = False) -> Term | None:
        q = select(meta.c.term, meta.c.leader, meta.c.since).where(meta.c.id == 1)
        if lock and self.db.dialect == "postgresql":
            q = q.with_for_update(read=True)
        term, leader, since = conn.execute(q).one()
        if int(term) == 0 and not leader:
            return None  # no orchestrator has acted yet
        when = datetime.fromtimestamp(float(since), UTC).isoformat(timespec="seconds")
        return Term(int(term), str(leader), when)

    def current(self) -> Term | None:
        with self.db.read() as conn:
            return self._row(conn)

    def check_in(self, conn: Connection, term: int) -> None:
        """:meth:`check`, inside the transaction of ``conn``."""
        current = self._row(conn, lock=True)
        if current is None or current.term != term:
            raise self.refused(term, current)
