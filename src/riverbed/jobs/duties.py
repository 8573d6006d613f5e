"""The orchestrator's duties, each fenced by its term: take the lead, reap the chunks of
lost workers, stop overdue ones, keep the schedules and fire them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, insert, select, update

from riverbed.jobs.queuebase import QueueBase
from riverbed.jobs.schema import (
    chunks,
    fires,
    schedules,
)
from riverbed.jobs.spec import schedule_job
from riverbed.jobs.statements import update_returning


class Reaped(NamedTuple):
    """A chunk the orchestrator took back from a lost worker, and the lost attempt."""

    id: int
    job: str
    attempt: int


class Duties(QueueBase):
    """The elected orchestrator's transactions."""

    # -- the orchestrator's duties (term-fenced) ------------------------------------------

    def fence(self, term: int, leader: str) -> None:
        """Make ``term`` the acting orchestrator's term; a newer one refuses it
        (:class:`~riverbed.jobs.termfence.SqlFence`)."""
        self.term_fence.claim(term, leader)

    def reap(
        self, term: int, live_workers: Callable[[], set[str]], stale_after: float
    ) -> list[Reaped]:
        """Chunks RUNNING on a worker that is gone (its lease expired) or silent for
        ``stale_after`` seconds go back to retry (or fail at the retry limit). Returns
        each reaped chunk with its job and the attempt that was lost.

        Membership (the control plane, which may take seconds to answer or fail) is read
        outside any transaction: a write transaction holds the meta row's share lock,
        which a newer term's claim waits for."""
        with self.db.read() as conn:
            seen = {
                (int(cid), int(attempt), str(worker))
                for cid, attempt, worker in conn.execute(
                    select(chunks.c.id, chunks.c.attempt, chunks.c.worker).where(
                        chunks.c.state == "RUNNING"
                    )
                )
            }
        # Read membership only after the RUNNING rows: a worker registers before it
        # claims, so a claim seen above belongs to a worker that is listed below
        # unless that worker is gone.
        live = live_workers() if seen else set()
        with self.db.write() as conn:
            self._check_term(conn, term)
            if not seen:
                return []
            now = self._now(conn)
            running = conn.execute(
                select(
                    chunks.c.id,
                    chunks.c.job,
                    chunks.c.attempt,
                    chunks.c.worker,
                    chunks.c.heartbeat_at,
                ).where(chunks.c.state == "RUNNING", chunks.c.id.in_([c for c, _, _ in seen]))
            ).all()
            reaped = []
            for cid, job, attempt, worker, beat in running:
                if (int(cid), int(attempt), str(worker)) not in seen:
                    continue  # claimed again since the read: membership says nothing of it
                silent = now - float(beat or 0.0)
                if worker in live and silent <= stale_after:
                    continue
                why = (
                    f"worker {worker} lost (its lease expired)"
                    if worker not in live
                    else f"worker {worker} sent no heartbeat for {silent:.0f}s"
                )
                self.transitions.fail(conn, int(cid), int(attempt), why, False, now)
                reaped.append(Reaped(int(cid), str(job), int(attempt)))
            return reaped

    def overdue(self, term: int, grace: float = 10.0) -> list[int]:
        """Ask workers to stop chunks past their timeout (+ ``grace``)."""
        with self.db.write() as conn:
            self._check_term(conn, term)
            now = self._now(conn)
            rows = update_returning(
                conn,
                chunks,
                [
                    chunks.c.state == "RUNNING",
                    chunks.c.timeout.is_not(None),
                    chunks.c.cancel_requested.is_(False),
                    chunks.c.started_at + chunks.c.timeout + grace < now,
                ],
                {"cancel_requested": True, "error": "timed out"},
                [chunks.c.id],
            )
            return [int(r[0]) for r in rows]

    def sync_schedules(self, term: int, wanted: Sequence[dict[str, Any]]) -> None:
        """Store the schedules found in the job specs (the specs are the truth)."""
        self.db.keys_fit((w["job"], w["kwargs"]) for w in wanted)
        with self.db.write() as conn:
            self._check_term(conn, term)
            now = self._now(conn)
            have = {r.job: r for r in conn.execute(select(schedules)).all()}
            names = {w["job"] for w in wanted}
            for gone in set(have) - names:
                conn.execute(schedules.delete().where(schedules.c.job == gone))
            for w in wanted:
                values = {k: w[k] for k in ("cron", "kwargs", "work_ids", "grace", "catchup")}
                if w["job"] in have:
                    old = have[w["job"]]
                    if any(getattr(old, k) != v for k, v in values.items()):
                        conn.execute(
                            update(schedules)
                            .where(schedules.c.job == w["job"])
                            .values(**values, updated_at=now)
                        )
                else:
                    conn.execute(
                        insert(schedules).values(
                            job=w["job"], **values, last_fire=None, updated_at=now
                        )
                    )

    def fire(
        self,
        term: int,
        job: str,
        fire_time: float,
        allow_multiple: bool,
        submit: Callable[[Connection], int],
    ) -> int | None:
        """Record the fire (once per (job, fire time), in the same transaction as its
        submission); skip it while a previous run is active unless ``allow_multiple``.
        Returns the new master id, or None when skipped or already fired."""
        with self.db.write() as conn:
            self._check_term(conn, term)
            if conn.execute(
                select(fires.c.job).where(fires.c.job == job, fires.c.fire_time == fire_time)
            ).first():
                return None
            master: int | None = None
            note = None
            running = self._active_run(conn, schedule_job(job))  # a run of the job, any schedule's
            if running is not None and not allow_multiple:
                note = f"skipped: run {running[0]} still active (allow_multiple_jobs=False)"
            else:
                master = submit(conn)
            conn.execute(
                insert(fires).values(job=job, fire_time=fire_time, master=master, note=note)
            )
            conn.execute(
                update(schedules).where(schedules.c.job == job).values(last_fire=fire_time)
            )
            return master

    def active_run(self, job: str) -> int | None:
        """A run of ``job`` that has not ended, if any."""
        with self.db.read() as conn:
            row = self._active_run(conn, job)
            return None if row is None else int(row[0])

    @staticmethod
    def _active_run(conn: Connection, job: str) -> Any:
        return conn.execute(
            select(chunks.c.id).where(
                chunks.c.job == job, chunks.c.kind == "master", chunks.c.state == "MASTER"
            )
        ).first()

    def missed(self, term: int, job: str, fire_time: float, note: str) -> bool:
        """Record that fires up to ``fire_time`` can no longer run (older than the
        schedule's grace): one row under the newest of them, and ``last_fire`` moves
        past them. False if another leader recorded it first."""
        with self.db.write() as conn:
            self._check_term(conn, term)
            if conn.execute(
                select(fires.c.job).where(fires.c.job == job, fires.c.fire_time == fire_time)
            ).first():
                return False
            conn.execute(insert(fires).values(job=job, fire_time=fire_time, master=None, note=note))
            conn.execute(
                update(schedules)
                .where(schedules.c.job == job, schedules.c.last_fire < fire_time)
                .values(last_fire=fire_time)
            )
            return True
