"""Workers: claim chunks, run them in warm executor processes, record what happened.

The worker is an I/O shell — executors, pipes, its session, the database, the
publication — around a state machine, :class:`riverbed.jobs.workerstate.WorkerState`:
every event (claimed, answered, died, heartbeat, session lost) goes in, the
instructions it returns (start, kill, record, flush, cancel, release) come out and are
carried out here; each decision is a pure function of :mod:`riverbed.jobs.decisions`.

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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from riverbed.config import Config, inherited
from riverbed.control import ControlError, ControlPlane, Registry, Session
from riverbed.control.processes import announce, host_name
from riverbed.jobs.decisions import Fail, Fenced, Succeed, wait_time
from riverbed.jobs.errors import FencedError, JobsValueError, QueueError
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import staging_dir
from riverbed.jobs.queue import Claim, JobQueue
from riverbed.jobs.waker import Waker
from riverbed.jobs.workerstate import (
    Answer,
    Answered,
    CancelHeld,
    Claimed,
    Event,
    ExecutorDied,
    Flush,
    FlushTime,
    Heartbeat,
    Instruction,
    Kill,
    Record,
    RecordFailed,
    Release,
    RetryUnrecorded,
    SessionLost,
    Slot,
    SlotsFree,
    Start,
    Stopping,
    WorkerState,
)
from riverbed.processes import SessionStillAliveError, kill_session
from riverbed.storage import StorageError

log = logging.getLogger(__name__)

WORKERS = "riverbed-jobs-workers"


def log_path(home: Path, chunk_id: int, attempt: int) -> Path:
    return home / "jobs" / "logs" / f"{chunk_id}-{attempt}.log"


@dataclass
class _Executor:
    proc: Any
    conn: Connection


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
        # what runs where, what is held, deferred, unrecorded: every decision there
        self.state = WorkerState(concurrency, prefetch, prefetch_below)
        self._idle: list[_Executor] = []
        self._running: dict[int, _Executor] = {}  # the executor of each running chunk
        self._mp = multiprocessing.get_context("spawn")
        self._fault = fault if fault is not None else Fault.from_env()

    def __repr__(self) -> str:
        running = len(self.state.slots)
        return f"Worker({self.id or 'unregistered'}, slots={running}/{self.concurrency})"

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

    # -- carrying out the state machine's instructions ------------------------------------

    def _handle(self, event: Event) -> int:
        """Hand an event to the state machine and carry out what it says (and what that
        leads to: the chunks a success claimed in its transaction). Returns how many
        chunks were claimed meanwhile."""
        claimed = 0
        todo = list(self.state.handle(event))
        while todo:
            instruction = todo.pop(0)
            more = self._do(instruction)
            if more:
                claimed += len(more)
                todo[:0] = self.state.handle(Claimed(tuple(more), self.clock()))
        return claimed

    def _do(self, instruction: Instruction) -> list[Claim]:
        if isinstance(instruction, Start):
            self._start(instruction.claim)
        elif isinstance(instruction, Kill):
            ex = self._running.pop(instruction.chunk, None)
            if ex is not None:
                self._kill(ex)
        elif isinstance(instruction, Record):
            return self._recorded(instruction)
        elif isinstance(instruction, Flush):
            return self._flush(instruction)
        elif isinstance(instruction, CancelHeld):
            claim = instruction.claim
            with contextlib.suppress(FencedError):
                self.queue.fail(claim.id, claim.attempt, "cancelled by request", cancelled=True)
        elif isinstance(instruction, Release):
            with contextlib.suppress(FencedError, QueueError):
                self.queue.release(instruction.claim.id, instruction.claim.attempt)
        return []

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
        self._running[claim.id] = ex

    # -- results ------------------------------------------------------------------------

    def _recorded(self, record: Record) -> list[Claim]:
        """Record how a chunk ended; a database or bucket away: retried later."""
        try:
            return self._record(record)
        except (QueueError, StorageError) as exc:  # the database or the bucket: away
            self.state.handle(RecordFailed(((record.slot, record.answer),)))
            log.warning(
                "chunk %s: recording its end failed (%s); retrying", record.slot.claim.id, exc
            )
            return []

    def _record(self, record: Record) -> list[Claim]:
        slot, end = record.slot, record.end
        claim = slot.claim
        staged = staging_dir(self.home, claim.id, claim.attempt)
        try:
            if isinstance(end, Succeed):
                self._publish(claim, end.output)
                claims = self.queue.succeed_and_claim(
                    claim, end.output, self.id, self.host, record.more, self.kinds
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
            if slot.retries and self._recorded_before(slot, record.answer):
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

    def _flush(self, flush: Flush) -> list[Claim]:
        """Record the deferred successes in one transaction and claim the next chunks."""
        ended = [(slot.claim, bool(answer and answer.get("output"))) for slot, answer in flush.ends]
        try:
            for claim, output in ended:
                self._publish(claim, output)
            fenced, claims = self.queue.succeed_many_and_claim(
                ended, self.id, self.host, flush.more, self.kinds
            )
        except (QueueError, StorageError) as exc:  # retried one by one, as any unrecorded end
            self.state.handle(RecordFailed(flush.ends))
            log.warning("recording %d chunks failed (%s); retrying", len(flush.ends), exc)
            return []
        for slot, _answer in flush.ends:
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

    def _recorded_before(self, slot: Slot, answer: Answer) -> bool:
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

    def _beat(self) -> None:
        statuses = self.queue.heartbeat(self.id, self.state.holding())
        self._handle(Heartbeat(statuses, self.clock()))

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
        state = self.state
        try:
            self._register(session)
            next_beat = self.clock() + self.heartbeat
            hot = True
            backoff = 0.0
            while not stop.is_set():
                try:
                    if not session.alive:
                        log.warning("worker %s lost its session; stopping its chunks", self.id)
                        self._handle(SessionLost())
                        session.close(revoke=False)
                        fresh = Session(self.cp, ttl=self.ttl)
                        try:
                            self._register(fresh)
                        except BaseException:
                            fresh.close()
                            raise
                        session = fresh
                    if state.unrecorded:
                        self._handle(RetryUnrecorded(self.clock()))
                    self._handle(SlotsFree(self.clock()))
                    want = state.want()
                    # After a claim that found work, claim again straight away; otherwise
                    # look first (a read) so idle workers do not queue for the write lock.
                    if want > 0 and (hot or self.queue.has_work(self.kinds)):
                        claims = self.queue.claim(self.id, self.host, want, self.kinds)
                        self._handle(Claimed(tuple(claims), self.clock()))
                        hot = len(claims) > 0
                    if until is not None and state.idle() and until():
                        break
                    free = state.free()
                    wait_for = wait_time(
                        self.clock(),
                        next_beat,
                        free,
                        self.queue.next_retry() if free > 0 else None,
                        state.deferred_since if state.deferred else None,
                    )
                    pipes = {self._running[cid].conn: cid for cid in state.slots}
                    ready = wait([*pipes, waker.read_fd], timeout=wait_for)
                    waker.drain()
                    for conn in ready:
                        cid = pipes.get(conn)  # type: ignore[call-overload]
                        if cid is None or cid not in state.slots:
                            continue
                        try:
                            answer = self._running[cid].conn.recv()
                        except (EOFError, OSError):
                            self._handle(ExecutorDied(cid, self.clock()))
                            continue
                        self._idle.append(self._running.pop(cid))
                        event = Answered(cid, answer, self.clock(), claim_more=not stop.is_set())
                        if self._handle(event):
                            hot = True
                    if self._handle(FlushTime(self.clock(), claim_more=not stop.is_set())):
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
            if state.deferred:  # what still fails is reaped and rerun
                with contextlib.suppress(QueueError):
                    self._handle(FlushTime(self.clock(), claim_more=False, force=True))
            self._handle(Stopping())
            if state.unrecorded:  # one last try; what still fails is reaped and rerun
                with contextlib.suppress(QueueError):
                    self._handle(RetryUnrecorded(self.clock()))
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
    from riverbed.jobs.executor import ChunkRunner, chunk_spark

    runner = ChunkRunner(
        Path(jobs_dir), Path(home), chunk_spark(config, spark_master), checkpoints, config
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
