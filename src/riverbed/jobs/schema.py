"""The jobs database: one schema (SQLAlchemy Core) for SQLite, PostgreSQL and MariaDB.

Times are seconds since the epoch taken from **the database's clock**
(:func:`db_now`), so every process compares timestamps from one clock.

SQLite (the embedded default, many processes on one machine): WAL,
``synchronous=NORMAL``, and every write transaction is ``BEGIN IMMEDIATE`` under an
``flock`` on ``<db>.lock`` (SQLite's busy handler can starve one process for seconds;
the flock queues writers fairly — the control plane measured the same). PostgreSQL:
claims use ``FOR UPDATE SKIP LOCKED``; ``NOTIFY rb_jobs`` wakes workers. MariaDB
(10.6+, the orchestrator document's MySQL): ``SKIP LOCKED`` claims too; it has no
``UPDATE … RETURNING``, so :mod:`riverbed.jobs.statements` locks the rows, updates them
and reads them back in the same transaction; each session runs READ COMMITTED (as
PostgreSQL), in UTC, with ``SIMULTANEOUS_ASSIGNMENT`` (``SET`` expressions read the row's
old values, as on the other two); workers poll for new work (no ``NOTIFY``). Its keys
are ``VARCHAR`` (InnoDB indexes no ``TEXT``) compared byte for byte (``*_nopad_bin``).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
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
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import SQLAlchemyError

from riverbed.files import flocked, sqlite_path, writer_lock
from riverbed.formats import CURRENT, check
from riverbed.jobs.errors import QueueError
from riverbed.locations import shown

SCHEMA_VERSION = CURRENT["jobs database"]
_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only
# The dialects of the databases with row locks (SELECT … FOR UPDATE); SQLite serializes
# every write transaction instead.
ROW_LOCKS = ("postgresql", "mariadb")
# Seconds a session of PostgreSQL or MariaDB may sit silent inside a transaction before
# the server ends it (and its locks): no riverbed transaction waits on anything but the
# database, so a silent one belongs to a client that is cut off, paused or dead — and
# its locks would otherwise stay until TCP gives up on it, two hours by default.
IDLE_IN_TRANSACTION = 30
# MariaDB: FLOAT is single precision (epoch seconds need DOUBLE); TEXT is at most 64 KB
# (a chunk's work ids, an error's traceback: LONGTEXT) and cannot be a key — keys are
# VARCHAR, sized so a key of them fits InnoDB's 3072 bytes. Kwargs are canonical JSON,
# ASCII (json.dumps escapes the rest): one byte a character.
_NOPAD = "utf8mb4_nopad_bin"
_ASCII = "ascii_nopad_bin"
_FLOAT = Float().with_variant(Double(), "mariadb")
_TEXT = Text().with_variant(mysql.LONGTEXT(collation=_NOPAD), "mariadb")
NAME_MAX, KWARGS_MAX = 191, 2048  # the characters of a key MariaDB keeps (see keys_fit)
_NAME = Text().with_variant(mysql.VARCHAR(NAME_MAX, collation=_NOPAD), "mariadb")  # job names
_KWARGS = Text().with_variant(
    mysql.VARCHAR(KWARGS_MAX, charset="ascii", collation=_ASCII), "mariadb"
)
_STATE = Text().with_variant(mysql.VARCHAR(32, charset="ascii", collation=_ASCII), "mariadb")

metadata = MetaData()

meta = Table(
    "rb_jobs_meta",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("schema_version", Integer, nullable=False),
    Column("term", BigInteger, nullable=False),  # the acting orchestrator's election term
    Column("leader", _TEXT, nullable=False),
    Column("since", _FLOAT, nullable=False),
)

chunks = Table(
    "rb_jobs_chunks",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("master", BigInteger),  # the run that created it (None for a master row)
    Column("job", _NAME, nullable=False),
    Column("kind", _TEXT, nullable=False),  # master | python | spark
    Column("state", _STATE, nullable=False),
    Column("kwargs", _KWARGS, nullable=False),  # canonical JSON
    Column("work_ids", _TEXT, nullable=False),  # JSON list
    Column("n_ids", Integer, nullable=False),
    Column("deps_left", Integer, nullable=False, default=0),
    Column("active_left", Integer, nullable=False, default=0),  # masters: members not ended
    Column("failed", Integer, nullable=False, default=0),  # masters: members failed
    Column("attempt", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False, default=1),
    Column("backoff", _FLOAT, nullable=False, default=5.0),
    Column("timeout", _FLOAT),
    Column("bisect", Boolean, nullable=False, default=False),
    Column("not_before", _FLOAT, nullable=False, default=0.0),
    Column("created_at", _FLOAT, nullable=False),
    Column("started_at", _FLOAT),
    Column("heartbeat_at", _FLOAT),
    Column("finished_at", _FLOAT),
    Column("worker", _TEXT),
    Column("host", _TEXT),
    Column("code_version", _TEXT, nullable=False, default=""),
    Column("error", _TEXT),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("output_attempt", Integer),
    Column("materialized", Boolean, nullable=False, default=False),
    Column("parent", BigInteger),  # bisected from / rerun of
    Column("schedule", _TEXT),
    Column("fire_time", _FLOAT),
)
# Claims pick the lowest PENDING ids: a partial index of just the pending chunks, in id
# order, answers ``ORDER BY id LIMIT n`` by reading n entries, however many chunks are
# done (an index on (state, not_before, id) made every claim read and sort every pending
# chunk; the primary key, every done one before them).
_PENDING = chunks.c.state == "PENDING"
Index("rb_jobs_pending", chunks.c.id, postgresql_where=_PENDING, sqlite_where=_PENDING)
# MariaDB has no partial index: the pending ones are the (state='PENDING', id) range.
Index("rb_jobs_by_state", chunks.c.state, chunks.c.id).ddl_if(dialect="mariadb")
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
    Column("worker", _TEXT, nullable=False),
    Column("host", _TEXT, nullable=False),
    Column("code_version", _TEXT, nullable=False),
    Column("started_at", _FLOAT, nullable=False),
    Column("finished_at", _FLOAT),
    Column("state", _STATE, nullable=False),
    Column("error", _TEXT),
)

freshness = Table(
    "rb_jobs_freshness",
    metadata,
    Column("job", _NAME, primary_key=True),
    Column("kwargs", _KWARGS, primary_key=True),
    Column("work_id", BigInteger, primary_key=True),
    Column("succeeded_at", _FLOAT, nullable=False),
    # the code version that success ran (riverbed.specfiles.code_version); added after
    # version 1 (older rows: "", taken as the current code)
    Column("code_version", _TEXT, nullable=False, server_default=""),
)

# The last success of a (job, kwargs) run without work ids; with work ids, the last
# success is the newest of rb_jobs_freshness (kept apart: one row every chunk updated
# would serialize them).
latest = Table(
    "rb_jobs_latest",
    metadata,
    Column("job", _NAME, primary_key=True),
    Column("kwargs", _KWARGS, primary_key=True),
    Column("succeeded_at", _FLOAT, nullable=False),
    Column("code_version", _TEXT, nullable=False, server_default=""),  # added after version 1
)

schedules = Table(
    "rb_jobs_schedules",
    metadata,
    # the schedule's key (riverbed.jobs.spec.Schedule.key): the job's name for its one
    # unnamed schedule, else "job:name" — and so in rb_jobs_fires and a run's `schedule`
    Column("job", _NAME, primary_key=True),
    Column("cron", _TEXT, nullable=False),
    Column("kwargs", _KWARGS, nullable=False),
    Column("work_ids", _TEXT),
    Column("grace", _FLOAT, nullable=False),
    Column("catchup", _TEXT, nullable=False, server_default="all"),  # added after version 1
    Column("last_fire", _FLOAT),
    Column("updated_at", _FLOAT, nullable=False),
)

fires = Table(
    "rb_jobs_fires",
    metadata,
    Column("job", _NAME, primary_key=True),
    Column("fire_time", _FLOAT, primary_key=True),
    Column("master", BigInteger),  # None: skipped (previous run still active)
    Column("note", _TEXT),
)

# MariaDB only (the others have advisory locks and NOTIFY): the row submissions lock, one
# at a time, and the counter notify() counts up and idle workers poll.
signals = Table(
    "rb_jobs_signals",
    metadata,
    Column("name", _NAME, primary_key=True),
    Column("value", BigInteger, nullable=False),
)
SUBMISSIONS, WAKES = "submissions", "wakes"


def db_now(dialect: str) -> Any:
    """An SQL expression for the database's clock, in epoch seconds."""
    if dialect == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    if dialect == "mariadb":  # SYSDATE: the moment it runs (NOW: the statement's start)
        return literal_column("(UNIX_TIMESTAMP(SYSDATE(6)) + 0e0)")
    return literal_column("extract(epoch from clock_timestamp())::double precision")


