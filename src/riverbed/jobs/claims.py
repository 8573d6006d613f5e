"""What workers do to the queue: claim chunks (the attempt is the fencing token),
heartbeat them, and record how each ended — every write fenced by its attempt."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select, tuple_, update

from riverbed.jobs.errors import FencedError, NotFoundError
from riverbed.jobs.queuebase import Claim, QueueBase, _Settled
from riverbed.jobs.schema import (
    chunks,
)
from riverbed.jobs.statements import Pending, pipeline, update_returning


class Claims(QueueBase):
    """Claims, heartbeats, successes and failures."""

    # -- workers --------------------------------------------------------------------------

    def claim(
        self,
        worker: str,
        host: str,
        limit: int = 1,
        kinds: Sequence[str] = ("python", "spark"),
        master: int | None = None,
    ) -> list[Claim]:
        """Atomically move up to ``limit`` PENDING chunks to RUNNING for ``worker``
        (only chunks of run ``master``, if given)."""
        if limit < 1:
            return []
        with self.db.write() as conn:
            return self._claim(conn, worker, host, limit, kinds, master)

    def _claim(
        self,
        conn: Connection,
        worker: str,
        host: str,
        limit: int,
        kinds: Sequence[str],
        master: int | None = None,
    ) -> list[Claim]:
        return self._claimed(conn, self._send_claim(conn, worker, host, limit, kinds, master))

    def _send_claim(
        self,
        conn: Connection,
        worker: str,
        host: str,
        limit: int,
        kinds: Sequence[str],
        master: int | None = None,
    ) -> tuple[Pending, str, str]:
        params: dict[str, Any] = {"b_limit": limit, "b_worker": worker, "b_host": host}
        if master is not None:
            params["b_master"] = master
        return (
            self.statements.claim(tuple(kinds), master is not None).send(conn, params),
            worker,
            host,
        )

    def _claimed(self, conn: Connection, sent: tuple[Pending, str, str]) -> list[Claim]:
        """The claim's rows, their attempts recorded."""
        pending, worker, host = sent
        rows = pending.rows()
        if not rows:
            return []
        if not self.statements.claim_starts_attempts:
            self.statements.start_attempts.many(
                conn,
                [
                    {
                        "b_chunk": r.id,
                        "b_attempt": r.attempt,
                        "b_worker": worker,
                        "b_host": host,
                        "b_code_version": r.code_version,
                        "b_started_at": r.started_at,
                    }
                    for r in rows
                ],
            )
        return [
            Claim(
                int(r.id),
                None if r.master is None else int(r.master),
                r.job,
                r.kind,
                json.loads(r.kwargs),
                json.loads(r.work_ids),
                int(r.attempt),
                r.timeout,
                r.code_version,
                r.kwargs,
            )
            for r in sorted(rows, key=lambda r: r.id)
        ]

    def heartbeat(self, worker: str, held: Sequence[tuple[int, int]]) -> dict[int, str]:
        """Refresh the held (chunk, attempt) claims: each answers ``ok``, ``cancel``
        (stop it and record CANCELED) or ``lost`` (the attempt is no longer ours)."""
        if not held:
            return {}
        with self.db.write() as conn:
            now = self._now(conn)
            rows = update_returning(
                conn,
                chunks,
                [
                    tuple_(chunks.c.id, chunks.c.attempt).in_(list(held)),
                    chunks.c.state == "RUNNING",
                    chunks.c.worker == worker,
                ],
                {"heartbeat_at": now},
                [chunks.c.id, chunks.c.cancel_requested],
            )
        status = {int(i): ("cancel" if c else "ok") for i, c in rows}
        return {cid: status.get(cid, "lost") for cid, _ in held}

    def succeed(self, chunk_id: int, attempt: int, output: bool = False) -> None:
        """Record DONE (and, with ``output``, that this attempt's staged output is the
        published one) — only for the current attempt."""
        with self.db.write() as conn:
            row = conn.execute(
                select(
                    chunks.c.job, chunks.c.kwargs, chunks.c.work_ids, chunks.c.code_version
                ).where(chunks.c.id == chunk_id)
            ).first()
            if row is None:
                raise NotFoundError(f"no chunk {chunk_id}")
            ids = json.loads(row.work_ids)
            claim = Claim(
                chunk_id, None, row.job, "", {}, ids, attempt, None, row.code_version, row.kwargs
            )
            self._succeed(conn, claim, output)

    def succeed_and_claim(
        self,
        claim: Claim,
        output: bool,
        worker: str,
        host: str,
        limit: int,
        kinds: Sequence[str] = ("python", "spark"),
    ) -> list[Claim]:
        """:meth:`succeed` ``claim``, then :meth:`claim` up to ``limit`` more, in one
        transaction (one round trip for all of it but the attempts and the commit, on
        PostgreSQL). Raises :class:`FencedError` — and claims nothing — if the attempt
        is no longer ours."""
        with self.db.write() as conn:
            return self._succeed(
                conn, claim, output, (worker, host, limit, kinds) if limit > 0 else None
            )

    def succeed_many_and_claim(
        self,
        ended: Sequence[tuple[Claim, bool]],
        worker: str,
        host: str,
        limit: int,
        kinds: Sequence[str] = ("python", "spark"),
    ) -> tuple[list[int], list[Claim]]:
        """Record the successes ``ended`` ((claim, output) pairs) and claim up to
        ``limit`` more, in one transaction. Returns the ids whose attempt was no longer
        ours (nothing of theirs is recorded; the others are) and the new claims. A
        worker with many short chunks pays one transaction per batch, not per chunk."""
        with self.db.write() as conn:
            then = (worker, host, limit, kinds) if limit > 0 else None
            oks, claimed = self._record_successes(conn, ended, then)
            fenced = [c.id for (c, _), ok in zip(ended, oks, strict=True) if not ok]
            return fenced, (self._claimed(conn, claimed) if claimed else [])

    def _succeed(
        self,
        conn: Connection,
        claim: Claim,
        output: bool,
        then_claim: tuple[str, str, int, Sequence[str]] | None = None,
    ) -> list[Claim]:
        (ok,), claimed = self._record_successes(conn, [(claim, output)], then_claim)
        if not ok:  # nothing was changed; the transaction is rolled back all the same
            raise FencedError(
                f"chunk {claim.id} attempt {claim.attempt} is no longer running under this "
                "claim (reclaimed, cancelled or already recorded); its result is discarded"
            )
        return self._claimed(conn, claimed) if claimed else []

    def _record_successes(
        self,
        conn: Connection,
        ended: Sequence[tuple[Claim, bool]],
        then_claim: tuple[str, str, int, Sequence[str]] | None = None,
    ) -> tuple[list[bool], tuple[Pending, str, str] | None]:
        """Record each success whose attempt is still ours (True), skip the others
        (False, nothing of theirs changed). With ``then_claim``, the claim is sent in
        the same round trip; its rows come back for :meth:`_claimed`."""
        sql = self.statements
        oks: list[bool] = []
        started = False
        settled: list[Any] = []
        if sql.success is not None:  # PostgreSQL: one statement per chunk, pipelined
            with pipeline(conn):
                sent = [
                    sql.success.send(
                        conn,
                        {
                            "b_id": c.id,
                            "b_attempt": c.attempt,
                            "b_job": c.job,
                            "b_kwargs": c.kwargs_json,
                            "b_output": c.attempt if output else None,
                            "b_work_ids": list(c.work_ids),
                            "b_code_version": c.code_version,
                        },
                    )
                    for c, output in ended
                ]
                claimed = self._send_claim(conn, *then_claim) if then_claim else None
            for pending in sent:
                (row,) = pending.rows()
                oks.append(bool(row.done))
                started |= bool(row.started)
                settled += [
                    _Settled(i, n) for i, n in zip(row.settled_ids, row.settled_left, strict=True)
                ]
        else:  # SQLite answers each statement at once: check the fence first
            for c, output in ended:
                ids = {"b_id": c.id, "b_attempt": c.attempt}
                key = {
                    "b_job": c.job,
                    "b_kwargs": c.kwargs_json,
                    "b_code_version": c.code_version,
                }
                if not sql.succeed(conn, {**ids, "b_output": c.attempt if output else None}):
                    oks.append(False)
                    continue
                oks.append(True)
                sql.attempt_done(conn, ids)
                if c.work_ids:  # one row per work id; a chunk's ids are its own
                    sql.fresh.many(conn, [{**key, "b_work_id": w} for w in c.work_ids])
                else:  # a run without work ids: the job's one "latest success" row
                    sql.latest(conn, key)
                ready = sql.deps_done(conn, {"b_id": c.id})
                started |= any(r.state == "PENDING" and r.deps_left == 0 for r in ready)
                settled += sql.settle(conn, {"b_id": c.id, "b_failed": 0})
            claimed = self._send_claim(conn, *then_claim) if then_claim else None
        if started:
            self.db.notify(conn)
        self.transitions.settled(conn, settled)
        return oks, claimed

    def release(self, chunk_id: int, attempt: int) -> None:
        """A worker stopping on purpose gives a running chunk back: PENDING again, and
        the attempt does not count against the retry limit."""
        with self.db.write() as conn:
            now = self._now(conn)
            done = conn.execute(
                update(chunks)
                .where(
                    chunks.c.id == chunk_id,
                    chunks.c.attempt == attempt,
                    chunks.c.state == "RUNNING",
                )
                .values(
                    state="PENDING",
                    worker=None,
                    not_before=now,
                    max_attempts=chunks.c.max_attempts + 1,
                )
            ).rowcount
            if not done:
                raise FencedError(f"chunk {chunk_id} attempt {attempt} is not ours to release")
            self.transitions.end_attempt(conn, chunk_id, attempt, "RELEASED", "worker stopped", now)
            self.db.notify(conn)

    def fail(self, chunk_id: int, attempt: int, error: str, *, cancelled: bool = False) -> str:
        """Record a failed (or cancelled) attempt; returns the chunk's new state:
        PENDING (retry after backoff), SPLIT (bisected), FAILED or CANCELED."""
        with self.db.write() as conn:
            return self.transitions.fail(conn, chunk_id, attempt, error, cancelled, self._now(conn))

    def mark_materialized(self, chunk_id: int) -> None:
        with self.db.write() as conn:
            conn.execute(update(chunks).where(chunks.c.id == chunk_id).values(materialized=True))
