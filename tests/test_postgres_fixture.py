"""The PostgreSQL fixture: one real server per run, a fresh database per test."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("n", [1, 2])
def test_each_test_gets_an_empty_database(postgres_db: str, n: int) -> None:
    with psycopg.connect(postgres_db) as conn:
        # a table left by the other parametrization would make this fail
        conn.execute("CREATE TABLE marker (n int)")
        conn.execute("INSERT INTO marker VALUES (%s)", (n,))
        rows = conn.execute("SELECT n FROM marker").fetchall()
    assert rows == [(n,)]


def test_server_runs_skip_locked(postgres_db: str) -> None:
    # the jobs queue will rely on FOR UPDATE SKIP LOCKED; check the server honours it
    with psycopg.connect(postgres_db, autocommit=True) as a, psycopg.connect(postgres_db) as b:
        a.execute("CREATE TABLE q (id int primary key)")
        a.execute("INSERT INTO q VALUES (1), (2)")
        with b.transaction():
            first = b.execute("SELECT id FROM q ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1")
            assert first.fetchone() == (1,)
            with a.transaction():
                other = a.execute("SELECT id FROM q ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1")
                assert other.fetchone() == (2,)
