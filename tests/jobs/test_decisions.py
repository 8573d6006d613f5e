"""The worker's decisions (riverbed.jobs.decisions), property by property: no I/O, so
every combination of what a worker can know is tried."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.jobs.decisions import (
    DEFER_AT_MOST,
    STOP_REASONS,
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
from riverbed.jobs.errors import JobsValueError

answers = st.none() | st.fixed_dictionaries(
    {"ok": st.booleans()},
    optional={"output": st.booleans(), "error": st.none() | st.text(max_size=20)},
)
stopping = st.none() | st.sampled_from(STOP_REASONS)
times = st.floats(0, 1e6, allow_nan=False)
timeouts = st.none() | st.floats(0.001, 1e4, allow_nan=False)


@given(answers, stopping, timeouts)
def test_a_chunk_succeeds_only_when_it_said_ok_and_was_not_being_stopped(
    answer: dict[str, Any] | None, stop: str | None, timeout: float | None
) -> None:
    end = ending(answer, stop, timeout)
    ok = answer is not None and bool(answer["ok"])
    assert isinstance(end, Succeed) == (ok and stop is None)
    if isinstance(end, Succeed):
        assert end.output == bool(answer and answer.get("output"))
    assert isinstance(end, Fenced) == (stop == "lost")  # a reclaimed attempt records nothing
    if isinstance(end, Fail):
        assert end.error  # a user always reads why
        assert end.cancelled == (stop == "cancel")
        if stop == "timeout":
            assert end.error.startswith("timed out after")
        elif stop is None and answer is None:
            assert "executor process died" in end.error
        elif stop is None and answer is not None and answer.get("error"):
            assert end.error == answer["error"]


def test_unknown_reasons_are_refused() -> None:
    with pytest.raises(JobsValueError, match="unknown stop reason"):
        ending(None, "vanished", None)
    with pytest.raises(JobsValueError, match="unknown heartbeat status"):
        stop_reason("gone", 0.0, 1.0, None)


@given(
    st.integers(1, 64),
    st.integers(0, 64),
    st.integers(0, 64),
    st.integers(0, 16),
    st.booleans(),
)
def test_claims_never_overfill_the_slots_and_what_is_held(
    concurrency: int, running: int, held: int, prefetch: int, short: bool
) -> None:
    want = claims_wanted(concurrency, running, held, prefetch, short)
    assert want >= 0
    limit = concurrency + (prefetch if short else 0)
    if running + held <= limit:  # what the worker can be asked to hold, and no more
        assert running + held + want == limit
    else:
        assert want == 0
    if not short:  # nothing held ahead unless chunks are short
        assert want <= max(0, concurrency - running)


@given(st.sampled_from(("ok", *STOP_REASONS)), times, times, timeouts)
def test_a_running_chunk_stops_for_the_database_first_then_its_timeout(
    status: str, started: float, now: float, timeout: float | None
) -> None:
    reason = stop_reason(status, started, now, timeout)
    if status != "ok":
        assert reason == status
    elif timeout is not None and now - started > timeout:
        assert reason == "timeout"
    else:
        assert reason is None


@given(st.integers(0, 8), answers, stopping, st.floats(0, 10), st.floats(0, 10))
def test_only_short_successes_wait_for_a_batch(
    prefetch: int,
    answer: dict[str, Any] | None,
    stop: str | None,
    ran_for: float,
    below: float,
) -> None:
    if defers(prefetch, answer, stop, ran_for, below):
        assert prefetch >= 2 and ran_for < below
        assert isinstance(ending(answer, stop, None), Succeed)


@given(st.integers(0, 10), st.integers(0, 10), times, times, st.floats(0, 1))
def test_deferred_successes_are_recorded_in_time(
    deferred: int, held: int, since: float, now: float, later: float
) -> None:
    due = flush_due(deferred, held, since, now)
    if deferred == 0:
        assert not due
    elif held == 0 or now >= since + DEFER_AT_MOST:
        assert due
    if due:  # once due, it stays due
        assert flush_due(deferred, held, since, now + later)


@given(
    times,
    times,
    st.integers(0, 4),
    st.none() | st.floats(0, 1e4),
    st.none() | times,
)
def test_the_loop_never_sleeps_past_what_is_due(
    now: float,
    next_beat: float,
    free: int,
    retry: float | None,
    deferred_since: float | None,
) -> None:
    wait = wait_time(now, next_beat, free, retry, deferred_since)
    assert 0.0 <= wait <= max(0.0, next_beat - now)
    if free > 0 and retry is not None:
        assert wait <= retry
    if deferred_since is not None:
        assert now + wait <= max(now, deferred_since + DEFER_AT_MOST) + 1e-9
