"""The jobs queue: submissions, claims, results — every transition one transaction.

States::

    MASTER ─────────────────────────────────────────────► DONE | FAILED | CANCELED
    QUEUED ──(last dependency DONE)──► PENDING ──claim──► RUNNING ──► DONE
       │                                  ▲                  ├──► PENDING (retry, backoff)
       └──► UPSTREAM_FAILED | CANCELED    └──────────────────┤──► SPLIT (bisected in two)
                                                             └──► FAILED | CANCELED

Rules every method keeps:

1. **Fencing by attempt.** A claim increments ``attempt``; a heartbeat, result or
   failure is applied only ``WHERE id = ? AND attempt = ? AND state = 'RUNNING'`` and
   the row count is checked — a stale attempt gets :class:`FencedError` and changes
   nothing.
2. **Fencing by term.** What the orchestrator does (reaping, timeouts, cron) runs
   inside a transaction that first reads the term row and refuses a stale term;
   :meth:`JobQueue.fence` raises the term when a new leader takes over.
3. **Readiness in the completing transaction.** A chunk's success decrements its
   dependents' ``deps_left`` and turns those at zero PENDING in the same transaction,
   so no orchestrator round trip sits between dependency levels. Only a *success*
   counts.
4. **One transaction per submission**: the master row, every chunk, edge and
   membership, or nothing.
"""

from __future__ import annotations

import json
import logging
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, tuple_, update

from riverbed.jobs.errors import FencedError, NotFoundError
from riverbed.jobs.graph import ActiveChunk, Freshness, Plan
from riverbed.jobs.hot import Pending, pipeline, upsert
from riverbed.jobs.moves import Moves
from riverbed.jobs.reads import QueueReader
from riverbed.jobs.schema import (
    Database,
    chunks,
    edges,
    fires,
    freshness,
    latest,
    members,
    meta,
    schedules,
)

log = logging.getLogger(__name__)

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


