"""The worker's state machine (riverbed.jobs.workerstate), driven by random event
sequences: a model of the shell carries out its instructions (recordings that fail on
a database error included) and checks that every claim is accounted for exactly once,
never more chunks run than slots, and every instruction names a chunk the worker
holds. The shell itself (executors, the database) is tested by the worker and crash
suites."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from riverbed.jobs.decisions import Fail, Fenced, Succeed
from riverbed.jobs.queuebase import Claim
from riverbed.jobs.workerstate import (
    Answered,
    CancelHeld,
    Claimed,
    Event,
    ExecutorDied,
    Flush,
    FlushTime,
    Heartbeat,
    Kill,
    Record,
    RecordFailed,
    Release,
    RetryUnrecorded,
    SessionLost,
    SlotsFree,
    Start,
    Stopping,
    WorkerState,
)


def claim(cid: int, timeout: float | None) -> Claim:
    return Claim(cid, None, "job", "python", {}, [cid], 1, timeout, "")


class Worker(RuleBasedStateMachine):
    """The shell's model: which chunks run on an executor, and where each claim went."""

    def __init__(self) -> None:
        super().__init__()
        self.state: WorkerState | None = None
        self.now = 0.0
        self.next_id = 1
        self.running: set[int] = set()  # started on an executor, not answered or killed
        self.started: set[int] = set()
        self.ends: dict[int, str] = {}  # chunk → how it left the worker
        self.given: set[int] = set()

    @rule(
        concurrency=st.integers(1, 3),
        prefetch=st.integers(0, 3),
        below=st.sampled_from([1.0, 5.0, 30.0]),
    )
    @precondition(lambda self: self.state is None)
    def begin(self, concurrency: int, prefetch: int, below: float) -> None:
        self.state = WorkerState(concurrency, prefetch, below)

    def send(self, event: Event, data: st.DataObject) -> None:
        """Hand an event over and carry out every instruction, as the shell does."""
        assert self.state is not None
        todo = list(self.state.handle(event))
        while todo:
            instruction = todo.pop(0)
            more: list[Claim] = []
            if isinstance(instruction, Start):
                cid = instruction.claim.id
                assert cid not in self.started, "a chunk started twice"
                assert cid in self.state.slots
                self.started.add(cid)
                self.running.add(cid)
            elif isinstance(instruction, Kill):
                assert instruction.chunk in self.running, "killed what does not run"
                self.running.discard(instruction.chunk)
            elif isinstance(instruction, Record):
                cid = instruction.slot.claim.id
                assert cid in self.started and cid not in self.state.slots
                assert cid not in self.running, "recorded while its executor runs"
                stopped = instruction.slot.stopping is not None
                assert not (stopped and isinstance(instruction.end, Succeed)), "stopped, yet done"
                if data.draw(st.booleans(), label="database away"):
                    self.state.handle(RecordFailed(((instruction.slot, instruction.answer),)))
                    continue
                self.ends[cid] = type(instruction.end).__name__
                if isinstance(instruction.end, Succeed):
                    more = self.fresh(data.draw(st.integers(0, instruction.more)))
                else:
                    assert instruction.more == 0
            elif isinstance(instruction, Flush):
                assert all(isinstance(a, dict) and a["ok"] for _, a in instruction.ends)
                if data.draw(st.booleans(), label="database away"):
                    self.state.handle(RecordFailed(instruction.ends))
                    continue
                for slot, _ in instruction.ends:
                    self.ends[slot.claim.id] = "Flushed"
                more = self.fresh(data.draw(st.integers(0, instruction.more)))
            elif isinstance(instruction, CancelHeld):
                assert instruction.claim.id not in self.started
                self.ends[instruction.claim.id] = "CancelHeld"
            elif isinstance(instruction, Release):
                self.ends[instruction.claim.id] = "Released"
            if more:
                todo[:0] = self.state.handle(Claimed(tuple(more), self.now))

    def fresh(self, n: int) -> list[Claim]:
        out = []
        for _ in range(n):
            out.append(claim(self.next_id, 3.0 if self.next_id % 2 else None))
            self.given.add(self.next_id)
            self.next_id += 1
        return out

    # -- events ------------------------------------------------------------------------

    @precondition(lambda self: self.state is not None)
    @rule(dt=st.floats(0, 0.3), data=st.data())
    def claim_what_is_wanted(self, dt: float, data: st.DataObject) -> None:
        assert self.state is not None
        self.now += dt
        self.send(SlotsFree(self.now), data)
        want = self.state.want()
        assert want >= 0
        self.send(Claimed(tuple(self.fresh(data.draw(st.integers(0, want)))), self.now), data)

    @precondition(lambda self: self.state is not None and self.running)
    @rule(dt=st.floats(0, 1.5), ok=st.booleans(), output=st.booleans(), data=st.data())
    def an_executor_answers(self, dt: float, ok: bool, output: bool, data: st.DataObject) -> None:
        self.now += dt
        cid = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(cid)
        answer: dict[str, Any] = {"ok": ok, "output": output, "error": None if ok else "boom"}
        self.send(Answered(cid, answer, self.now, data.draw(st.booleans())), data)

    @precondition(lambda self: self.state is not None and self.running)
    @rule(data=st.data())
    def an_executor_dies(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.running)))
        self.send(ExecutorDied(cid, self.now), data)
        assert self.ends.get(cid) == "Fail" or cid in {s.claim.id for s, _ in self.unrecorded()}

    def unrecorded(self) -> list[Any]:
        assert self.state is not None
        return self.state.unrecorded

    @precondition(lambda self: self.state is not None)
    @rule(dt=st.floats(0, 0.2), claim_more=st.booleans(), data=st.data())
    def flush_time(self, dt: float, claim_more: bool, data: st.DataObject) -> None:
        self.now += dt
        self.send(FlushTime(self.now, claim_more), data)

    @precondition(lambda self: self.state is not None)
    @rule(dt=st.floats(0, 2), data=st.data())
    def heartbeat(self, dt: float, data: st.DataObject) -> None:
        assert self.state is not None
        self.now += dt
        held = [cid for cid, _ in self.state.holding()]
        statuses = {cid: data.draw(st.sampled_from(["ok", "ok", "cancel", "lost"])) for cid in held}
        before = {c.id for c in self.state.held}
        self.send(Heartbeat(statuses, self.now), data)
        for cid in before - {c.id for c in self.state.held}:
            if cid not in self.ends:  # a held chunk reclaimed: the orchestrator reaps it
                assert statuses[cid] == "lost"
                self.ends[cid] = "Dropped"

    @precondition(lambda self: self.state is not None and not self.state.idle())
    @rule(rarely=st.integers(0, 4), data=st.data())
    def session_lost(self, rarely: int, data: st.DataObject) -> None:
        assert self.state is not None
        if rarely:
            return
        dropped = {c.id for c in self.state.held} | {s.claim.id for s, _ in self.state.deferred}
        running = set(self.state.slots)
        self.send(SessionLost(), data)
        assert not self.running and not self.state.slots and not self.state.held
        for cid in running:
            assert self.ends.get(cid) == "Fenced" or cid in {
                s.claim.id for s, _ in self.unrecorded()
            }
        for cid in dropped:
            self.ends[cid] = "Dropped"

    @precondition(lambda self: self.state is not None)
    @rule(dt=st.floats(0, 1), data=st.data())
    def retry_unrecorded(self, dt: float, data: st.DataObject) -> None:
        self.now += dt
        self.send(RetryUnrecorded(self.now), data)

    @precondition(lambda self: self.state is not None and not self.state.idle())
    @rule(rarely=st.integers(0, 4), data=st.data())
    def stop(self, rarely: int, data: st.DataObject) -> None:
        assert self.state is not None
        if rarely:
            return
        self.send(FlushTime(self.now, claim_more=False, force=True), data)
        self.send(Stopping(), data)
        assert self.state.idle() and not self.running

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def never_more_running_than_slots(self) -> None:
        if self.state is not None:
            assert len(self.state.slots) <= self.state.concurrency
            assert set(self.state.slots) == self.running

    @invariant()
    def every_claim_is_in_exactly_one_place(self) -> None:
        if self.state is None:
            return
        places = [
            set(self.state.slots),
            {c.id for c in self.state.held},
            {s.claim.id for s, _ in self.state.deferred},
            {s.claim.id for s, _ in self.state.unrecorded},
            set(self.ends),
        ]
        assert sum(len(p) for p in places) == len(set().union(*places)), places
        assert set().union(*places) == self.given

    @invariant()
    def held_only_while_the_slots_are_full_or_a_success_waits(self) -> None:
        if self.state is not None and self.state.held:
            assert self.state.prefetch > 0

    @invariant()
    def a_stopped_chunk_never_counts_as_a_success(self) -> None:
        for cid, how in self.ends.items():
            assert how in {
                "Succeed",
                "Fail",
                "Fenced",
                "Flushed",
                "CancelHeld",
                "Released",
                "Dropped",
            }
            del cid


