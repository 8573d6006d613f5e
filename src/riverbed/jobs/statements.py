"""The statements on a chunk's path (claim → heartbeat → succeed), compiled once.

Building a SQLAlchemy Core statement, its cache key and its execution context costs far
more than running it on SQLite: a worker that built ~16 statements per no-op chunk spent
90 % of its time inside SQLAlchemy. The hot statements are therefore written once with
SQLAlchemy (so the dialects stay one definition), compiled once per dialect, and run
on the transaction's own DBAPI cursor — same connection, same transaction, none of the
per-call machinery. Cold paths (submission, grooming, the CLI's reads) keep using
SQLAlchemy directly.

MariaDB has no ``UPDATE … RETURNING``: there an update that returns rows is a
:class:`Locked` — lock the rows its ``WHERE`` names, update those ids, read them back,
in the one transaction (:func:`update_returning` for the cold paths).

Bound parameters are named ``b_*`` so they never collide with column names. The
database clock is read inside the first statement of a transaction (``RETURNING``) and
passed on as ``b_now``, so one transaction uses one clock reading throughout.
"""

from __future__ import annotations

import contextlib
import functools
from collections import namedtuple
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    Connection,
    Integer,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from riverbed.jobs.schema import attempts, chunks, db_now, edges, freshness, latest, members


def upsert(dialect: str, table: Any, keys: list[str], *cols: str) -> Any:
    """INSERT … ON CONFLICT (keys) DO UPDATE SET col = excluded.col, … (MariaDB: ON
    DUPLICATE KEY UPDATE — its only keys are the ones named)."""
    if dialect == "mariadb":
        ins = mysql_dialect.insert(table)
        return ins.on_duplicate_key_update({col: ins.inserted[col] for col in cols})
    mod = pg_dialect if dialect == "postgresql" else sqlite_dialect
    stmt = mod.insert(table)
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={col: getattr(stmt.excluded, col) for col in cols}
    )


def _compiler(dialect: str) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import psycopg

        return psycopg.dialect()  # type: ignore[no-untyped-call]
    if dialect == "mariadb":
        from sqlalchemy.dialects.mysql import pymysql

        return pymysql.dialect(is_mariadb=True, paramstyle="pyformat")
    return sqlite_dialect.pysqlite.dialect(paramstyle="named")


