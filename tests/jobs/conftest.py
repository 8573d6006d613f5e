"""Fixtures of the jobs suites: a cluster of real processes on SQLite, PostgreSQL or
MariaDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from riverbed.storage import storage_environment
from tests.jobs.cluster import Cluster


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, subprocess_env: dict[str, str]
) -> Iterator[Cluster]:
    """Orchestrators and workers as child processes, on a fresh jobs database of each
    kind (PostgreSQL, MariaDB: a real server the session's fixture started); ``s3``: on SQLite,
    with the checkpoints — and so the published outputs — in the tests' bucket."""
    servers = ("postgres", "mariadb")
    db = request.getfixturevalue(f"{request.param}_db") if request.param in servers else None
    checkpoints = request.getfixturevalue("s3_url") if request.param == "s3" else None
    env = {**subprocess_env, **storage_environment()}  # how s3_url's server is reached
    c = Cluster(tmp_path, env, db=db, checkpoints=checkpoints)
    yield c
    c.stop()


# the jobs databases that are servers, each with the marker of its fixture: for tests
# parametrized by ``kind`` that ask for ``<kind>_server`` / ``<kind>_db`` themselves
SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


def on(*databases: str) -> pytest.MarkDecorator:
    """Run a ``cluster`` test on these jobs databases only (the default is all three;
    ``s3`` is SQLite with outputs in a bucket). The queue's contract suite runs every
    database operation on each; a crash scenario is about the worker's and the
    orchestrator's logic, so most run on one or two, and the scenarios alternate so that
    every database sees crashes."""
    marks = {"postgres": pytest.mark.postgres, "mariadb": pytest.mark.mariadb, "s3": pytest.mark.s3}
    params = [pytest.param(db, marks=marks[db]) if db in marks else db for db in databases]
    return pytest.mark.parametrize("cluster", params, indirect=True)
