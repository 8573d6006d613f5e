"""The cluster demo's waits: a job of many chunks is waited for while it makes
progress, however slowly, and a stall still ends the wait."""

from __future__ import annotations

import time

import pytest

from riverbed.demo.cluster_jobs import wait_for_progress


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