class Locked:
    """``UPDATE table SET values WHERE where RETURNING returning`` on a database without
    it (MariaDB): ``SELECT id … FOR UPDATE`` (optionally the ``limit`` lowest ids,
    skipping rows others hold), ``UPDATE … WHERE id IN (those)``, then ``SELECT
    returning`` of them — in the caller's transaction, so the locked rows still match
    ``where`` when they are updated and read back with their new values. Runs through
    SQLAlchemy (bound parameters ``b_*`` by name); the same interface as :class:`Raw`."""

    def __init__(
        self,
        table: Any,
        where: Sequence[Any],
        values: Mapping[str, Any],
        returning: Sequence[Any],
        *,
        limit: Any = None,
        skip_locked: bool = False,
    ) -> None:
        pick = select(table.c.id).where(*where)
        if limit is not None:
            pick = pick.order_by(table.c.id).limit(limit)
        self._pick = pick.with_for_update(skip_locked=skip_locked)
        self._table, self._values, self._returning = table, dict(values), list(returning)

    def __call__(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        params = dict(params or {})
        ids = [int(i) for i in conn.execute(self._pick, params).scalars()]
        if not ids:
            return []
        table = self._table
        conn.execute(update(table).where(table.c.id.in_(ids)).values(self._values), params)
        if not self._returning:
            return [(i,) for i in ids]
        return list(
            conn.execute(
                select(*self._returning).where(table.c.id.in_(ids)).order_by(table.c.id), params
            )
        )

    def send(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Pending:
        return Pending(self, rows=self(conn, params))  # type: ignore[arg-type]


def update_returning(
    conn: Connection,
    table: Any,
    where: Sequence[Any],
    values: Mapping[str, Any],
    returning: Sequence[Any],
) -> list[Any]:
    """``UPDATE … RETURNING`` on every database (a :class:`Locked` on MariaDB)."""
    if conn.dialect.name == "mariadb":
        return Locked(table, where, values, returning)(conn)
    return list(conn.execute(update(table).where(*where).values(values).returning(*returning)))


class Pending:
    """A statement sent; its rows once the round trip is over (see :func:`pipeline`)."""

    def __init__(self, raw: Raw, cur: Any = None, rows: list[Any] | None = None) -> None:
        self._raw, self._cur, self._rows = raw, cur, rows

    def rows(self) -> list[Any]:
        if self._rows is None:
            try:
                self._rows = self._raw._fetch(self._cur)
            finally:
                self._cur.close()
        return self._rows


class Raw:
    """One statement, compiled once, run on the DBAPI cursor of an open transaction."""

    def __init__(self, stmt: Any, dialect: str) -> None:
        self.dialect = dialect
        self._row: Any = None
        if isinstance(stmt, str):  # SQL written for this dialect (its own paramstyle)
            self.sql: str = stmt
            self.fixed: dict[str, Any] = {}
            return
        compiled = stmt.compile(dialect=_compiler(dialect))
        self.sql = compiled.string
        # Values fixed when the statement was built (``state='RUNNING'``, the kinds …).
        self.fixed = {k: v for k, v in compiled.params.items() if not k.startswith("b_")}

    def __repr__(self) -> str:
        return f"Raw({self.sql!r})"

    def _fetch(self, cur: Any) -> list[Any]:
        if cur.description is None:
            return []
        if self._row is None:
            self._row = namedtuple("Row", [d[0] for d in cur.description])  # type: ignore[misc]
        return [self._row(*r) for r in cur.fetchall()]

    def send(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Pending:
        """Execute; inside :func:`pipeline` on PostgreSQL the rows wait for the sync.
        (SQLite answers at once: an unfinished statement would block the commit.)"""
        cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(self.sql, {**self.fixed, **params} if params else self.fixed)
        except BaseException:
            cur.close()
            raise
        if self.dialect == "postgresql":
            return Pending(self, cur)
        pending = Pending(self, cur)
        pending.rows()
        return pending

    def __call__(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run it; the returned (or selected) rows, as named tuples."""
        return self.send(conn, params).rows()

    def many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row (no rows back). Inside :func:`pipeline` the cursor stays
        open until the sync and is closed with it."""
        cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cur.executemany(self.sql, [{**self.fixed, **r} for r in rows])
        if self.dialect != "postgresql":
            cur.close()


@contextlib.contextmanager
def pipeline(conn: Connection) -> Iterator[None]:
    """Statements sent inside go to PostgreSQL in one round trip (psycopg pipeline
    mode: nothing waits for an answer until the block ends). A no-op on SQLite."""
    driver = conn.connection.driver_connection
    if hasattr(driver, "pipeline"):
        with driver.pipeline():  # type: ignore[union-attr]
            yield
    else:
        yield


_b_id: BindParameter[Any] = bindparam("b_id")
_b_attempt: BindParameter[Any] = bindparam("b_attempt")
_b_now: BindParameter[Any] = bindparam("b_now")


class Statements:
    """The compiled hot statements of one dialect (:func:`hot` caches one per dialect)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        now = db_now(dialect)
        self._now_sql = now
        self.now = Raw(select(now.label("now")), dialect)
        self.next_retry = Raw(
            select(func.min(chunks.c.not_before).label("at"), now.label("now")).where(
                chunks.c.state == "PENDING", chunks.c.not_before > now
            ),
            dialect,
        )
        self.state = Raw(select(chunks.c.state).where(chunks.c.id == _b_id), dialect)
        self.start_attempts = Raw(
            insert(attempts).values(
                chunk=bindparam("b_chunk"),
                attempt=bindparam("b_attempt"),
                worker=bindparam("b_worker"),
                host=bindparam("b_host"),
                code_version=bindparam("b_code_version"),
                started_at=bindparam("b_started_at"),
                state="RUNNING",
            ),
            dialect,
        )
        self.succeed = self._updating(
            [chunks.c.id == _b_id, chunks.c.attempt == _b_attempt, chunks.c.state == "RUNNING"],
            {
                "state": "DONE",
                "finished_at": now,
                "error": None,
                "output_attempt": bindparam("b_output"),
                # its output was published before this (riverbed.jobs.publication)
                "materialized": bindparam("b_output", type_=Integer).is_not(None),
            },
            [chunks.c.id],
        )
        self.end_attempt = Raw(
            update(attempts)
            .where(attempts.c.chunk == _b_id, attempts.c.attempt == _b_attempt)
            .values(state=bindparam("b_state"), finished_at=_b_now, error=bindparam("b_error")),
            dialect,
        )
        # The success path: sent together (one round trip on PostgreSQL), so each reads
        # the clock itself instead of waiting for the first statement's answer.
        self.attempt_done = Raw(
            update(attempts)
            .where(attempts.c.chunk == _b_id, attempts.c.attempt == _b_attempt)
            .values(state="DONE", finished_at=now, error=None),
            dialect,
        )
        self.fresh = Raw(
            upsert(
                dialect, freshness, ["job", "kwargs", "work_id"], "succeeded_at", "code_version"
            ).values(
                job=bindparam("b_job"),
                kwargs=bindparam("b_kwargs"),
                work_id=bindparam("b_work_id"),
                succeeded_at=now,
                code_version=bindparam("b_code_version"),
            ),
            dialect,
        )
        self.latest = Raw(
            upsert(dialect, latest, ["job", "kwargs"], "succeeded_at", "code_version").values(
                job=bindparam("b_job"),
                kwargs=bindparam("b_kwargs"),
                succeeded_at=now,
                code_version=bindparam("b_code_version"),
            ),
            dialect,
        )
        # Only a success counts down a dependent's deps_left; one at zero starts now
        # (SET expressions read the row's old values on every database: MariaDB under
        # SIMULTANEOUS_ASSIGNMENT, which each session sets).
        starts = and_(chunks.c.deps_left == 1, chunks.c.state == "QUEUED")
        self.deps_done = self._updating(
            [
                self._id_in(
                    select(edges.c.downstream).where(edges.c.upstream == _b_id).scalar_subquery()
                )
            ],
            {
                "deps_left": chunks.c.deps_left - 1,
                "state": case((starts, "PENDING"), else_=chunks.c.state),
                "not_before": case((starts, now), else_=chunks.c.not_before),
            },
            [chunks.c.id, chunks.c.state, chunks.c.deps_left],
        )
        self.settle = self._updating(
            [
                self._id_in(
                    select(members.c.master).where(members.c.chunk == _b_id).scalar_subquery()
                )
            ],
            {
                "active_left": chunks.c.active_left - 1,
                "failed": chunks.c.failed + bindparam("b_failed"),
            },
            [chunks.c.id, chunks.c.active_left],
        )

        if dialect == "postgresql":
            self.success: Raw | None = Raw(_pg_success(), dialect)
        else:
            self.success = None

    def __repr__(self) -> str:
        return f"Statements({self.dialect!r})"

    def _updating(
        self, where: Sequence[Any], values: Mapping[str, Any], returning: Sequence[Any]
    ) -> Raw | Locked:
        """``UPDATE rb_jobs_chunks … RETURNING``, compiled (a :class:`Locked` on MariaDB)."""
        if self.dialect == "mariadb":
            return Locked(chunks, where, values, returning)
        return Raw(update(chunks).where(*where).values(values).returning(*returning), self.dialect)

    def _id_in(self, ids: Any) -> Any:
        """``chunks.id IN (ids)`` that stays an index lookup. PostgreSQL plans ``IN
        (subquery)`` as a join, and with the row estimates of a freshly filled queue
        that is a hash join over a sequential scan of every chunk — per completed chunk;
        ``= ANY(ARRAY(subquery))`` runs the subquery once and probes the primary key."""
        if self.dialect == "postgresql":
            return chunks.c.id == func.any(func.array(ids))
        return chunks.c.id.in_(ids)

    def _kinds(self, kinds: Sequence[str]) -> Any:
        return chunks.c.kind.in_([literal(k) for k in kinds])

    @functools.cache  # noqa: B019 - one Statements per dialect, kept for the process's life
    def has_work(self, kinds: tuple[str, ...]) -> Raw:
        return Raw(
            select(chunks.c.id)
            .where(
                chunks.c.state == "PENDING",
                chunks.c.not_before <= self._now_sql,
                self._kinds(kinds),
            )
            .limit(1),
            self.dialect,
        )

    @functools.cache  # noqa: B019
    def claim(self, kinds: tuple[str, ...], in_run: bool) -> Raw | Locked:
        now = self._now_sql
        where = [chunks.c.state == "PENDING", chunks.c.not_before <= now, self._kinds(kinds)]
        if in_run:
            where.append(
                chunks.c.id.in_(
                    select(members.c.chunk)
                    .where(members.c.master == bindparam("b_master"))
                    .scalar_subquery()
                )
            )
        worker: BindParameter[Any] = bindparam("b_worker")
        host: BindParameter[Any] = bindparam("b_host")
        values = {
            "state": "RUNNING",
            "attempt": chunks.c.attempt + 1,
            "worker": worker,
            "host": host,
            "started_at": now,
            "heartbeat_at": now,
            "cancel_requested": False,
        }
        returning = [
            chunks.c.id,
            chunks.c.master,
            chunks.c.job,
            chunks.c.kind,
            chunks.c.kwargs,
            chunks.c.work_ids,
            chunks.c.attempt,
            chunks.c.timeout,
            chunks.c.code_version,
            chunks.c.started_at,
        ]
        if self.dialect == "mariadb":  # the attempts are inserted next (start_attempts)
            return Locked(
                chunks, where, values, returning, limit=bindparam("b_limit"), skip_locked=True
            )
        pick = select(chunks.c.id).where(*where).order_by(chunks.c.id).limit(bindparam("b_limit"))
        if self.dialect == "postgresql":
            pick = pick.with_for_update(skip_locked=True)
        # A materialized CTE: PostgreSQL may re-run an ``IN (SELECT … LIMIT n)``
        # subquery per row and claim more than ``limit`` chunks.
        picked = pick.cte("picked").prefix_with("MATERIALIZED")
        claim = (
            update(chunks)
            .where(chunks.c.id == picked.c.id, chunks.c.state == "PENDING")
            .values(values)
            .returning(*returning)
        )
        if self.dialect != "postgresql":
            return Raw(claim, self.dialect)  # the attempts are inserted next (start_attempts)
        # PostgreSQL: the attempts are inserted by the same statement (a data-modifying
        # CTE), one statement and no extra round trip.
        claimed = claim.cte("claimed")
        started = (
            insert(attempts)
            .from_select(
                ["chunk", "attempt", "worker", "host", "code_version", "started_at", "state"],
                select(
                    claimed.c.id,
                    claimed.c.attempt,
                    worker,
                    host,
                    claimed.c.code_version,
                    claimed.c.started_at,
                    literal("RUNNING"),
                ),
            )
            .cte("started")
        )
        return Raw(select(claimed).add_cte(started), self.dialect)

    @property
    def claim_starts_attempts(self) -> bool:
        """Whether :meth:`claim` inserts the attempt rows itself."""
        return self.dialect == "postgresql"


def _pg_success() -> str:
    """The whole success path as one PostgreSQL statement (data-modifying CTEs).

    The same effects as ``succeed``, ``attempt_done``, ``fresh``/``latest``,
    ``deps_done`` and ``settle`` — one statement to send instead of six (in pipeline
    mode each costs the client ~0.15 ms). Its two UPDATEs of rb_jobs_chunks touch
    different rows (the chunk; its dependents and runs), as one statement requires.
    ``done`` = 0 means the attempt is not ours, and then nothing else changed either
    (every part waits for ``done``), so a batch can record its other chunks.
    One reading of the database clock (epoch seconds, as :func:`db_now`) for all of it.
    """
    return """
WITH clock AS (
    SELECT extract(epoch from clock_timestamp())::double precision AS now
), done AS (
    UPDATE rb_jobs_chunks SET state = 'DONE', finished_at = (SELECT now FROM clock),
        error = NULL, output_attempt = %(b_output)s,
        materialized = (%(b_output)s::integer IS NOT NULL)
    WHERE id = %(b_id)s AND attempt = %(b_attempt)s AND state = 'RUNNING'
    RETURNING id
), attempt_done AS (
    UPDATE rb_jobs_attempts SET state = 'DONE', finished_at = (SELECT now FROM clock),
        error = NULL
    WHERE chunk = %(b_id)s AND attempt = %(b_attempt)s AND EXISTS (SELECT FROM done)
), fresh AS (
    INSERT INTO rb_jobs_freshness (job, kwargs, work_id, succeeded_at, code_version)
    SELECT %(b_job)s, %(b_kwargs)s, w, (SELECT now FROM clock), %(b_code_version)s
    FROM unnest(%(b_work_ids)s::bigint[]) AS w WHERE EXISTS (SELECT FROM done)
    ON CONFLICT (job, kwargs, work_id) DO UPDATE SET succeeded_at = excluded.succeeded_at,
        code_version = excluded.code_version
), latest AS (
    INSERT INTO rb_jobs_latest (job, kwargs, succeeded_at, code_version)
    SELECT %(b_job)s, %(b_kwargs)s, (SELECT now FROM clock), %(b_code_version)s
    WHERE cardinality(%(b_work_ids)s::bigint[]) = 0 AND EXISTS (SELECT FROM done)
    ON CONFLICT (job, kwargs) DO UPDATE SET succeeded_at = excluded.succeeded_at,
        code_version = excluded.code_version
), linked AS (
    SELECT ARRAY(SELECT downstream FROM rb_jobs_edges WHERE upstream = %(b_id)s) AS down,
           ARRAY(SELECT master FROM rb_jobs_members WHERE chunk = %(b_id)s) AS runs
), counted AS (
    -- One UPDATE for the dependents and the runs: a run's row is also a dependent of
    -- its root chunks, and one statement may change a row only once.
    UPDATE rb_jobs_chunks SET
        deps_left = deps_left - (id = ANY((SELECT down FROM linked)::bigint[]))::int,
        state = CASE WHEN id = ANY((SELECT down FROM linked)::bigint[]) AND deps_left = 1
                          AND state = 'QUEUED' THEN 'PENDING' ELSE state END,
        not_before = CASE WHEN id = ANY((SELECT down FROM linked)::bigint[]) AND deps_left = 1
                               AND state = 'QUEUED' THEN (SELECT now FROM clock)
                          ELSE not_before END,
        active_left = active_left - (id = ANY((SELECT runs FROM linked)::bigint[]))::int
    WHERE id = ANY((SELECT down || runs FROM linked)::bigint[]) AND EXISTS (SELECT FROM done)
    RETURNING id, state, deps_left, active_left,
        id = ANY((SELECT runs FROM linked)::bigint[]) AS run
)
SELECT (SELECT count(*) FROM done) AS done,
       (SELECT count(*) FROM counted WHERE NOT run AND state = 'PENDING' AND deps_left = 0)
           AS started,
       (SELECT coalesce(array_agg(id), '{}') FROM counted WHERE run) AS settled_ids,
       (SELECT coalesce(array_agg(active_left), '{}') FROM counted WHERE run) AS settled_left
"""


@functools.cache
def compiled(dialect: str) -> Statements:
    return Statements(dialect)
