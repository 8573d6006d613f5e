"""What every part of the job queue shares: the chunk states, a job's execution policy,
a claim (the attempt is its fencing token), and the base the queue's parts build on
(the database, the transitions of :mod:`riverbed.jobs.transitions`, the term check).
The rules every transition keeps are in :mod:`riverbed.jobs.queue`."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select, update

from riverbed.fencing import Fence, Term
from riverbed.jobs.errors import FencedError
from riverbed.jobs.reads import QueueReader
from riverbed.jobs.schema import (
    Database,
    meta,
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


class QueueBase(QueueReader):
    """One jobs database, opened for writing (the schema is created or upgraded)."""

    def __init__(self, db: Database | str, create: bool = True) -> None:
        super().__init__(db)
        self.transitions = Transitions(self.db)
        self.term_fence = SqlFence(self.db, self._now)
        if create:
            self.db.create()

    # -- helpers ------------------------------------------------------------------------

    def _check_term(self, conn: Connection, term: int) -> None:
        self.term_fence.check_in(conn, term)