class JobQueue(QueueReader):
    """Operations on one jobs database (see the module doc for the rules)."""

    def __init__(self, db: Database | str, create: bool = True) -> None:
        super().__init__(db)
        self.moves = Moves(self.db)
        if create:
            self.db.create()

    # -- helpers ------------------------------------------------------------------------

    def _upsert(self, table: Any, keys: list[str], col: str) -> Any:
        return upsert(self.db.dialect, table, keys, col)

    def _check_term(self, conn: Connection, term: int) -> None:
        q = select(meta.c.term, meta.c.leader).where(meta.c.id == 1)
        if self.db.dialect == "postgresql":
            q = q.with_for_update(read=True)
        current, leader = conn.execute(q).one()
        if current != term:
            raise FencedError(
                f"orchestrator term {term} is stale: term {current} ({leader}) acts now"
            )

    # -- submission -----------------------------------------------------------------------

    def inputs(
        self, conn: Connection, nodes: Iterable[tuple[str, str]], lock: bool = True
    ) -> tuple[Freshness, list[ActiveChunk]]:
        """Freshness and active chunks of the given (job, kwargs) nodes, read in ``conn``
        (locked on PostgreSQL so a concurrent completion waits for this submission)."""
        fresh = Freshness()
        active: list[ActiveChunk] = []
        for job, kw in set(nodes):
            rows = conn.execute(
                select(freshness.c.work_id, freshness.c.succeeded_at).where(
                    freshness.c.job == job, freshness.c.kwargs == kw
                )
            ).all()
            last = conn.execute(
                select(latest.c.succeeded_at).where(latest.c.job == job, latest.c.kwargs == kw)
            ).scalar()
            if rows:
                fresh.by_id[(job, kw)] = by_id = {int(w): float(t) for w, t in rows}
                last = max(max(by_id.values()), float(last or 0.0))
            if last is not None:
                fresh.latest[(job, kw)] = float(last)
            q = select(chunks.c.id, chunks.c.work_ids).where(
                chunks.c.job == job,
                chunks.c.kwargs == kw,
                chunks.c.state.in_(ACTIVE),
                chunks.c.kind != "master",
            )
            if lock and self.db.dialect == "postgresql":
                q = q.with_for_update()
            for cid, ids in conn.execute(q).all():
                active.append(ActiveChunk(int(cid), job, kw, tuple(json.loads(ids))))
        return fresh, active

    def submit(
        self,
        nodes: Iterable[tuple[str, str]],
        plan_for: Callable[[Freshness, Sequence[ActiveChunk], float], Plan],
        policies: Mapping[str, Policy],
        *,
        conn: Connection | None = None,
        schedule: str | None = None,
        fire_time: float | None = None,
        parent: int | None = None,
    ) -> tuple[int, Plan]:
        """Resolve (``plan_for`` with what the database says now) and write the whole
        graph in one transaction; returns the master id and the plan written."""
        if conn is None:
            with self.db.write() as own:
                written = self.submit(
                    nodes,
                    plan_for,
                    policies,
                    conn=own,
                    schedule=schedule,
                    fire_time=fire_time,
                    parent=parent,
                )
            if self.db.dialect == "postgresql" and len(written[1].new_chunks) >= ANALYZE_AFTER:
                # A big submission changes the queue's shape at once; until autovacuum
                # notices (a minute or more), plans assume the old row counts — the
                # claim would sort every pending chunk instead of reading the index.
                with self.db.write() as own:
                    own.exec_driver_sql("ANALYZE rb_jobs_chunks, rb_jobs_edges, rb_jobs_members")
            return written
        if self.db.dialect == "postgresql":
            # Submissions resolve against each other's chunks: one at a time.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7201)")
        now = self._now(conn)
        fresh, active = self.inputs(conn, nodes)
        plan = plan_for(fresh, active, now)
        root_policy = policies[plan.job]
        master_id = int(
            conn.execute(
                insert(chunks)
                .values(
                    master=None,
                    job=plan.job,
                    kind="master",
                    state="MASTER",
                    kwargs=json.dumps(plan.kwargs, sort_keys=True, separators=(",", ":")),
                    work_ids=json.dumps(list(plan.work_ids)),
                    n_ids=len(plan.work_ids),
                    deps_left=len(plan.roots),
                    active_left=len(plan.chunks),
                    failed=0,
                    created_at=now,
                    code_version=root_policy.code_version,
                    schedule=schedule,
                    fire_time=fire_time,
                    parent=parent,
                )
                .returning(chunks.c.id)
            ).scalar_one()
        )
        new = plan.new_chunks
        ids: dict[int, int] = {c.index: int(c.reuse) for c in plan.chunks if c.reuse is not None}
        if new:
            rows = []
            for c in new:
                pol = policies[c.job]
                rows.append(
                    {
                        "master": master_id,
                        "job": c.job,
                        "kind": pol.kind,
                        "state": "PENDING" if not c.upstream else "QUEUED",
                        "kwargs": c.kwargs_text,
                        "work_ids": json.dumps(list(c.work_ids)),
                        "n_ids": len(c.work_ids),
                        "deps_left": len(c.upstream),
                        "active_left": 0,
                        "failed": 0,
                        "max_attempts": pol.max_attempts,
                        "backoff": pol.backoff,
                        "timeout": pol.timeout,
                        "bisect": pol.bisect,
                        "not_before": now,
                        "created_at": now,
                        "code_version": pol.code_version,
                    }
                )
            got = conn.execute(
                insert(chunks).returning(chunks.c.id, sort_by_parameter_order=True), rows
            ).all()
            for c, (cid,) in zip(new, got, strict=True):
                ids[c.index] = int(cid)
        links = [{"upstream": ids[u], "downstream": ids[c.index]} for c in new for u in c.upstream]
        links += [{"upstream": ids[r], "downstream": master_id} for r in plan.roots]
        if links:
            conn.execute(insert(edges), links)
        if plan.chunks:
            conn.execute(
                insert(members),
                [{"master": master_id, "chunk": ids[c.index]} for c in plan.chunks],
            )
        reused = [c for c in plan.chunks if c.reuse is not None]
        if reused:
            # A reused chunk that already succeeded is no dependency and no member to wait
            # for (read under the lock taken in inputs()).
            done = {
                int(i)
                for (i,) in conn.execute(
                    select(chunks.c.id).where(
                        chunks.c.id.in_([c.reuse for c in reused]), chunks.c.state == "DONE"
                    )
                ).all()
            }
            if done:
                self._recount(conn, master_id, [ids[c.index] for c in new], done, now)
        if not plan.chunks:
            self.moves.settle_master(conn, master_id, now)
        self.db.notify(conn)
        return master_id, plan

    def _recount(
        self, conn: Connection, master_id: int, new_ids: list[int], done: set[int], now: float
    ) -> None:
        for cid in done:
            downs = [
                d
                for (d,) in conn.execute(
                    select(edges.c.downstream).where(
                        edges.c.upstream == cid, edges.c.downstream.in_([*new_ids, master_id])
                    )
                ).all()
            ]
            if downs:
                conn.execute(
                    update(chunks)
                    .where(chunks.c.id.in_(downs))
                    .values(deps_left=chunks.c.deps_left - 1)
                )
        conn.execute(
            update(chunks)
            .where(chunks.c.id == master_id)
            .values(active_left=chunks.c.active_left - len(done))
        )
        if new_ids:
            conn.execute(
                update(chunks)
                .where(
                    chunks.c.id.in_(new_ids), chunks.c.deps_left == 0, chunks.c.state == "QUEUED"
                )
                .values(state="PENDING", not_before=now)
            )
        self.moves.settle_master(conn, master_id, now)

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
        return self.hot.claim(tuple(kinds), master is not None).send(conn, params), worker, host

    def _claimed(self, conn: Connection, sent: tuple[Pending, str, str]) -> list[Claim]:
        """The claim's rows, their attempts recorded."""
        pending, worker, host = sent
        rows = pending.rows()
        if not rows:
            return []
        if not self.hot.claim_starts_attempts:
            self.hot.start_attempts.many(
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
            rows = conn.execute(
                update(chunks)
                .where(
                    tuple_(chunks.c.id, chunks.c.attempt).in_(list(held)),
                    chunks.c.state == "RUNNING",
                    chunks.c.worker == worker,
                )
                .values(heartbeat_at=now)
                .returning(chunks.c.id, chunks.c.cancel_requested)
            ).all()
        status = {int(i): ("cancel" if c else "ok") for i, c in rows}
        return {cid: status.get(cid, "lost") for cid, _ in held}

    def succeed(self, chunk_id: int, attempt: int, output: bool = False) -> None:
        """Record DONE (and, with ``output``, that this attempt's staged output is the
        published one) — only for the current attempt."""
        with self.db.write() as conn:
            row = conn.execute(
                select(chunks.c.job, chunks.c.kwargs, chunks.c.work_ids).where(
                    chunks.c.id == chunk_id
                )
            ).first()
            if row is None:
                raise NotFoundError(f"no chunk {chunk_id}")
            self._succeed(
                conn, chunk_id, attempt, output, row.job, row.kwargs, json.loads(row.work_ids)
            )

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
                conn,
                claim.id,
                claim.attempt,
                output,
                claim.job,
                claim.kwargs_json,
                claim.work_ids,
                (worker, host, limit, kinds) if limit > 0 else None,
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
        chunk_id: int,
        attempt: int,
        output: bool,
        job: str,
        kwargs_json: str,
        work_ids: Sequence[int],
        then_claim: tuple[str, str, int, Sequence[str]] | None = None,
    ) -> list[Claim]:
        claim = Claim(chunk_id, None, job, "", {}, list(work_ids), attempt, None, "", kwargs_json)
        (ok,), claimed = self._record_successes(conn, [(claim, output)], then_claim)
        if not ok:  # nothing was changed; the transaction is rolled back all the same
            raise FencedError(
                f"chunk {chunk_id} attempt {attempt} is no longer running under this "
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
        sql = self.hot
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
                key = {"b_job": c.job, "b_kwargs": c.kwargs_json}
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
        self.moves.settled(conn, settled)
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
            self.moves.end_attempt(conn, chunk_id, attempt, "RELEASED", "worker stopped", now)
            self.db.notify(conn)

    def fail(self, chunk_id: int, attempt: int, error: str, *, cancelled: bool = False) -> str:
        """Record a failed (or cancelled) attempt; returns the chunk's new state:
        PENDING (retry after backoff), SPLIT (bisected), FAILED or CANCELED."""
        with self.db.write() as conn:
            return self.moves.fail(conn, chunk_id, attempt, error, cancelled, self._now(conn))

    def mark_materialized(self, chunk_id: int) -> None:
        with self.db.write() as conn:
            conn.execute(update(chunks).where(chunks.c.id == chunk_id).values(materialized=True))

    # -- the orchestrator's duties (term-fenced) ------------------------------------------

    def fence(self, term: int, leader: str) -> None:
        """Make ``term`` the acting orchestrator's term; a newer one refuses it."""
        with self.db.write() as conn:
            now = self._now(conn)
            done = conn.execute(
                update(meta)
                .where(meta.c.id == 1, meta.c.term <= term)
                .values(term=term, leader=leader, since=now)
            ).rowcount
            if not done:
                self._check_term(conn, term)  # raises with the newer term named

    def reap(
        self, term: int, live_workers: Callable[[], set[str]], stale_after: float
    ) -> list[int]:
        """Chunks RUNNING on a worker that is gone (its lease expired) or silent for
        ``stale_after`` seconds go back to retry (or fail at the retry limit)."""
        with self.db.write() as conn:
            self._check_term(conn, term)
            now = self._now(conn)
            running = conn.execute(
                select(chunks.c.id, chunks.c.attempt, chunks.c.worker, chunks.c.heartbeat_at).where(
                    chunks.c.state == "RUNNING"
                )
            ).all()
            if not running:
                return []
            # Read membership only after the RUNNING rows: a worker registers before it
            # claims, so a claim seen above belongs to a worker that is listed below
            # unless that worker is gone.
            live = live_workers()
            reaped = []
            for cid, attempt, worker, beat in running:
                silent = now - float(beat or 0.0)
                if worker in live and silent <= stale_after:
                    continue
                why = (
                    f"worker {worker} lost (its lease expired)"
                    if worker not in live
                    else f"worker {worker} sent no heartbeat for {silent:.0f}s"
                )
                self.moves.fail(conn, int(cid), int(attempt), why, False, now)
                reaped.append(int(cid))
            return reaped

    def overdue(self, term: int, grace: float = 10.0) -> list[int]:
        """Ask workers to stop chunks past their timeout (+ ``grace``)."""
        with self.db.write() as conn:
            self._check_term(conn, term)
            now = self._now(conn)
            rows = conn.execute(
                update(chunks)
                .where(
                    chunks.c.state == "RUNNING",
                    chunks.c.timeout.is_not(None),
                    chunks.c.cancel_requested.is_(False),
                    chunks.c.started_at + chunks.c.timeout + grace < now,
                )
                .values(cancel_requested=True, error="timed out")
                .returning(chunks.c.id)
            ).all()
            return [int(r[0]) for r in rows]

    def sync_schedules(self, term: int, wanted: Sequence[dict[str, Any]]) -> None:
        """Store the schedules found in the job specs (the specs are the truth)."""
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
            running = self._active_run(conn, job)
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

    # -- user actions ---------------------------------------------------------------------

    def cancel(self, chunk_id: int) -> dict[str, int]:
        """Cancel a run (its own chunks) or one chunk: waiting chunks end CANCELED now,
        running ones are stopped by their worker, which records CANCELED."""
        with self.db.write() as conn:
            now = self._now(conn)
            row = conn.execute(select(chunks).where(chunks.c.id == chunk_id)).first()
            if row is None:
                raise NotFoundError(f"no run or chunk {chunk_id}; see `riverbed jobs list`")
            if row.kind == "master":
                if row.state != "MASTER":
                    return {"waiting": 0, "running": 0}
                conn.execute(
                    update(chunks).where(chunks.c.id == chunk_id).values(cancel_requested=True)
                )
                targets: list[tuple[Any, Any]] = [
                    (i, s)
                    for i, s in conn.execute(
                        select(chunks.c.id, chunks.c.state).where(
                            chunks.c.master == chunk_id, chunks.c.state.in_(ACTIVE)
                        )
                    )
                ]
            else:
                targets = [(row.id, row.state)] if row.state in ACTIVE else []
            waiting = [int(i) for i, s in targets if s in ("QUEUED", "PENDING")]
            running = [int(i) for i, s in targets if s == "RUNNING"]
            for cid in waiting:
                ended = conn.execute(
                    update(chunks)
                    .where(chunks.c.id == cid, chunks.c.state.in_(("QUEUED", "PENDING")))
                    .values(state="CANCELED", finished_at=now, error="cancelled by request")
                ).rowcount
                if ended:
                    self.moves.settle(conn, cid, failed=False, now=now)
                    self.moves.cascade(conn, cid, "CANCELED", now)
            if running:
                conn.execute(
                    update(chunks)
                    .where(chunks.c.id.in_(running))
                    .values(cancel_requested=True, error="cancelled by request")
                )
            return {"waiting": len(waiting), "running": len(running)}

    # -- reads ----------------------------------------------------------------------------


__all__ = ["ACTIVE", "ENDED", "Claim", "JobQueue", "Policy"]
