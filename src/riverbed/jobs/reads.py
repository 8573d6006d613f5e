"""Reading the jobs database: what the CLI (and the console) show.

Reads never take the write lock and never block a worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from riverbed.jobs.errors import NotFoundError
from riverbed.jobs.schema import (
    Database,
    attempts,
    chunks,
    edges,
    freshness,
    latest,
    members,
    schedules,
)
from riverbed.jobs.statements import compiled
from riverbed.jobs.termfence import SqlFence


def _row(r: Any) -> dict[str, Any]:
    return dict(r._mapping)


class QueueReader:
    """Read-only queries over one jobs database."""

    def __init__(self, db: Database | str) -> None:
        self.db = db if isinstance(db, Database) else Database(db)
        self.statements = compiled(self.db.dialect)
        self.term_fence = SqlFence(self.db, self._now)  # the acting orchestrator's term

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.db.url!r})"

    def close(self) -> None:
        self.db.dispose()

    def _now(self, conn: Connection) -> float:
        return float(self.statements.now(conn)[0].now)

    def now(self) -> float:
        """The database's clock (epoch seconds)."""
        with self.db.read() as conn:
            return self._now(conn)

    def has_work(self, kinds: Sequence[str] = ("python", "spark")) -> bool:
        """Whether a chunk is claimable now (a cheap read before taking the write lock)."""
        with self.db.read() as conn:
            return bool(self.statements.has_work(tuple(kinds))(conn))

    def next_retry(self) -> float | None:
        """Seconds until the earliest backed-off chunk becomes claimable, if any."""
        with self.db.read() as conn:
            at, now = self.statements.next_retry(conn)[0]
            return None if at is None else max(0.0, float(at) - float(now))

    def leader(self) -> tuple[int, str]:
        """The acting orchestrator's (term, name); (0, "") before the first one."""
        current = self.term_fence.current()
        return (0, "") if current is None else (current.term, current.holder)

    def state(self, chunk_id: int) -> str:
        """One run's or chunk's state (the cheap poll; :meth:`get` reads everything)."""
        with self.db.read() as conn:
            rows = self.statements.state(conn, {"b_id": chunk_id})
        if not rows:
            raise NotFoundError(f"no run or chunk {chunk_id}; see `riverbed jobs list`")
        return str(rows[0].state)

    def unmaterialized(self, limit: int = 100) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            return [
                _row(r)
                for r in conn.execute(
                    select(chunks.c.id, chunks.c.job, chunks.c.output_attempt)
                    .where(
                        chunks.c.state == "DONE",
                        chunks.c.output_attempt.is_not(None),
                        chunks.c.materialized.is_(False),
                    )
                    .limit(limit)
                ).all()
            ]

    def schedules(self) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            return [_row(r) for r in conn.execute(select(schedules).order_by(schedules.c.job))]

    def get(self, chunk_id: int) -> dict[str, Any]:
        with self.db.read() as conn:
            row = conn.execute(select(chunks).where(chunks.c.id == chunk_id)).first()
            if row is None:
                raise NotFoundError(f"no run or chunk {chunk_id}; see `riverbed jobs list`")
            out = _row(row)
            out["upstream"] = sorted(
                int(u)
                for (u,) in conn.execute(
                    select(edges.c.upstream).where(edges.c.downstream == chunk_id)
                )
            )
            out["attempts"] = [
                _row(a)
                for a in conn.execute(
                    select(attempts)
                    .where(attempts.c.chunk == chunk_id)
                    .order_by(attempts.c.attempt)
                )
            ]
            return out

    def graph(
        self, master_id: int, offset: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The chunks of a run with their upstream ids, in id order (``offset`` and
        ``limit`` page through a big run)."""
        with self.db.read() as conn:
            query = (
                select(chunks)
                .join(members, members.c.chunk == chunks.c.id)
                .where(members.c.master == master_id)
                .order_by(chunks.c.id)
            )
            if offset:
                query = query.offset(offset)
            if limit is not None:
                query = query.limit(limit)
            rows = conn.execute(query).all()
            ids = [r.id for r in rows]
            ups: dict[int, list[int]] = {int(i): [] for i in ids}
            if ids:
                for u, d in conn.execute(
                    select(edges.c.upstream, edges.c.downstream).where(edges.c.downstream.in_(ids))
                ):
                    ups[int(d)].append(int(u))
            out = []
            for r in rows:
                item = _row(r)
                item["upstream"] = sorted(ups[int(r.id)])
                out.append(item)
            return out

    def runs(self, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Master rows (runs), newest first; ``state`` filters."""
        with self.db.read() as conn:
            q = select(chunks).where(chunks.c.kind == "master")
            if state:
                q = q.where(chunks.c.state == state.upper())
            return [_row(r) for r in conn.execute(q.order_by(chunks.c.id.desc()).limit(limit))]

    def chunks_in(self, state: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            q = select(chunks).where(chunks.c.kind != "master")
            if state:
                q = q.where(chunks.c.state == state.upper())
            return [_row(r) for r in conn.execute(q.order_by(chunks.c.id.desc()).limit(limit))]

    def freshness(self, job: str) -> list[dict[str, Any]]:
        """Per kwargs: work ids known, oldest and newest success (database clock), and
        how many work ids' newest success ran each code version (``""``: not recorded)."""
        with self.db.read() as conn:
            now = self._now(conn)
            rows = conn.execute(
                select(
                    freshness.c.kwargs,
                    func.count(),
                    func.min(freshness.c.succeeded_at),
                    func.max(freshness.c.succeeded_at),
                )
                .where(freshness.c.job == job)
                .group_by(freshness.c.kwargs)
            ).all()
            out = [
                {
                    "kwargs": kw,
                    "work_ids": int(n),
                    "oldest": float(lo),
                    "newest": float(hi),
                    "now": now,
                }
                for kw, n, lo, hi in rows
            ]
            codes: dict[str, dict[str, int]] = {}
            for kw, code, n in conn.execute(
                select(freshness.c.kwargs, freshness.c.code_version, func.count())
                .where(freshness.c.job == job)
                .group_by(freshness.c.kwargs, freshness.c.code_version)
            ):
                codes.setdefault(kw, {})[code] = int(n)
            for o in out:
                o["code_versions"] = codes.get(o["kwargs"], {})
            seen = {o["kwargs"] for o in out}
            for kw, at, code in conn.execute(
                select(latest.c.kwargs, latest.c.succeeded_at, latest.c.code_version).where(
                    latest.c.job == job
                )
            ):
                if kw not in seen:
                    out.append(
                        {
                            "kwargs": kw,
                            "work_ids": 0,
                            "oldest": float(at),
                            "newest": float(at),
                            "now": now,
                            "code_versions": {code: 1},
                        }
                    )
            return out

    def fresh_ids(self, job: str, kwargs: str) -> dict[int, float]:
        with self.db.read() as conn:
            return {
                int(w): float(t)
                for w, t in conn.execute(
                    select(freshness.c.work_id, freshness.c.succeeded_at).where(
                        freshness.c.job == job, freshness.c.kwargs == kwargs
                    )
                )
            }

    def run_counts(self, master_id: int) -> dict[str, int]:
        """A run's chunks by state."""
        with self.db.read() as conn:
            return {
                s: int(n)
                for s, n in conn.execute(
                    select(chunks.c.state, func.count())
                    .join(members, members.c.chunk == chunks.c.id)
                    .where(members.c.master == master_id)
                    .group_by(chunks.c.state)
                )
            }

    def counts(self) -> dict[str, int]:
        with self.db.read() as conn:
            return {
                s: int(n)
                for s, n in conn.execute(
                    select(chunks.c.state, func.count())
                    .where(chunks.c.kind != "master")
                    .group_by(chunks.c.state)
                )
            }

    def active_run(self, job: str) -> int | None:
        with self.db.read() as conn:
            row = conn.execute(
                select(chunks.c.id).where(
                    chunks.c.job == job, chunks.c.kind == "master", chunks.c.state == "MASTER"
                )
            ).first()
            return None if row is None else int(row[0])
