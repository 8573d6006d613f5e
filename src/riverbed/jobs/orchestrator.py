"""The orchestrator: one acts at a time, elected through the control plane.

1. Campaign in the election ``riverbed-jobs``; the term (the leader key's create
   revision) only grows across failovers.
2. :meth:`JobQueue.fence` writes the term into the database; every grooming
   transaction checks it first, so a demoted orchestrator (paused, partitioned, its
   lease gone) has every write refused with :class:`FencedError` — it steps down.
3. Duties, each tick and whenever the worker registry changes: reap the chunks of
   workers whose lease expired (retry with backoff, or FAILED at the limit), ask
   workers to stop chunks past their timeout, fire cron schedules (once per fire time,
   in the submitting transaction), and publish the outputs of chunks an older
   riverbed recorded DONE before moving them into place (workers now publish first,
   see :mod:`riverbed.jobs.publication`). Every ``sweep_every`` seconds, delete what
   attempts older than their chunk's published one left behind (a zombie's upload, a
   publisher killed between its steps).

Readiness of dependents is *not* a duty: the transaction that records a success
promotes them, so a dependency level costs one claim, not an orchestrator tick.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection

from riverbed.control import (
    ControlError,
    ControlPlane,
    Election,
    LockTimeoutError,
    Registry,
    Session,
)
from riverbed.control.processes import Presence, host_name
from riverbed.jobs import cron
from riverbed.jobs.errors import FencedError, JobsError, QueueError
from riverbed.jobs.graph import Plan
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import Publication
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.runs import prepare
from riverbed.jobs.spec import Catalog, canonical_kwargs, schedule_job
from riverbed.jobs.worker import WORKERS
from riverbed.storage import StorageError

log = logging.getLogger(__name__)

ELECTION = "riverbed-jobs"


@dataclass
class OrchestratorStats:
    terms: list[int]
    reaped: int = 0
    fired: int = 0
    published: int = 0
    swept: int = 0


class Orchestrator:
    """Campaigns, then performs the duties while it leads (see the module doc)."""

    def __init__(
        self,
        queue: JobQueue,
        cp: ControlPlane,
        catalog: Catalog,
        home: Path | str,
        *,
        name: str | None = None,
        ttl: int = 10,
        tick: float = 0.5,
        stale_after: float = 60.0,
        checkpoints: str | None = None,
        sweep_every: float = 300.0,
    ) -> None:
        self.queue = queue
        self.cp = cp
        self.catalog = catalog
        self.home = Path(home)
        self.name = name or f"{host_name()}-{os.getpid()}"
        self.ttl = ttl
        self.tick = tick
        self.stale_after = stale_after
        self.publication: Publication = open_publication(self.home, checkpoints)
        self.sweep_every = sweep_every
        self._swept_at: float | None = None
        self.registry = Registry(cp, WORKERS)
        self.stats = OrchestratorStats(terms=[])
        self._waiting_behind: str | None = None

    def __repr__(self) -> str:
        return f"Orchestrator({self.name})"

    def live_workers(self) -> set[str]:
        return {m.id for m in self.registry.members()}

    def run(self, stop: threading.Event | None = None) -> OrchestratorStats:
        """Lead when elected, until ``stop``; a lost term means campaigning again."""
        stop = stop or threading.Event()
        presence = Presence(self.cp, "orchestrator", {"name": self.name}, ttl=self.ttl)
        try:
            self._run(stop)
        finally:
            presence.close()
        return self.stats

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._term(stop)
            except ControlError as exc:
                # the control plane out of reach (a member cut off mid-request, all of
                # them down): a standby that gave up here would leave no one to lead
                log.warning("orchestrator %s: %s; campaigning again", self.name, exc)
                stop.wait(1.0)

    def _term(self, stop: threading.Event) -> None:
        """One session: campaign, and lead while elected."""
        with Session(self.cp, ttl=self.ttl) as session:
            election = Election(self.cp, ELECTION, session)
            try:
                term = election.campaign(self.name, timeout=0.5)
            except LockTimeoutError as exc:
                election.resign()
                # a standby says once whom it waits behind (not each half-second round):
                # what its log needs to tell a healthy standby from a stuck one
                ahead = str(exc).rsplit("first is ", 1)[-1]
                if ahead != self._waiting_behind:
                    self._waiting_behind = ahead
                    log.info("orchestrator %s stands by: %s", self.name, exc)
                return
            self._waiting_behind = None
            try:
                self._lead(term, session, stop)
            except FencedError as exc:
                log.warning("orchestrator %s stepped down: %s", self.name, exc)
            except QueueError as exc:  # the database is away: step down, campaign again
                log.warning("orchestrator %s stepped down: %s", self.name, exc)
                stop.wait(1.0)
            finally:
                election.resign()

    def _lead(self, term: int, session: Session, stop: threading.Event) -> None:
        self.queue.fence(term, self.name)
        self.stats.terms.append(term)
        log.info("orchestrator %s leads with term %s", self.name, term)
        self._sync_schedules(term)
        changed = threading.Event()
        watcher = threading.Thread(
            target=self._watch_workers, args=(changed, stop, session), daemon=True
        )
        watcher.start()
        while not stop.is_set() and session.alive:
            try:
                self.duties(term)
            except (QueueError, StorageError) as exc:  # away: the next tick tries again
                log.warning("orchestrator duties failed: %s", exc)
            changed.wait(self.tick)
            changed.clear()

    def _watch_workers(
        self, changed: threading.Event, stop: threading.Event, session: Session
    ) -> None:
        """Wake the duties as soon as a worker leaves (its lease expired)."""
        try:
            _, rev = self.registry.snapshot()
            for change in self.registry.changes(start_revision=rev + 1, timeout=1.0):
                if change.kind == "left":
                    changed.set()
                if stop.is_set() or not session.alive:
                    return
        except Exception:  # the tick still runs the duties
            log.debug("registry watch ended", exc_info=True)

    def duties(self, term: int) -> None:
        """One round of everything the orchestrator does (each fenced by ``term``)."""
        reaped = self.queue.reap(term, self.live_workers, self.stale_after)
        if reaped:
            log.warning("reaped chunks %s of lost workers", [r.id for r in reaped])
        for r in reaped:  # a lost attempt may have published before it died: unseen now
            self.publication.retract(r.job, r.id, r.attempt)
        self.stats.reaped += len(reaped)
        self.queue.overdue(term)
        self._fire(term)
        for row in self.queue.unmaterialized():
            if self.publication.publish(row["job"], row["id"], row["output_attempt"]):
                self.stats.published += 1
            self.queue.mark_materialized(row["id"])
        self._sweep()

    def _sweep(self) -> None:
        """Every ``sweep_every`` seconds, sweep every job of the catalog (see the module
        doc). Not fenced: it only deletes what no published output needs."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < self.sweep_every:
            return
        self._swept_at = now
        for job in self.catalog.names():
            gone = self.publication.sweep(job)
            if gone:
                log.info("swept %d leftovers of job %s", gone, job)
            self.stats.swept += gone

    def _sync_schedules(self, term: int) -> None:
        jobs, errors = self.catalog.load_all()
        for exc in errors:
            log.error("job module not loaded: %s", exc)
        wanted = []
        for loaded in jobs:
            for sched in loaded.spec.schedules:
                wanted.append(
                    {
                        "job": sched.key(loaded.name),  # the schedule's key (spec.Schedule.key)
                        "cron": sched.trigger,
                        "kwargs": canonical_kwargs(sched.kwargs),
                        "work_ids": None
                        if sched.work_ids is None
                        else json.dumps(list(sched.work_ids)),
                        "grace": sched.grace_seconds,
                        "catchup": sched.catchup,
                    }
                )
        self.queue.sync_schedules(term, wanted)

    def _fire(self, term: int) -> None:
        """Submit each schedule's due fires, oldest first, each once (its own
        transaction, keyed by fire time); record the ones too old to run."""
        rows = self.queue.schedules()
        if not rows:
            return
        now = self.queue.now()
        for row in rows:
            key, expr, last, grace = row["job"], row["cron"], row["last_fire"], row["grace"]
            job = schedule_job(key)
            missed, newest_missed = cron.missed_fires(expr, last, now, grace)
            if newest_missed is not None:
                note = (
                    f"missed: {missed} fire(s) from {_utc(cron.next_fire(expr, last))} to "
                    f"{_utc(newest_missed)} fell due while no orchestrator ran and are "
                    f"older than the grace ({grace:.0f}s)"
                )
                if self.queue.missed(term, key, newest_missed, note):
                    log.warning("schedule %s: %s", key, note)
            for fire_time in cron.due_fires(expr, last, now, grace, row["catchup"]):
                try:
                    spec = self.catalog.get(job).spec
                    if (
                        row["catchup"] == "all"
                        and not spec.allow_multiple_jobs
                        and self.queue.active_run(job) is not None
                    ):
                        break  # one run at a time: this fire waits (inside its grace)
                    # the job's code (its work ids) runs now, outside the fire's
                    # transaction: a slow select_work never holds the term's lock
                    write = prepare(
                        self.catalog,
                        self.queue,
                        job,
                        None if row["work_ids"] is None else json.loads(row["work_ids"]),
                        json.loads(row["kwargs"]),
                        schedule=key,  # which of the job's schedules fired
                        fire_time=fire_time,
                    )
                    master = self.queue.fire(
                        term,
                        key,
                        fire_time,
                        spec.allow_multiple_jobs,
                        functools.partial(_master_of, write),
                    )
                except FencedError:
                    raise
                except JobsError as exc:
                    log.error("schedule %s could not fire: %s", key, exc)
                    break
                if master is not None:
                    self.stats.fired += 1
                    log.info("schedule %s fired at %s → run %s", key, _utc(fire_time), master)


def _master_of(write: Callable[[Connection | None], tuple[int, Plan]], conn: Connection) -> int:
    return write(conn)[0]


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
