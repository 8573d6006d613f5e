"""The periodic maintenance off the batch loop (riverbed.stream.batch.Maintenance): one
round at a time, a round due while one runs follows it (only the newest such), and
wait() returns once none runs or waits."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.stream.batch import Maintenance


def test_one_round_at_a_time_and_the_newest_round_due_meanwhile_follows() -> None:
    release = threading.Event()
    ran: list[tuple[int, str]] = []

    def run(config: Any, batches: Any, batch_id: int) -> None:
        ran.append((batch_id, threading.current_thread().name))
        release.wait(10)

    m = Maintenance("flags", run)
    assert m.submit(None, None, 9) is True  # type: ignore[arg-type]
    assert m.submit(None, None, 19) is False  # type: ignore[arg-type]
    assert m.submit(None, None, 29) is False  # type: ignore[arg-type]  # replaces 19
    release.set()
    m.wait()
    assert [b for b, _ in ran] == [9, 29]
    assert m.submit(None, None, 39) is True  # type: ignore[arg-type]
    m.wait()
    assert [b for b, _ in ran] == [9, 29, 39]
    assert all(name == "riverbed-maintain-flags" for _, name in ran)
    assert threading.current_thread().name not in {name for _, name in ran}


def test_a_failing_round_does_not_stop_the_next() -> None:
    ran: list[int] = []
    gate = threading.Event()

    def run(config: Any, batches: Any, batch_id: int) -> None:
        ran.append(batch_id)
        gate.wait(10)
        if batch_id == 1:
            raise OSError("bucket gone")

    m = Maintenance("flags", run)
    m.submit(None, None, 1)  # type: ignore[arg-type]
    m.submit(None, None, 3)  # type: ignore[arg-type]
    gate.set()
    m.wait()
    assert ran == [1, 3]
    assert m.submit(None, None, 5) is True  # type: ignore[arg-type]
    m.wait()
    assert ran == [1, 3, 5]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 0.002), min_size=1, max_size=30))
def test_the_last_round_submitted_always_runs_last(pauses: list[float]) -> None:
    """However submissions and rounds interleave, rounds run in order, one at a time,
    and the newest submitted is the last to run before wait() returns."""
    import time

    ran: list[int] = []
    busy = threading.Lock()

    def run(config: Any, batches: Any, batch_id: int) -> None:
        assert busy.acquire(blocking=False), "two rounds at once"
        try:
            ran.append(batch_id)
            time.sleep(0.001)
        finally:
            busy.release()

    m = Maintenance("flags", run)
    for i, pause in enumerate(pauses):
        m.submit(None, None, i)  # type: ignore[arg-type]
        time.sleep(pause)
    m.wait()
    assert ran[-1] == len(pauses) - 1
    assert ran == sorted(ran) and len(set(ran)) == len(ran)


def test_wait_without_a_round_returns() -> None:
    Maintenance("flags").wait()


def test_a_round_of_a_fenced_driver_says_so_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from riverbed.stream.fencing import DriverFencedError

    def run(config: Any, batches: Any, batch_id: int) -> None:
        raise DriverFencedError("flags: a newer driver (term 7) took over")

    m = Maintenance("flags", run)
    with caplog.at_level(logging.INFO, logger="riverbed.stream.batch"):
        m.submit(None, None, 1)  # type: ignore[arg-type]
        m.wait()
    assert "maintenance of flags: a newer driver took over" in caplog.text
    assert not any(r.exc_info for r in caplog.records)
