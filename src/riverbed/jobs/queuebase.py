"""What every part of the job queue shares: the chunk states, a job's execution policy,
a claim (the attempt is its fencing token), and the base the queue's parts build on
(the database, the transitions of :mod:`riverbed.jobs.transitions`, the term check).
The rules every transition keeps are in :mod:`riverbed.jobs.queue`."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from riverbed.jobs.reads import QueueReader
from riverbed.jobs.schema import (
    Database,
)
from riverbed.jobs.transitions import Transitions

ACTIVE = ("QUEUED", "PENDING", "RUNNING")
ENDED = ("DONE", "FAILED", "CANCELED", "UPSTREAM_FAILED", "SPLIT")


@dataclass(frozen=True)
class Policy:
    """Per-job execution settings copied into each chunk row at submission."""

    kind: str = "python"
    max_attempts: int = 1
    backoff: float = 5.0
    timeout: float | None = None
    bisect: bool = False
    code_version: str = ""


@dataclass(frozen=True)
class Claim:
    """A chunk a worker now runs, with its attempt: the fencing token."""

    id: int
    master: int | None
    job: str
    kind: str
    kwargs: dict[str, Any]
    work_ids: list[int]
    attempt: int
    timeout: float | None
    code_version: str
    kwargs_json: str = "{}"  # as stored: the freshness key


_Settled = namedtuple("_Settled", ["id", "active_left"])
ANALYZE_AFTER = 1000  # new chunks in one submission that refresh PostgreSQL's statistics


class QueueBase(QueueReader):
    """One jobs database, opened for writing (the schema is created or upgraded)."""

    def __init__(self, db: Database | str, create: bool = True) -> None:
        super().__init__(db)
        self.transitions = Transitions(self.db)
        if create:
            self.db.create()

    # -- helpers ------------------------------------------------------------------------

    def _check_term(self, conn: Connection, term: int) -> None:
        """Raise unless ``term`` acts, inside the transaction of ``conn``."""
        self.term_fence.check_in(conn, term)
