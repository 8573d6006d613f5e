"""A worker's state machine: what it holds, and what each event makes it do — no I/O.

:class:`WorkerState` keeps which chunk runs in which slot (and since when, and whether
it is being stopped), the chunks claimed ahead (*held*), the short successes waiting to
be recorded together (*deferred*) and the ends whose recording failed on a database
error (*unrecorded*). :meth:`WorkerState.handle` takes one :data:`Event` — chunks were
claimed, an executor answered or died, a heartbeat's answers came back, the session was
lost, a recording failed — changes the state and returns the :data:`Instruction`\\ s the
shell (:class:`riverbed.jobs.worker.Worker`: executors, pipes, the jobs database, the
publication) carries out, in order: start a chunk on an executor, kill one, record an
end, record a batch of successes, cancel a held chunk, give a chunk back. What the shell
learns while doing so (the chunks a success claimed in its transaction, a recording that
failed) comes back as the next event. Each decision is one of
:mod:`riverbed.jobs.decisions`; ``tests/jobs/test_workerstate.py`` runs random event
sequences against the invariants (never more running than slots, every claim accounted
for exactly once, an instruction only for a chunk the worker holds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from riverbed.jobs.decisions import (
    Ending,
    Succeed,
    claims_wanted,
    defers,
    ending,
    flush_due,
    stop_reason,
)

if TYPE_CHECKING:
    from riverbed.jobs.queuebase import Claim

Answer = Mapping[str, Any] | None  # an executor's reply; None: it died or was killed


@dataclass
class Slot:
    """A chunk running on one of the worker's executors."""

    claim: Claim
    started: float
    stopping: str | None = None  # why it is being stopped (cancel, lost, timeout)
    retries: int = 0  # times recording its end failed on a database error


# -- events: what happened -----------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """The database gave these chunks to the worker (a claim, or a success's
    transaction that claimed the next ones)."""

    claims: tuple[Claim, ...]
    now: float


@dataclass(frozen=True)
class SlotsFree:
    """The loop's turn: held chunks may start on free slots."""

    now: float


@dataclass(frozen=True)
class Answered:
    """A running chunk's executor replied (the executor is idle again)."""

    chunk: int
    answer: Answer
    now: float
    claim_more: bool  # False while the worker stops: record, claim nothing


@dataclass(frozen=True)
class ExecutorDied:
    """A running chunk's executor is gone (its pipe broke)."""

    chunk: int
    now: float


@dataclass(frozen=True)
class FlushTime:
    """The loop's turn: the deferred successes may be due (``force``: the worker
    stops, they are recorded now)."""

    now: float
    claim_more: bool
    force: bool = False


@dataclass(frozen=True)
class Heartbeat:
    """The database's answer per held chunk (``ok``, ``cancel``, ``lost``)."""

    statuses: Mapping[int, str]
    now: float


@dataclass(frozen=True)
class SessionLost:
    """The worker's control-plane session expired: its chunks will be reaped (the
    shell then registers again under a new id)."""


@dataclass(frozen=True)
class Stopping:
    """The worker stops: what runs is killed and, like what is held, given back."""


@dataclass(frozen=True)
class RecordFailed:
    """Recording these ends failed on a database or storage error: try again."""

    ends: tuple[tuple[Slot, Answer], ...]


@dataclass(frozen=True)
class RetryUnrecorded:
    """The loop's turn: record again what failed to be recorded."""

    now: float


Event = (
    Claimed
    | SlotsFree
    | Answered
    | ExecutorDied
    | FlushTime
    | Heartbeat
    | SessionLost
    | Stopping
    | RecordFailed
    | RetryUnrecorded
)


# -- instructions: what the shell does -----------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Send the chunk to an idle executor (or a new one)."""

    claim: Claim


@dataclass(frozen=True)
class Kill:
    """SIGKILL the executor running this chunk (and all it started)."""

    chunk: int


@dataclass(frozen=True)
class Record:
    """Record how a chunk ended (a success: publish, then DONE and claim ``more`` in
    the same transaction; a failure; a fenced attempt: nothing)."""

    slot: Slot
    answer: Answer
    end: Ending
    more: int


@dataclass(frozen=True)
class Flush:
    """Record these short successes in one transaction and claim ``more``."""

    ends: tuple[tuple[Slot, Answer], ...]
    more: int


@dataclass(frozen=True)
class CancelHeld:
    """A held chunk was cancelled before it started: record the cancel."""

    claim: Claim


@dataclass(frozen=True)
class Release:
    """Give a claimed chunk back to the queue (the worker stops)."""

    claim: Claim


Instruction = Start | Kill | Record | Flush | CancelHeld | Release