Worker.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_worker_state_machine = Worker.TestCase


def test_a_timed_out_chunk_is_killed_and_failed_then_its_slot_is_taken() -> None:
    state = WorkerState(concurrency=1)
    first, second = claim(1, timeout=2.0), claim(2, None)
    assert state.handle(Claimed((first, second), now=0.0)) == [Start(first)]
    assert list(state.held) == [second]  # no free slot: held
    out = state.handle(Heartbeat({1: "ok", 2: "ok"}, now=3.0))
    assert out[0] == Kill(1)
    record = out[1]
    assert isinstance(record, Record) and record.end == Fail("timed out after 2s", False)
    assert state.handle(SlotsFree(now=3.0)) == [Start(second)]


def test_a_reclaimed_chunk_records_nothing_and_a_cancelled_held_one_is_cancelled() -> None:
    state = WorkerState(concurrency=1, prefetch=1)
    state.short = True
    running, ahead = claim(1, None), claim(2, None)
    state.handle(Claimed((running, ahead), now=0.0))
    out = state.handle(Heartbeat({1: "lost", 2: "cancel"}, now=1.0))
    assert out[0] == CancelHeld(ahead) and out[1] == Kill(1)
    record = out[2]
    assert isinstance(record, Record) and record.end == Fenced("reclaimed")
    assert state.idle()


