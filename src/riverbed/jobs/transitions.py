"""How a chunk ends, inside the transaction that ends it.

:class:`Transitions` holds the state transitions every ending shares, so a success, a
failure, a reaped worker and a cancellation all keep the same books:

* ``settle``: a member of one or more runs ended — count it in each run's
  ``active_left`` (and ``failed``); a run with none left ends DONE, FAILED or CANCELED;
* ``cascade``: everything waiting, transitively, on a chunk that will never succeed
  ends UPSTREAM_FAILED (or CANCELED);
* ``split``: a failed chunk of a bisecting job is replaced by its two halves, for its
  dependents and its runs alike.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, insert, select, update

from riverbed.jobs.errors import FencedError
from riverbed.jobs.schema import ROW_LOCKS, Database, chunks, edges, members
from riverbed.jobs.statements import compiled, update_returning

FAILURES = ("FAILED", "UPSTREAM_FAILED")


class Transitions:
    """Transitions on an open write transaction of ``db``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.statements = compiled(db.dialect)

    def fail(
        self,
        conn: Connection,
        chunk_id: int,
        attempt: int,
        error: str,
        cancelled: bool,
        now: float,
    ) -> str:
        q = select(chunks).where(
            chunks.c.id == chunk_id, chunks.c.attempt == attempt, chunks.c.state == "RUNNING"
        )
        if self.db.dialect in ROW_LOCKS:
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise FencedError(
                f"chunk {chunk_id} attempt {attempt} is no longer running under this claim; "
                "its failure is not recorded"
            )
        cancelled = cancelled or bool(row.cancel_requested)
        if cancelled:
            self.end(conn, chunk_id, "CANCELED", error, now)
            self.end_attempt(conn, chunk_id, attempt, "CANCELED", error, now)
            self.settle(conn, chunk_id, failed=False, now=now)
            self.cascade(conn, chunk_id, "CANCELED", now)
            return "CANCELED"
        self.end_attempt(conn, chunk_id, attempt, "FAILED", error, now)
        if attempt < row.max_attempts:
            delay = float(row.backoff) * (2 ** (attempt - 1))
            conn.execute(
                update(chunks)
                .where(chunks.c.id == chunk_id)
                .values(state="PENDING", not_before=now + delay, error=error, worker=None)
            )
            self.db.notify(conn)
            return "PENDING"
        if row.bisect and row.n_ids > 1:
            self.split(conn, row, error, now)
            return "SPLIT"
        self.end(conn, chunk_id, "FAILED", error, now)
        self.settle(conn, chunk_id, failed=True, now=now)
        self.cascade(conn, chunk_id, "UPSTREAM_FAILED", now)
        return "FAILED"

    def end(
        self, conn: Connection, chunk_id: int, state: str, error: str | None, now: float
    ) -> None:
        conn.execute(
            update(chunks)
            .where(chunks.c.id == chunk_id)
            .values(state=state, finished_at=now, error=error)
        )

    def end_attempt(
        self,
        conn: Connection,
        chunk_id: int,
        attempt: int,
        state: str,
        error: str | None,
        now: float,
    ) -> None:
        self.statements.end_attempt(
            conn,
            {
                "b_id": chunk_id,
                "b_attempt": attempt,
                "b_state": state,
                "b_error": error,
                "b_now": now,
            },
        )

    def split(self, conn: Connection, row: Any, error: str, now: float) -> None:
        """Bisect a failed chunk: two halves replace it for its dependents and masters."""
        ids = json.loads(row.work_ids)
        mid = len(ids) // 2
        base = {
            k: getattr(row, k)
            for k in (
                "master",
                "job",
                "kind",
                "kwargs",
                "max_attempts",
                "backoff",
                "timeout",
                "bisect",
                "code_version",
            )
        }
        halves = [
            int(
                conn.execute(
                    insert(chunks)
                    .values(
                        **base,
                        state="PENDING",
                        work_ids=json.dumps(part),
                        n_ids=len(part),
                        deps_left=0,
                        active_left=0,
                        failed=0,
                        not_before=now,
                        created_at=now,
                        parent=row.id,
                    )
                    .returning(chunks.c.id)
                ).scalar_one()
            )
            for part in (ids[:mid], ids[mid:])
        ]
        self.end(conn, row.id, "SPLIT", f"bisected into {halves[0]} and {halves[1]}: {error}", now)
        downs = [
            int(d)
            for (d,) in conn.execute(
                select(edges.c.downstream).where(edges.c.upstream == row.id)
            ).all()
        ]
        if downs:
            conn.execute(
                insert(edges), [{"upstream": h, "downstream": d} for h in halves for d in downs]
            )
            conn.execute(
                update(chunks)
                .where(chunks.c.id.in_(downs), chunks.c.kind != "master")
                .values(deps_left=chunks.c.deps_left + 1)
            )
        masters = [
            int(m)
            for (m,) in conn.execute(select(members.c.master).where(members.c.chunk == row.id))
        ]
        if masters:
            conn.execute(
                insert(members), [{"master": m, "chunk": h} for m in masters for h in halves]
            )
            conn.execute(
                update(chunks)
                .where(chunks.c.id.in_(masters))
                .values(active_left=chunks.c.active_left + 2)
            )
        self.settle(conn, row.id, failed=False, now=now)
        self.db.notify(conn)

    def cascade(self, conn: Connection, chunk_id: int, state: str, now: float) -> None:
        """Everything waiting (transitively) on ``chunk_id`` ends as ``state``."""
        why = (
            f"upstream chunk {chunk_id} was cancelled"
            if state == "CANCELED"
            else f"upstream chunk {chunk_id} failed"
        )
        frontier = [chunk_id]
        while frontier:
            downs = update_returning(
                conn,
                chunks,
                [
                    chunks.c.id.in_(
                        select(edges.c.downstream)
                        .where(edges.c.upstream.in_(frontier))
                        .scalar_subquery()
                    ),
                    chunks.c.state.in_(("QUEUED", "PENDING")),
                    chunks.c.kind != "master",
                ],
                {"state": state, "finished_at": now, "error": why},
                [chunks.c.id],
            )
            frontier = [int(d) for (d,) in downs]
            for d in frontier:
                self.settle(conn, d, failed=state in FAILURES, now=now)

    def settle(self, conn: Connection, chunk_id: int, failed: bool, now: float) -> None:
        """A member ended: count it in each of its masters and end those with none left."""
        masters = self.statements.settle(conn, {"b_id": chunk_id, "b_failed": 1 if failed else 0})
        self.settled(conn, masters, now)

    def settled(self, conn: Connection, masters: list[Any], now: float | None = None) -> None:
        """End the masters (``id, active_left`` rows of the settle statement) with no
        member left."""
        for master_id, left in masters:
            if left <= 0:
                if now is None:
                    now = float(self.statements.now(conn)[0].now)
                self.settle_master(conn, int(master_id), now)

    def settle_master(self, conn: Connection, master_id: int, now: float) -> None:
        row = conn.execute(
            select(chunks.c.state, chunks.c.failed, chunks.c.cancel_requested).where(
                chunks.c.id == master_id
            )
        ).one()
        if row.state != "MASTER":
            return
        if row.cancel_requested:
            state, error = "CANCELED", "cancelled by request"
        elif row.failed:
            state, error = "FAILED", f"{row.failed} chunk(s) failed"
        else:
            state, error = "DONE", None
        self.end(conn, master_id, state, error, now)
