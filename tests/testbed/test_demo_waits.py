"""The cluster demo's waits: a job of many chunks is waited for while it makes
progress, however slowly, and a stall still ends the wait."""

from __future__ import annotations

import time

import pytest

from riverbed.demo.cluster_jobs import wait_for_progress, wait_while_moving


def _counter(step_s: float, stop_at: int) -> object:
    began = time.monotonic()
    return lambda: min(int((time.monotonic() - began) / step_s), stop_at)


def test_a_slow_job_that_keeps_progressing_is_waited_for_past_the_stall_limit() -> None:
    began = time.monotonic()
    wait_for_progress("the job", _counter(0.5, 6), 6, stalled=1.5)
    assert time.monotonic() - began >= 2.9  # twice the stall limit, and it waited


def test_a_job_that_stops_progressing_ends_the_wait_with_where_it_stood() -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the job did not happen: 2 of 6 after 1s"):
        wait_for_progress("the job", _counter(0.3, 2), 6, stalled=1.0)
    assert time.monotonic() - began < 10


def test_any_answer_that_changes_is_progress_and_the_check_s_answer_is_returned() -> None:
    """The run's chunks' states, or where a stream's batches ended: each change restarts
    the stall clock, and the wait gives back what the check found."""
    count = _counter(0.4, 5)
    states = lambda: ["DONE"] * count() + ["RUNNING"] * (5 - count())  # noqa: E731
    began = time.monotonic()
    got = wait_while_moving("the run to end", lambda: count() == 5 and "SUCCEEDED", states, 1.0)
    assert got == "SUCCEEDED" and time.monotonic() - began >= 1.9
    with pytest.raises(TimeoutError, match=r"the run to end did not happen: \['DONE'"):
        wait_while_moving("the run to end", lambda: False, lambda: ["DONE", "RUNNING"], 0.5)