def test_short_successes_are_recorded_together_once_nothing_is_held() -> None:
    alone = WorkerState(concurrency=1, prefetch=2, prefetch_below=1.0)
    alone.handle(Claimed((claim(9, None),), now=0.0))
    out = alone.handle(Answered(9, {"ok": True, "output": True}, now=0.1, claim_more=True))
    assert [type(i).__name__ for i in out] == ["Flush"]  # nothing held: no company to wait for

    state = WorkerState(concurrency=1, prefetch=2, prefetch_below=1.0)
    a, b, c = claim(1, None), claim(2, None), claim(3, None)
    state.handle(Claimed((a, b, c), now=0.0))  # b and c held
    out = state.handle(Answered(1, {"ok": True, "output": True}, now=0.1, claim_more=True))
    assert out == [Start(b)]  # held chunk first; a's success waits for company
    out = state.handle(Answered(2, {"ok": True, "output": False}, now=0.2, claim_more=True))
    assert out[0] == Start(c)
    flush = out[1]  # nothing held any more: recorded now, together
    assert isinstance(flush, Flush) and [s.claim.id for s, _ in flush.ends] == [1, 2]
    assert flush.more == 2  # two held ahead while short (the slot runs c)
    assert state.handle(RecordFailed(flush.ends)) == []
    assert [s.retries for s, _ in state.unrecorded] == [1, 1]
    retried = state.handle(RetryUnrecorded(now=1.0))
    assert [type(r).__name__ for r in retried] == ["Record", "Record"]
    assert all(isinstance(r, Record) and r.end == Succeed(r.slot.claim.id == 1) for r in retried)