class Database:
    """Engines for one jobs database URL, plus the write-transaction discipline."""

    def __init__(self, url: str, idle_limit: int = IDLE_IN_TRANSACTION) -> None:
        """``idle_limit``: seconds a session may sit silent inside a transaction before
        the server ends it (PostgreSQL, MariaDB; :data:`IDLE_IN_TRANSACTION`)."""
        parts = urlsplit(url)
        self.url = url
        self.idle_limit = idle_limit
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
            for engine in (self.engine, self.reader):
                event.listen(engine, "connect", functools.partial(_postgres_session, idle_limit))
        elif parts.scheme in MARIADB_SCHEMES:
            try:
                import pymysql
            except ImportError:
                raise QueueError(
                    "a MariaDB jobs database needs PyMySQL: pip install 'riverbed[mariadb]'"
                ) from None
            self.dialect = "mariadb"
            self.path = None
            sa_url = "mariadb+pymysql://" + url.split("://", 1)[1]
            # READ COMMITTED as on PostgreSQL (a locking read sees the latest commit,
            # a plain one too); the session in UTC for SYSDATE (db_now).
            self.engine = create_engine(
                sa_url,
                pool_size=4,
                max_overflow=4,
                pool_reset_on_return=None,
                isolation_level="READ COMMITTED",
            )
            self.reader = create_engine(
                sa_url,
                pool_size=2,
                max_overflow=4,
                pool_pre_ping=True,
                isolation_level="READ COMMITTED",
            )
            for engine in (self.engine, self.reader):
                event.listen(engine, "connect", functools.partial(_mariadb_session, idle_limit))
        else:
            raise QueueError(
                f"unsupported jobs database {shown(url)!r}; use sqlite:///path/jobs.db, "
                "postgresql://user@host:port/db or mysql://user@host:port/db (MariaDB 10.6+) "
                "(RIVERBED_JOBS_DB)"
            )
        self.now = db_now(self.dialect)
        # The hot path (riverbed.jobs.statements) runs on the DBAPI cursor: its errors too.
        self.errors: tuple[type[BaseException], ...] = (SQLAlchemyError, sqlite3.Error)
        if self.dialect == "postgresql":
            import psycopg

            self.errors = (SQLAlchemyError, psycopg.Error)
        elif self.dialect == "mariadb":
            self.errors = (SQLAlchemyError, pymysql.Error)

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
    def lock_wait(self, conn: Connection, seconds: int) -> Iterator[None]:
        """Inside: a statement of ``conn`` waits at most ``seconds`` for a row lock, then
        fails (:meth:`lock_timed_out`) — so a waiter can say what it waits for. SQLite
        has no row locks (its writers queue on the flock)."""
        if self.dialect == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(seconds)}s'")
        elif self.dialect == "mariadb":
            conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")
        try:
            yield
        finally:
            if self.dialect == "mariadb":  # a session setting: the pool reuses the session
                conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = DEFAULT")

    @staticmethod
    def lock_timed_out(exc: BaseException) -> bool:
        """Whether ``exc`` (a :class:`QueueError` of :meth:`write`) is a row lock wait
        that :meth:`lock_wait` ended."""
        cause = exc.__cause__
        orig = getattr(cause, "orig", cause)
        if getattr(orig, "sqlstate", None) == "55P03":  # PostgreSQL: lock_not_available
            return True
        args: tuple[Any, ...] = getattr(orig, "args", ())
        return type(orig).__module__.startswith("pymysql") and bool(args) and args[0] == 1205

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
        with self.write() as conn, self._schema_lock(conn):
            metadata.create_all(conn)
            # Indexes added since a database was created (create_all makes a table's
            # indexes only with the table); the claim index they replace goes.
            for table in metadata.tables.values():
                for index in table.indexes:
                    index.create(conn, checkfirst=True)
            conn.execute(
                text(
                    "DROP INDEX IF EXISTS rb_jobs_claim"
                    + (" ON rb_jobs_chunks" if self.dialect == "mariadb" else "")
                )
            )
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
            if self.dialect == "mariadb":
                present = set(conn.execute(select(signals.c.name)).scalars())
                for name in (SUBMISSIONS, WAKES):
                    if name not in present:
                        conn.execute(signals.insert().values(name=name, value=0))

    @contextlib.contextmanager
    def _schema_lock(self, conn: Connection) -> Iterator[None]:
        """Schema changes one process at a time: PostgreSQL's transaction-level advisory
        lock; MariaDB's named lock of this database (a session's, since each DDL
        statement commits by itself), released at the end; SQLite's write transaction."""
        if self.dialect == "postgresql":
            conn.execute(_SCHEMA_LOCK)
        if self.dialect != "mariadb":
            yield
            return
        got = conn.execute(text(f"SELECT GET_LOCK({_MARIADB_LOCK}, 120)")).scalar()
        if got != 1:
            raise QueueError(
                f"jobs database {shown(self.url)}: another process held the schema lock "
                "for 2 minutes; is a riverbed upgrading it? Try again when it is done"
            )
        try:
            yield
        finally:
            conn.execute(text(f"DO RELEASE_LOCK({_MARIADB_LOCK})"))

    def keys_fit(self, nodes: Iterable[tuple[str, str]]) -> None:
        """Refuse (job, canonical kwargs) keys longer than the database keeps (MariaDB:
        VARCHAR keys), naming the job and the way out, before anything is written."""
        if self.dialect != "mariadb":
            return
        for job, kwargs in nodes:
            if len(job) > NAME_MAX:
                raise QueueError(
                    f"job name {job[:40]!r}… is {len(job)} characters; a MariaDB jobs "
                    f"database keeps names of at most {NAME_MAX}: shorten it"
                )
            if len(kwargs) > KWARGS_MAX:
                raise QueueError(
                    f"job {job!r}: its keyword arguments are {len(kwargs)} characters of "
                    f"JSON; a MariaDB jobs database keeps at most {KWARGS_MAX}: pass a "
                    "reference (a path, a table name) instead of the data, or use "
                    "PostgreSQL or SQLite"
                )

    def one_submission(self, conn: Connection) -> None:
        """Submissions resolve against each other's chunks: one at a time, until the
        transaction ends (PostgreSQL: an advisory lock; MariaDB, whose named locks are
        the session's: a row of ``rb_jobs_signals``; SQLite: its write lock)."""
        if self.dialect == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7201)")
        elif self.dialect == "mariadb":
            conn.execute(
                select(signals.c.value).where(signals.c.name == SUBMISSIONS).with_for_update()
            )

    def notify(self, conn: Connection) -> None:
        """Wake waiting workers when the transaction commits (PostgreSQL: ``NOTIFY``;
        MariaDB: a counter in ``rb_jobs_signals``, which workers poll)."""
        if self.dialect == "postgresql":
            conn.execute(_NOTIFY)
        elif self.dialect == "mariadb":
            conn.execute(
                update(signals).where(signals.c.name == WAKES).values(value=signals.c.value + 1)
            )

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
# The URL schemes of a MariaDB jobs database (MySQL's protocol; MySQL itself lacks
# INSERT … RETURNING, which submissions use, and is refused by name at connect).
MARIADB_SCHEMES = ("mysql", "mariadb", "mysql+pymysql", "mariadb+pymysql")
MARIADB_MIN = (10, 6)  # SKIP LOCKED


