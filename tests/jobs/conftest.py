"""Fixtures of the jobs suites: a cluster of real processes on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.cluster import Cluster


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, subprocess_env: dict[str, str]
) -> Iterator[Cluster]:
    """Orchestrators and workers as child processes, on a fresh jobs database of each
    kind (PostgreSQL: a real server the session's fixture started)."""
    db = request.getfixturevalue("postgres_db") if request.param == "postgres" else None
    c = Cluster(tmp_path, subprocess_env, db=db)
    yield c
    c.stop()


def on(*databases: str) -> pytest.MarkDecorator:
    """Run a ``cluster`` test on these jobs databases only (the default is both). The
    queue's contract suite runs every database operation on both; a crash scenario is
    about the worker's and the orchestrator's logic, so each runs on one, and the
    scenarios alternate so that both databases see crashes."""
    params = [
        pytest.param(db, marks=pytest.mark.postgres) if db == "postgres" else db for db in databases
    ]
    return pytest.mark.parametrize("cluster", params, indirect=True)
