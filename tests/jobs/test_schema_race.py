"""Processes started together on a fresh (or older) jobs database all come up.

A supervisor starts orchestrators and workers at the same moment; each creates or
upgrades the schema on start. On PostgreSQL, ``CREATE TABLE`` from several sessions
at once races inside the catalog (``duplicate key value violates unique constraint
"pg_type_typname_nsp_index"``) unless creation is serialized; on MariaDB each DDL
statement commits by itself, so only a lock held across them (a named lock) keeps two
processes from both adding a column.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import func, inspect, select, text

from riverbed.jobs.schema import SCHEMA_VERSION, Database, meta, metadata
from tests.jobs.conftest import SERVERS

pytestmark = [pytest.mark.slow]

PROCESSES = 6
ROUNDS = 10  # a fresh database each; without the lock 25 of 120 starts failed (c952c1b)


def _create_in_rounds(dsns: list[str], barrier: Any, answers: Any) -> None:
    """One process: for each database, wait for the others, then create at once."""
    for dsn in dsns:
        barrier.wait(timeout=60)
        db = Database(dsn)
        try:
            db.create()
            answers.put((dsn, "ok"))
        except Exception as exc:  # the test reports every failure, with its text
            answers.put((dsn, f"{type(exc).__name__}: {exc}"))
        finally:
            db.dispose()


def _previous_schema(dsn: str) -> None:
    """The schema as an older riverbed left it: the claim index the pending-chunks
    index replaced, and none of the indexes and columns added since."""
    db = Database(dsn)
    on = {"mariadb": " ON {}"}.get(db.dialect, "")  # MariaDB names an index's table
    with db.write() as conn:
        metadata.create_all(conn)
        conn.execute(text("DROP INDEX rb_jobs_pending" + on.format("rb_jobs_chunks")))
        conn.execute(text("DROP INDEX rb_jobs_edges_down" + on.format("rb_jobs_edges")))
        conn.execute(text("ALTER TABLE rb_jobs_schedules DROP COLUMN catchup"))
        conn.execute(text("CREATE INDEX rb_jobs_claim ON rb_jobs_chunks (state, not_before, id)"))
        conn.execute(
            meta.insert().values(id=1, schema_version=SCHEMA_VERSION, term=0, leader="", since=0)
        )
    db.dispose()


@pytest.fixture(params=SERVERS)
def databases(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    server: Any = request.getfixturevalue(f"{request.param}_server")
    with ExitStack() as stack:
        yield [stack.enter_context(server.database()) for _ in range(ROUNDS)]


@pytest.mark.parametrize("start", ["fresh", "upgrade"])
def test_processes_started_together_all_create_or_upgrade_the_schema(
    databases: list[str], start: str
) -> None:
    if start == "upgrade":
        for dsn in databases:
            _previous_schema(dsn)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    answers = ctx.Queue()
    procs = [
        ctx.Process(target=_create_in_rounds, args=(databases, barrier, answers))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    got = [answers.get(timeout=120) for _ in range(PROCESSES * ROUNDS)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    failures = [(dsn.rsplit("/", 1)[1], why) for dsn, why in got if why != "ok"]
    assert failures == [], f"{len(failures)} of {len(got)} starts failed: {failures[:3]}"
    for dsn in databases:  # each database ended with the whole, current schema once
        db = Database(dsn)
        with db.read() as conn:
            names = set(inspect(conn).get_table_names())
            assert set(metadata.tables) <= names
            indexes = {i["name"] for i in inspect(conn).get_indexes("rb_jobs_chunks")}
            assert "rb_jobs_pending" in indexes and "rb_jobs_claim" not in indexes
            columns = {c["name"] for c in inspect(conn).get_columns("rb_jobs_schedules")}
            assert "catchup" in columns
            assert conn.execute(select(func.count()).select_from(meta)).scalar_one() == 1
            assert conn.execute(select(meta.c.schema_version)).scalar_one() == SCHEMA_VERSION
        db.dispose()