@dataclass
class WorkerState:
    """Everything a worker holds, and its transitions (see the module's docstring)."""

    concurrency: int
    prefetch: int = 0
    prefetch_below: float = 1.0
    slots: dict[int, Slot] = field(default_factory=dict)
    held: deque[Claim] = field(default_factory=deque)  # claimed ahead, not started yet
    deferred: list[tuple[Slot, Answer]] = field(default_factory=list)
    deferred_since: float = 0.0
    # ends whose recording failed on a database error, retried each loop (still
    # heartbeated, so they are not reaped while the database is away)
    unrecorded: list[tuple[Slot, Answer]] = field(default_factory=list)
    short: bool = False  # the last chunk finished under prefetch_below seconds

    # -- what the shell asks ---------------------------------------------------------------

    def want(self) -> int:
        """How many more chunks to claim: free slots, plus one held ahead while short;
        none while work is held and successes are recorded in batches (topped up when
        they flush)."""
        if self.prefetch >= 2 and self.held:
            return 0
        return self._wanted()

    def _wanted(self) -> int:
        return claims_wanted(
            self.concurrency, len(self.slots), len(self.held), self.prefetch, self.short
        )

    def idle(self) -> bool:
        """Nothing running, held or waiting to be recorded together."""
        return not self.slots and not self.held and not self.deferred

    def free(self) -> int:
        return self.concurrency - len(self.slots)

    def holding(self) -> list[tuple[int, int]]:
        """(chunk, attempt) of every chunk the heartbeat keeps alive: running (unless
        being stopped), held, and ended but not recorded yet."""
        out = [(cid, s.claim.attempt) for cid, s in self.slots.items() if s.stopping is None]
        out += [(c.id, c.attempt) for c in self.held]
        out += [(s.claim.id, s.claim.attempt) for s, _ in self.unrecorded]
        out += [(s.claim.id, s.claim.attempt) for s, _ in self.deferred]
        return out

    # -- transitions -----------------------------------------------------------------------

    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; the instructions for the shell, in order."""
        if isinstance(event, Claimed):
            return [i for c in event.claims for i in self._take(c, event.now)]
        if isinstance(event, SlotsFree):
            out: list[Instruction] = []
            while self.held and len(self.slots) < self.concurrency:
                out += self._start(self.held.popleft(), event.now)
            return out
        if isinstance(event, Answered):
            return self._answered(event)
        if isinstance(event, ExecutorDied):
            slot = self.slots.get(event.chunk)
            if slot is None:
                return []
            return [Kill(event.chunk), *self._finish(slot, None, False, event.now)]
        if isinstance(event, FlushTime):
            due = flush_due(len(self.deferred), len(self.held), self.deferred_since, event.now)
            return self._flush(event.claim_more) if due or event.force else []
        if isinstance(event, Heartbeat):
            return self._beat(event)
        if isinstance(event, SessionLost):
            out = []
            for cid, slot in list(self.slots.items()):
                slot.stopping = "lost"
                out += [Kill(cid), *self._finish(slot, None, False, 0.0)]
            self.held.clear()  # ours no longer: the orchestrator reaps them
            self.deferred.clear()  # likewise: reaped and rerun
            return out
        if isinstance(event, Stopping):
            out = []
            for cid, slot in list(self.slots.items()):
                out += [Kill(cid), Release(slot.claim)]
            self.slots.clear()
            out += [Release(claim) for claim in self.held]
            self.held.clear()
            return out
        if isinstance(event, RecordFailed):
            for slot, answer in event.ends:
                slot.retries += 1
                self.unrecorded.append((slot, answer))
            return []
        if isinstance(event, RetryUnrecorded):
            pending, self.unrecorded = self.unrecorded, []
            return [i for slot, a in pending for i in self._finish(slot, a, False, event.now)]
        raise TypeError(f"not a worker event: {event!r}")

    def _take(self, claim: Claim, now: float) -> list[Instruction]:
        """Start a claimed chunk on a free slot, or hold it until one frees."""
        if len(self.slots) < self.concurrency:
            return self._start(claim, now)
        self.held.append(claim)
        return []

    def _start(self, claim: Claim, now: float) -> list[Instruction]:
        self.slots[claim.id] = Slot(claim, now)
        return [Start(claim)]

    def _answered(self, event: Answered) -> list[Instruction]:
        slot = self.slots.pop(event.chunk, None)
        if slot is None:
            return []
        out: list[Instruction] = []
        if self.held:  # start the held chunk first, record while it runs
            out += self._start(self.held.popleft(), event.now)
        ran_for = event.now - slot.started
        if defers(self.prefetch, event.answer, slot.stopping, ran_for, self.prefetch_below):
            if not self.deferred:
                self.deferred_since = event.now
            self.deferred.append((slot, event.answer))
            if self.held and len(self.deferred) < self.prefetch:
                return out  # work in hand: record with the next ones
            return [*out, *self._flush(event.claim_more)]
        return [*out, *self._finish(slot, event.answer, event.claim_more, event.now)]

    def _finish(
        self, slot: Slot, answer: Answer, claim_more: bool, now: float
    ) -> list[Instruction]:
        """Record how a slot's chunk ended; after a success, with ``claim_more``, claim
        chunks for the free slots in the same transaction."""
        self.slots.pop(slot.claim.id, None)
        end = ending(answer, slot.stopping, slot.claim.timeout)
        more = 0
        if isinstance(end, Succeed):
            self.short = now - slot.started < self.prefetch_below
            more = self._wanted() if claim_more else 0
        return [Record(slot, answer, end, more)]

    def _flush(self, claim_more: bool) -> list[Instruction]:
        batch, self.deferred = self.deferred, []
        if not batch:
            return []
        self.short = True
        return [Flush(tuple(batch), self._wanted() if claim_more else 0)]

    def _beat(self, event: Heartbeat) -> list[Instruction]:
        out: list[Instruction] = []
        for claim in list(self.held):
            status = event.statuses.get(claim.id, "ok")
            if status == "ok":
                continue
            self.held.remove(claim)
            if status == "cancel":
                out.append(CancelHeld(claim))
        for cid, slot in list(self.slots.items()):
            if slot.stopping is not None:
                continue
            status = event.statuses.get(cid, "ok")
            reason = stop_reason(status, slot.started, event.now, slot.claim.timeout)
            if reason is not None:
                slot.stopping = reason
                out += [Kill(cid), *self._finish(slot, None, False, event.now)]
        return out


__all__ = [
    "Answered",
    "CancelHeld",
    "Claimed",
    "Event",
    "ExecutorDied",
    "Flush",
    "FlushTime",
    "Heartbeat",
    "Instruction",
    "Kill",
    "Record",
    "RecordFailed",
    "Release",
    "RetryUnrecorded",
    "SessionLost",
    "Slot",
    "SlotsFree",
    "Start",
    "Stopping",
    "WorkerState",
]
