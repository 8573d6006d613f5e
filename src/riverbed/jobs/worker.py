"""Workers: claim chunks, run them in warm executor processes, record what happened.

(Over 600 lines: the I/O shell of one worker — its executors, its pipes, its session
and its database calls share the slots, so they stay in one class; every decision it
takes is a pure function of :mod:`riverbed.jobs.decisions`, tested there.)

A worker's life:

1. Open a control-plane :class:`Session` and register ``<host>-<pid>-<random>`` in the
   ``riverbed-jobs-workers`` registry. The orchestrator reaps the chunks of a worker
   whose entry vanished (its lease expired).
2. Loop: claim up to its free slots (the claim's attempt is the fencing token), hand
   each chunk to an idle executor, wait for an answer, a wake-up from the database
   (PostgreSQL ``LISTEN``; SQLite ``PRAGMA data_version``) or the next heartbeat.
   A success is recorded in the same transaction that claims the next chunk.
   Opt-in (``prefetch``, for floods of tiny chunks): while chunks are short (the last
   one ran under ``prefetch_below`` seconds) the worker also holds up to ``prefetch``
   claimed chunks; when an executor answers, a held chunk starts at once and the
   answer is recorded while it runs. A held chunk is RUNNING in the database,
   heartbeated, cancellable, and released when the worker stops. With ``prefetch`` ≥ 2
   the successes of short chunks are also recorded in batches: one transaction records
   every short chunk that ended since the last one and claims the next ``prefetch`` —
   while chunks still run, so the executor never waits for the database. Until then
   an ended chunk is heartbeated like a running one; if the worker dies first, its
   chunks are reaped and rerun (their staged output was never published). Off by
   default: a held chunk waits even when another worker is free.
3. Heartbeat every ``heartbeat`` seconds: a chunk answered ``lost`` (reclaimed) or
   ``cancel`` is stopped by killing its executor; a chunk past its timeout too.
4. A success's staged output is **published first, then DONE is recorded** — only for
   the current attempt (``succeed`` / ``fail`` raise :class:`FencedError` otherwise;
   a fenced attempt retracts what it published and its staging is deleted). Whoever
   sees DONE finds the output in place (:mod:`riverbed.jobs.publication`).
5. If the session is lost, running executors are killed (their chunks will be reaped)
   and the worker registers again under a new id.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from riverbed.config import Config, inherited
from riverbed.control import ControlError, ControlPlane, Registry, Session
from riverbed.control.processes import announce, host_name
from riverbed.jobs.decisions import (
    Fail,
    Fenced,
    Succeed,
    claims_wanted,
    defers,
    ending,
    flush_due,
    stop_reason,
    wait_time,
)
from riverbed.jobs.errors import FencedError, JobsValueError, QueueError
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import staging_dir
from riverbed.jobs.queue import Claim, JobQueue
from riverbed.processes import SessionStillAliveError, kill_session
from riverbed.storage import StorageError

log = logging.getLogger(__name__)

WORKERS = "riverbed-jobs-workers"


def log_path(home: Path, chunk_id: int, attempt: int) -> Path:
    return home / "jobs" / "logs" / f"{chunk_id}-{attempt}.log"


class Waker:
    """A readable fd that becomes ready when the jobs database may have new work."""

    def __init__(self, queue: JobQueue, poll: float = 0.01) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._stop = threading.Event()
        self._poll = poll
        self._queue = queue
        self._thread = threading.Thread(target=self._run, name="riverbed-jobs-waker", daemon=True)
        self._thread.start()

    def _signal(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write_fd, b"!")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def _run(self) -> None:
        backoff = 0.25
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # the database is away: listen again when it is back
                log.warning("jobs waker: %s; listening again in %.2fs", exc, backoff)
                self._signal()  # meanwhile the worker looks for itself
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _listen(self) -> None:
        db = self._queue.db
        if db.dialect == "sqlite" and db.path is not None:
            conn = sqlite3.connect(db.path)
            try:
                last = conn.execute("PRAGMA data_version").fetchone()[0]
                while not self._stop.wait(self._poll):
                    now = conn.execute("PRAGMA data_version").fetchone()[0]
                    if now != last:
                        last = now
                        self._signal()
            finally:
                conn.close()
            return
        import psycopg

        dsn = db.url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute("LISTEN rb_jobs")
            self._signal()  # anything sent while nobody listened
            while not self._stop.is_set():
                for _ in pg.notifies(timeout=0.5, stop_after=1):
                    self._signal()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self.read_fd)
        os.close(self._write_fd)


@dataclass
class _Executor:
    proc: Any
    conn: Connection


@dataclass
class _Slot:
    claim: Claim
    executor: _Executor
    started: float
    stopping: str | None = None  # why it is being stopped (cancel, lost, timeout)
    retries: int = 0  # times recording its end failed on a database error


@dataclass
class WorkerStats:
    done: int = 0
    failed: int = 0
    fenced: int = 0
    ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Fault:
    """A failpoint for tests: ``RIVERBED_JOBS_FAULT=publish_done:<delay s>:<kill p>``
    waits ``delay`` seconds between publishing a success's output and recording DONE,
    and SIGKILLs the worker there with probability ``kill`` — the window in which a
    dependent could read, or a crash could leave, a half-finished success."""

    delay: float = 0.0
    kill: float = 0.0

    @classmethod
    def from_env(cls) -> Fault:
        spec = inherited("RIVERBED_JOBS_FAULT")
        if not spec:
            return cls()
        point, delay, kill = spec.split(":")
        if point != "publish_done":
            raise JobsValueError(f"RIVERBED_JOBS_FAULT: unknown failpoint {point!r}")
        return cls(float(delay), float(kill))

    def between_publish_and_done(self) -> None:
        if self.kill and random.random() < self.kill:  # noqa: S311 - a test's dice
            log.warning("RIVERBED_JOBS_FAULT: killing this worker between publish and DONE")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.delay:
            time.sleep(self.delay)


class Worker:
    """Runs chunks of the queue until stopped (see the module doc)."""

    def __init__(
        self,
        queue: JobQueue,
        cp: ControlPlane,
        jobs_dir: Path,
        home: Path,
        *,
        concurrency: int = 1,
        kinds: tuple[str, ...] = ("python", "spark"),
        ttl: int = 10,
        heartbeat: float = 1.0,
        prefetch: int = 0,
        prefetch_below: float = 1.0,
        spark_master: str | None = None,
        checkpoints: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        fault: Fault | None = None,
        config: Config | None = None,
    ) -> None:
        if concurrency < 1:
            raise JobsValueError(f"concurrency must be ≥ 1, not {concurrency}")
        if prefetch < 0:
            raise JobsValueError(f"prefetch must be ≥ 0, not {prefetch}")
        self.queue = queue
        self.cp = cp
        self.jobs_dir = Path(jobs_dir).resolve()
        self.home = Path(home).resolve()
        self.concurrency = concurrency
        self.kinds = kinds
        self.ttl = ttl
        self.heartbeat = heartbeat
        self.prefetch = prefetch
        self.prefetch_below = prefetch_below
        self.spark_master = spark_master
        self.checkpoints = checkpoints
        self.config = config  # handed to the jobs (ctx.config); None: executors read it
        self.publication = open_publication(self.home, checkpoints)
        self.clock = clock
        self.host = host_name()
        self.registry = Registry(cp, WORKERS)
        self.id = ""
        self.stats = WorkerStats()
        self._idle: list[_Executor] = []
        self._slots: dict[int, _Slot] = {}
        self._held: deque[Claim] = deque()  # claimed ahead, not started yet
        # Ended chunks whose recording failed on a database error, retried each loop
        # (still heartbeated, so they are not reaped while the database is away).
        self._unrecorded: list[tuple[_Slot, dict[str, Any] | None]] = []
        self._short = False  # the last chunk finished under prefetch_below seconds
        # Short chunks that succeeded, recorded together at the next flush (prefetch ≥ 2).
        self._deferred: list[tuple[_Slot, dict[str, Any]]] = []
        self._deferred_since = 0.0
        self._mp = multiprocessing.get_context("spawn")
        self._fault = fault if fault is not None else Fault.from_env()

    def __repr__(self) -> str:
        return f"Worker({self.id or 'unregistered'}, slots={len(self._slots)}/{self.concurrency})"

    # -- executors ----------------------------------------------------------------------

    def _spawn(self) -> _Executor:
        from riverbed.jobs.executor import executor_main

        parent, child = self._mp.Pipe()
        proc = self._mp.Process(
            target=executor_main,
            args=(
                child,
                str(self.jobs_dir),
                str(self.home),
                self.spark_master,
                self.checkpoints,
                self.config,
            ),
            name="riverbed-executor",
            daemon=True,
        )
        proc.start()
        child.close()
        return _Executor(proc, parent)

    def _kill(self, ex: _Executor) -> None:
        """SIGKILL an executor and everything its chunk started (it leads a session)."""
        with contextlib.suppress(ProcessLookupError, OSError):
            ex.proc.kill()
        if ex.proc.pid is not None:  # not reaped yet (joined below), so not reused
            try:
                kill_session(ex.proc.pid, timeout=10)
            except SessionStillAliveError as exc:
                log.warning("executor %s: %s", ex.proc.pid, exc)
        ex.proc.join(timeout=5)
        ex.conn.close()

    def _want(self) -> int:
        """How many more chunks to claim: free slots, plus one held ahead while short."""
        return claims_wanted(
            self.concurrency, len(self._slots), len(self._held), self.prefetch, self._short
        )

    def _take(self, claim: Claim) -> None:
        """Start a claimed chunk on a free slot, or hold it until one frees."""
        if len(self._slots) < self.concurrency:
            self._start(claim)
        else:
            self._held.append(claim)

    def _start(self, claim: Claim) -> None:
        ex = self._idle.pop() if self._idle else self._spawn()
        req = {
            "id": claim.id,
            "attempt": claim.attempt,
            "job": claim.job,
            "kwargs": claim.kwargs,
            "work_ids": claim.work_ids,
            "master": claim.master,
            "code_version": claim.code_version,
            "log": str(log_path(self.home, claim.id, claim.attempt)),
        }
        try:
            ex.conn.send(req)
        except (BrokenPipeError, OSError):
            self._kill(ex)
            ex = self._spawn()
            ex.conn.send(req)
        self._slots[claim.id] = _Slot(claim, ex, self.clock())

    # -- results ------------------------------------------------------------------------

    def _finish(
        self, slot: _Slot, answer: dict[str, Any] | None, claim_more: bool = False
    ) -> list[Claim]:
        """Record how a slot's chunk ended; after a success, with ``claim_more``, claim
        chunks for the free slots in the same transaction (returned, to be started)."""
        claim = slot.claim
        self._slots.pop(claim.id, None)
        try:
            return self._record(slot, answer, claim_more)
        except (QueueError, StorageError) as exc:  # the database or the bucket: away
            slot.retries += 1
            self._unrecorded.append((slot, answer))
            log.warning("chunk %s: recording its end failed (%s); retrying", claim.id, exc)
            return []

    def _record(self, slot: _Slot, answer: dict[str, Any] | None, claim_more: bool) -> list[Claim]:
        claim = slot.claim
        staged = staging_dir(self.home, claim.id, claim.attempt)
        end = ending(answer, slot.stopping, claim.timeout)
        try:
            if isinstance(end, Succeed):
                self._short = self.clock() - slot.started < self.prefetch_below
                more = self._want() if claim_more else 0
                self._publish(claim, end.output)
                claims = self.queue.succeed_and_claim(
                    claim, end.output, self.id, self.host, more, self.kinds
                )
                self.stats.done += 1
                self.stats.ids.append(claim.id)
                return claims
            if isinstance(end, Fenced):
                raise FencedError(f"chunk {claim.id} attempt {claim.attempt} was {end.reason}")
            assert isinstance(end, Fail)
            error = end.error
            state = self.queue.fail(claim.id, claim.attempt, error, cancelled=end.cancelled)
            self.publication.retract(claim.job, claim.id, claim.attempt)
            self.stats.failed += 1
            log.warning(
                "chunk %s (%s) attempt %s: %s → %s",
                claim.id,
                claim.job,
                claim.attempt,
                error.strip().splitlines()[-1],
                state,
            )
        except FencedError as exc:
            if slot.retries and self._recorded_before(slot, answer):
                return []
            self.stats.fenced += 1
            self.publication.retract(claim.job, claim.id, claim.attempt)
            log.warning("%s; nothing recorded or published", exc)
        shutil.rmtree(staged, ignore_errors=True)
        return []

    def _publish(self, claim: Claim, output: bool) -> None:
        """Step one of a success, before DONE: publish the staged output (or, with none,
        retract what an older attempt of the chunk may have published)."""
        if output:
            self.publication.publish(claim.job, claim.id, claim.attempt)
        else:
            self.publication.retract(claim.job, claim.id, claim.attempt - 1)
        self._fault.between_publish_and_done()

    def _defers(self, slot: _Slot, answer: dict[str, Any] | None) -> bool:
        """Whether this ended chunk's success waits for a batch (see the module doc)."""
        ran_for = self.clock() - slot.started
        return defers(self.prefetch, answer, slot.stopping, ran_for, self.prefetch_below)

    def _flush(self, claim_more: bool) -> list[Claim]:
        """Record the deferred successes in one transaction and claim the next chunks."""
        batch, self._deferred = self._deferred, []
        if not batch:
            return []
        self._short = True
        more = self._want() if claim_more else 0
        ended = [(slot.claim, bool(answer.get("output"))) for slot, answer in batch]
        try:
            for claim, output in ended:
                self._publish(claim, output)
            fenced, claims = self.queue.succeed_many_and_claim(
                ended, self.id, self.host, more, self.kinds
            )
        except (QueueError, StorageError) as exc:  # retried one by one, as any unrecorded end
            for slot, answer in batch:
                slot.retries += 1
                self._unrecorded.append((slot, answer))
            log.warning("recording %d chunks failed (%s); retrying", len(batch), exc)
            return []
        for slot, _answer in batch:
            claim = slot.claim
            if claim.id in fenced:
                self.stats.fenced += 1
                log.warning(
                    "chunk %s attempt %s is no longer ours; nothing recorded or published",
                    claim.id,
                    claim.attempt,
                )
                self.publication.retract(claim.job, claim.id, claim.attempt)
                shutil.rmtree(staging_dir(self.home, claim.id, claim.attempt), ignore_errors=True)
                continue
            self.stats.done += 1
            self.stats.ids.append(claim.id)
        return claims

    def _recorded_before(self, slot: _Slot, answer: dict[str, Any] | None) -> bool:
        """After a database error, the first attempt to record a success may have
        committed after all (its output was published before): then it counts as done
        instead of being discarded."""
        claim = slot.claim
        row = self.queue.get(claim.id)
        if not (answer and answer.get("ok") and row["state"] == "DONE"):
            return False
        if row["attempt"] != claim.attempt:
            return False
        self.stats.done += 1
        self.stats.ids.append(claim.id)
        return True

    def _retry_unrecorded(self) -> None:
        pending, self._unrecorded = self._unrecorded, []
        for slot, answer in pending:
            self._finish(slot, answer)

    def _beat(self) -> None:
        held = [(cid, s.claim.attempt) for cid, s in self._slots.items() if s.stopping is None]
        held += [(c.id, c.attempt) for c in self._held]
        held += [(s.claim.id, s.claim.attempt) for s, _ in self._unrecorded]
        held += [(s.claim.id, s.claim.attempt) for s, _ in self._deferred]
        statuses = self.queue.heartbeat(self.id, held)
        for claim in list(self._held):
            status = statuses.get(claim.id, "ok")
            if status == "ok":
                continue
            self._held.remove(claim)
            if status == "cancel":
                with contextlib.suppress(FencedError):
                    self.queue.fail(claim.id, claim.attempt, "cancelled by request", cancelled=True)
        now = self.clock()
        for cid, slot in list(self._slots.items()):
            if slot.stopping is not None:
                continue
            reason = stop_reason(statuses.get(cid, "ok"), slot.started, now, slot.claim.timeout)
            if reason is not None:
                slot.stopping = reason
                self._kill(slot.executor)
                self._finish(slot, None)

    # -- the loop -----------------------------------------------------------------------

    def _register(self, session: Session) -> None:
        self.id = f"{self.host}-{os.getpid()}-{secrets.token_hex(3)}"
        self.registry.register(
            session,
            self.id,
            {
                "host": self.host,
                "pid": os.getpid(),
                "concurrency": self.concurrency,
                "kinds": list(self.kinds),
            },
        )
        announce(session, "jobs-worker", {"worker": self.id})  # the console's hosts view
        log.info("worker %s registered (concurrency %s)", self.id, self.concurrency)

    def run(
        self,
        stop: threading.Event | None = None,
        until: Callable[[], bool] | None = None,
    ) -> WorkerStats:
        """Work until ``stop`` is set (or ``until()`` is true between chunks)."""
        stop = stop or threading.Event()
        waker = Waker(self.queue)
        session = Session(self.cp, ttl=self.ttl)
        try:
            self._register(session)
            next_beat = self.clock() + self.heartbeat
            hot = True
            backoff = 0.0
            while not stop.is_set():
                try:
                    if not session.alive:
                        log.warning("worker %s lost its session; stopping its chunks", self.id)
                        for slot in list(self._slots.values()):
                            slot.stopping = "lost"
                            self._kill(slot.executor)
                            self._finish(slot, None)
                        self._held.clear()  # ours no longer: the orchestrator reaps them
                        self._deferred.clear()  # likewise: reaped and rerun
                        session.close(revoke=False)
                        fresh = Session(self.cp, ttl=self.ttl)
                        try:
                            self._register(fresh)
                        except BaseException:
                            fresh.close()
                            raise
                        session = fresh
                    if self._unrecorded:
                        self._retry_unrecorded()
                    while self._held and len(self._slots) < self.concurrency:
                        self._start(self._held.popleft())
                    want = self._want()
                    if self.prefetch >= 2 and self._held:
                        want = 0  # work in hand: topped up in batches, when successes flush
                    claimed = 0
                    # After a claim that found work, claim again straight away; otherwise
                    # look first (a read) so idle workers do not queue for the write lock.
                    if want > 0 and (hot or self.queue.has_work(self.kinds)):
                        for claim in self.queue.claim(self.id, self.host, want, self.kinds):
                            self._take(claim)
                            claimed += 1
                        hot = claimed > 0
                    if (
                        until is not None
                        and not self._slots
                        and not self._held
                        and not self._deferred
                        and until()
                    ):
                        break
                    free = self.concurrency - len(self._slots)
                    wait_for = wait_time(
                        self.clock(),
                        next_beat,
                        free,
                        self.queue.next_retry() if free > 0 else None,
                        self._deferred_since if self._deferred else None,
                    )
                    pipes = {s.executor.conn: s for s in self._slots.values()}
                    ready = wait([*pipes, waker.read_fd], timeout=wait_for)
                    waker.drain()
                    for conn in ready:
                        slot = pipes.get(conn)  # type: ignore[call-overload]
                        if slot is None:
                            continue
                        try:
                            answer = slot.executor.conn.recv()
                        except (EOFError, OSError):
                            self._kill(slot.executor)
                            self._finish(slot, None)
                            continue
                        self._idle.append(slot.executor)
                        self._slots.pop(slot.claim.id, None)
                        if self._held:  # start the held chunk first, record while it runs
                            self._start(self._held.popleft())
                        if self._defers(slot, answer):
                            if not self._deferred:
                                self._deferred_since = self.clock()
                            self._deferred.append((slot, answer))
                            if self._held and len(self._deferred) < self.prefetch:
                                continue  # work in hand: record with the next ones
                            claims = self._flush(claim_more=not stop.is_set())
                        else:
                            claims = self._finish(slot, answer, claim_more=not stop.is_set())
                        for claim in claims:
                            self._take(claim)
                            hot = True
                    if flush_due(
                        len(self._deferred), len(self._held), self._deferred_since, self.clock()
                    ):
                        for claim in self._flush(claim_more=not stop.is_set()):
                            self._take(claim)
                            hot = True
                    if self.clock() >= next_beat:
                        self._beat()
                        next_beat = self.clock() + self.heartbeat
                    backoff = 0.0
                except (QueueError, ControlError) as exc:
                    # The database is away (restarting, unreachable), or the control
                    # plane is (this host cut off: the session is lost, a new one cannot
                    # be had yet): keep the executors and results, and try again, so the
                    # worker is back to work when the network is.
                    what = "jobs database" if isinstance(exc, QueueError) else "control plane"
                    backoff = min(max(backoff * 2, 0.25), 5.0)
                    log.warning("%s error (%s); retrying in %.2fs", what, exc, backoff)
                    stop.wait(backoff)
        finally:
            if self._deferred:  # what still fails is reaped and rerun
                with contextlib.suppress(QueueError):
                    self._flush(claim_more=False)
            for slot in list(self._slots.values()):
                self._kill(slot.executor)
                with contextlib.suppress(FencedError, QueueError):
                    self.queue.release(slot.claim.id, slot.claim.attempt)
            self._slots.clear()
            while self._held:
                claim = self._held.popleft()
                with contextlib.suppress(FencedError, QueueError):
                    self.queue.release(claim.id, claim.attempt)
            if self._unrecorded:  # one last try; what still fails is reaped and rerun
                with contextlib.suppress(QueueError):
                    self._retry_unrecorded()
            for ex in self._idle:
                with contextlib.suppress(OSError):
                    ex.conn.send(None)
                ex.proc.join(timeout=5)
                if ex.proc.is_alive():
                    self._kill(ex)
            self._idle.clear()
            waker.close()
            session.close()
        return self.stats