def mariadb_refusal(version: str) -> str | None:
    """Why a server answering ``SELECT VERSION()`` with ``version`` cannot hold a jobs
    database (None: it can)."""
    numbers: list[int] = []
    # "5.5.5-" is what MariaDB 10+ put before its version for old MySQL clients
    for part in version.removeprefix("5.5.5-").split("-")[0].split(".")[:2]:
        if not part.isdigit():
            break
        numbers.append(int(part))
    if "mariadb" in version.lower() and tuple(numbers) >= MARIADB_MIN:
        return None
    return (
        f"the jobs database's server is {version}; riverbed's queue on the MySQL protocol "
        "needs MariaDB 10.6 or newer (SKIP LOCKED, INSERT … RETURNING)"
    )


def _mariadb_session(idle_limit: int, dbapi: Any, _record: Any) -> None:
    """Every new MariaDB connection: refuse a server that is not MariaDB 10.6+; UTC;
    standard ``SET`` (each expression reads the row's old values); a transaction silent
    for ``idle_limit`` seconds is ended."""
    with dbapi.cursor() as cur:
        cur.execute("SELECT VERSION()")
        refusal = mariadb_refusal(str(cur.fetchone()[0]))
        if refusal:
            raise QueueError(refusal)
        cur.execute(
            "SET time_zone = '+00:00', "
            "sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES,SIMULTANEOUS_ASSIGNMENT'), "
            f"idle_transaction_timeout = {int(idle_limit)}"
        )


def _postgres_session(idle_limit: int, dbapi: Any, _record: Any) -> None:
    """Every new PostgreSQL connection: a transaction silent for ``idle_limit`` seconds
    is ended, and the server probes a silent client after 10 s (then every 5 s, 3 times)
    and gives up on unacknowledged data after 30 s, instead of the operating system's
    two hours (``tcp_user_timeout``: PostgreSQL 12+)."""
    dbapi.execute(
        f"SET idle_in_transaction_session_timeout = '{int(idle_limit)}s'; "
        "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; "
        "SET tcp_keepalives_count = 3; SET tcp_user_timeout = 30000"
    )
    dbapi.commit()


# One advisory lock key for schema changes of this database (any constant works; this
# one spells "rbschema" in ASCII so it is recognisable in pg_locks).
_SCHEMA_LOCK = text("SELECT pg_advisory_xact_lock(8242277138831863137)")
# MariaDB's named locks are the server's: the name holds the database's.
_MARIADB_LOCK = "CONCAT('riverbed_jobs_schema.', DATABASE())"


def _first_line(exc: BaseException) -> str:
    msg = str(getattr(exc, "orig", None) or exc).strip()
    return msg.splitlines()[0] if msg else type(exc).__name__
