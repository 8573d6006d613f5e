"""The acting orchestrator's term in the jobs database (:mod:`riverbed.fencing`).

One row (``rb_jobs_meta``, id 1) holds the term. A claim is one
``UPDATE … WHERE term <= :term``; each grooming transaction checks its term inside
itself (:meth:`SqlFence.check_in`), on PostgreSQL and MariaDB under a share lock of
the row, so a claim waits for the older term's writes in flight and none of them can
commit after the claim.

That wait is bounded: a transaction whose client went silent — its orchestrator cut
off or paused mid-write — is ended by the server after
:data:`~riverbed.jobs.schema.IDLE_IN_TRANSACTION` seconds (each session says so,
:class:`~riverbed.jobs.schema.Database`). The claim meanwhile waits in steps of
:data:`CLAIM_STEP` seconds and says in the log whom it waits for, so a standby that is
about to lead never looks like one that is stuck.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, select, update

from riverbed.fencing import Fence, Term
from riverbed.jobs.errors import FencedError, QueueError
from riverbed.jobs.schema import ROW_LOCKS, Database, meta

log = logging.getLogger(__name__)

CLAIM_STEP = 2  # seconds a claim waits for the row lock before it says so and waits again
# a claim gives up (the orchestrator steps down and campaigns again) after this many idle
# limits: the server ends a silent holder's transaction after one
CLAIM_PATIENCE = 4


class SqlFence(Fence):
    """The acting orchestrator's term as the jobs database's one meta row (see the
    module's docstring)."""

    def __init__(self, db: Database, now: Callable[[Connection], float]) -> None:
        super().__init__("the orchestrator", FencedError)
        self.db, self.now = db, now

    def _record(self, term: int, holder: str, since: str) -> bool:
        started = time.monotonic()
        told = False
        while True:
            try:
                return self._update(term, holder)
            except QueueError as exc:
                if not self.db.lock_timed_out(exc):
                    raise
            waited = time.monotonic() - started
            if waited >= CLAIM_PATIENCE * self.db.idle_limit:
                raise QueueError(
                    f"the claim of term {term} waited {waited:.0f}s for a transaction of "
                    f"{self.current() or 'an older term'} that stays open; the jobs "
                    f"database should end it after {self.db.idle_limit}s idle "
                    "(is idle_in_transaction_session_timeout, or MariaDB's "
                    "idle_transaction_timeout, overridden for riverbed's user?)"
                )
            if not told:
                told = True
                log.warning(
                    "the claim of term %d waits for a write of %s still open in the jobs "
                    "database (its orchestrator cut off or paused mid-write); the "
                    "database ends it after %ds of silence",
                    term,
                    self.current() or "an older term",
                    self.db.idle_limit,
                )

    def _update(self, term: int, holder: str) -> bool:
        with self.db.write() as conn, self.db.lock_wait(conn, CLAIM_STEP):
            done = conn.execute(
                update(meta)
                .where(meta.c.id == 1, meta.c.term <= term)
                .values(term=term, leader=holder, since=self.now(conn))
            ).rowcount
            return bool(done)

    def _row(self, conn: Connection, lock: bool = False) -> Term | None:
        q = select(meta.c.term, meta.c.leader, meta.c.since).where(meta.c.id == 1)
        if lock and self.db.dialect in ROW_LOCKS:
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
