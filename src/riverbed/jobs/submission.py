"""Submitting runs (one transaction each: the master row, every chunk, edge and
membership, or nothing) and cancelling them — what users do to the queue."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, update

from riverbed.jobs.errors import NotFoundError
from riverbed.jobs.graph import ActiveChunk, Freshness, Plan
from riverbed.jobs.queuebase import ACTIVE, ANALYZE_AFTER, Policy, QueueBase
from riverbed.jobs.schema import (
    ROW_LOCKS,
    chunks,
    edges,
    freshness,
    latest,
    members,
)


class Submission(QueueBase):
    """Submissions and cancellations."""

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
                select(
                    freshness.c.work_id, freshness.c.succeeded_at, freshness.c.code_version
                ).where(freshness.c.job == job, freshness.c.kwargs == kw)
            ).all()
            last = conn.execute(
                select(latest.c.succeeded_at, latest.c.code_version).where(
                    latest.c.job == job, latest.c.kwargs == kw
                )
            ).first()
            # one row per work id (its newest success); the job's newest of all of them
            # and its run without work ids (100k work ids: dicts, not a call per row)
            key = (job, kw)
            if rows:
                fresh.by_id[key] = {int(w): float(at) for w, at, _ in rows}
                fresh.code_by_id[key] = {int(w): code for w, _, code in rows}
                _, at, code = max(rows, key=lambda r: float(r[1]))
                fresh.latest[key], fresh.latest_code[key] = float(at), code
            if last is not None and (key not in fresh.latest or last[0] >= fresh.latest[key]):
                fresh.latest[key], fresh.latest_code[key] = float(last[0]), last[1]
            q = select(chunks.c.id, chunks.c.work_ids).where(
                chunks.c.job == job,
                chunks.c.kwargs == kw,
                chunks.c.state.in_(ACTIVE),
                chunks.c.kind != "master",
            )
            if lock and self.db.dialect in ROW_LOCKS:
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
        nodes = list(nodes)
        self.db.keys_fit(nodes)
        self.db.one_submission(conn)
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
            self.transitions.settle_master(conn, master_id, now)
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
        self.transitions.settle_master(conn, master_id, now)

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
                    self.transitions.settle(conn, cid, failed=False, now=now)
                    self.transitions.cascade(conn, cid, "CANCELED", now)
            if running:
                conn.execute(
                    update(chunks)
                    .where(chunks.c.id.in_(running))
                    .values(cancel_requested=True, error="cancelled by request")
                )
            return {"waiting": len(waiting), "running": len(running)}
