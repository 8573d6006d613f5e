"""The periodic maintenance off the batch loop (riverbed.stream.batch.Maintenance): one
round at a time, a round due while one runs is skipped, and wait() joins it."""

from __future__ import annotations

import threading
from typing import Any

from riverbed.stream.batch import Maintenance


def test_one_round_at_a_time_and_a_busy_round_is_skipped() -> None:
    release = threading.Event()
    ran: list[tuple[int, str]] = []

    def run(config: Any, batches: Any, batch_id: int) -> None:
        ran.append((batch_id, threading.current_thread().name))
        release.wait(10)

    m = Maintenance("flags", run)
    assert m.submit(None, None, 9) is True  # type: ignore[arg-type]
    assert m.submit(None, None, 19) is False  # type: ignore[arg-type]
    release.set()
    m.wait()
    assert m.submit(None, None, 29) is True  # type: ignore[arg-type]
    m.wait()
    assert [b for b, _ in ran] == [9, 29]
    assert all(name == "riverbed-maintain-flags" for _, name in ran)
    assert threading.current_thread().name not in {name for _, name in ran}


def test_wait_without_a_round_returns() -> None:
    Maintenance("flags").wait()