def run_here(
    queue: JobQueue,
    cp: ControlPlane,
    jobs_dir: Path,
    home: Path,
    master: int,
    on_chunk: Callable[[Claim, str], None] | None = None,
    spark_master: str | None = None,
    checkpoints: str | None = None,
    config: Config | None = None,
) -> str:
    """The development runner: run every chunk of run ``master`` in this process (no
    executor, so a debugger and prints work), registered like a worker so a running
    orchestrator does not reap it. Returns the run's final state."""
    from riverbed.config import SparkConfig
    from riverbed.jobs.executor import ChunkRunner

    runner = ChunkRunner(
        Path(jobs_dir),
        Path(home),
        SparkConfig(master=spark_master) if spark_master else None,
        checkpoints,
        config,
    )
    pub = runner.publication
    host = host_name()
    worker_id = f"dev-{host}-{os.getpid()}-{secrets.token_hex(3)}"
    waker = Waker(queue)
    try:
        with Session(cp, ttl=10) as session:
            Registry(cp, WORKERS).register(session, worker_id, {"host": host, "dev": True})
            while True:
                state = queue.state(master)
                if state != "MASTER":
                    return str(state)
                claims = queue.claim(worker_id, host, 1, master=master)
                if not claims:
                    retry = queue.next_retry()
                    wait([waker.read_fd], timeout=1.0 if retry is None else min(retry, 1.0))
                    waker.drain()
                    continue
                claim = claims[0]
                stop = threading.Event()
                beat = threading.Thread(
                    target=_beat_inline, args=(queue, worker_id, claim, stop), daemon=True
                )
                beat.start()
                try:
                    answer = runner.run(
                        {
                            "id": claim.id,
                            "attempt": claim.attempt,
                            "job": claim.job,
                            "kwargs": claim.kwargs,
                            "work_ids": claim.work_ids,
                            "master": claim.master,
                            "code_version": claim.code_version,
                        }
                    )
                finally:
                    stop.set()
                    beat.join()
                outcome = "DONE"
                try:
                    if answer["ok"]:
                        if answer["output"]:  # published first: DONE means it is in place
                            pub.publish(claim.job, claim.id, claim.attempt)
                        queue.succeed_and_claim(claim, bool(answer["output"]), worker_id, host, 0)
                    else:
                        outcome = queue.fail(claim.id, claim.attempt, answer["error"])
                except FencedError as exc:
                    outcome = f"FENCED ({exc})"
                    pub.retract(claim.job, claim.id, claim.attempt)
                    shutil.rmtree(staging_dir(home, claim.id, claim.attempt), ignore_errors=True)
                if on_chunk is not None:
                    on_chunk(claim, outcome if answer["ok"] else f"{outcome}\n{answer['error']}")
    finally:
        waker.close()


def _beat_inline(queue: JobQueue, worker_id: str, claim: Claim, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            queue.heartbeat(worker_id, [(claim.id, claim.attempt)])
        except Exception:
            log.debug("heartbeat failed", exc_info=True)
