"""The driver's task threads (``riverbed.spark.tasks.in_threads``): results in the
items' order, the same threads from one call to the next (no thread started a batch),
a failure raised only once every item has ended, a pool of each calling thread's own
(two queries' batches do not wait for each other's threads), work that splits again
from inside a task."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.spark.tasks import in_threads


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(), max_size=12), st.integers(1, 6))
def test_results_come_in_the_items_order(items: list[int], threads: int) -> None:
    def work(i: int) -> int:
        time.sleep(0.0005 * (i % 3))  # finished out of order
        return i * 2

    assert in_threads(work, items, threads) == [i * 2 for i in items]


def test_the_same_threads_run_every_call_of_a_thread() -> None:
    def names() -> set[int]:
        return set(in_threads(lambda _: (time.sleep(0.01), threading.get_ident())[1], range(8)))

    first = names()
    assert len(first) > 1 and threading.get_ident() not in first
    seen = set().union(*(names() for _ in range(5)))
    assert seen <= first  # no new thread: the pool is kept
    started = threading.active_count()
    names()
    assert threading.active_count() == started


def test_a_failure_is_raised_once_every_item_has_ended() -> None:
    ended: list[int] = []

    def work(i: int) -> int:
        if i == 1:
            raise ValueError("item 1")
        time.sleep(0.05)
        ended.append(i)
        return i

    with pytest.raises(ValueError, match="item 1"):
        in_threads(work, range(4), 4)
    assert sorted(ended) == [0, 2, 3]  # none still running when the error came


def test_each_calling_thread_has_its_own_pool_and_a_task_may_split_again() -> None:
    gate = threading.Event()
    held: list[list[int]] = []
    other = threading.Thread(
        target=lambda: held.append(in_threads(lambda i: (gate.wait(5), i)[1], range(4), 4))
    )
    other.start()
    try:  # the other thread's items all wait; this thread's run meanwhile
        assert in_threads(lambda i: i + 1, range(4), 4) == [1, 2, 3, 4]
        assert in_threads(lambda i: sum(in_threads(lambda j: j * i, range(3))), range(3)) == [
            0,
            3,
            6,
        ]
    finally:
        gate.set()
        other.join(5)
    assert held == [[0, 1, 2, 3]]
