"""riverbed.gcpause: the collector is off inside every pause, on again after the last."""

from __future__ import annotations

import gc
import threading

import pytest

from riverbed.gcpause import paused, pausing


@pytest.fixture(autouse=True)
def _collector_on():
    gc.enable()
    yield
    gc.enable()


def test_a_pause_turns_the_collector_off_and_on_again():
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_decorated_function_runs_paused_and_an_error_still_ends_the_pause():
    @pausing
    def inside() -> bool:
        return gc.isenabled()

    @pausing
    def fails() -> None:
        raise ValueError("boom")

    assert inside() is False
    assert gc.isenabled()
    with pytest.raises(ValueError, match="boom"):
        fails()
    assert gc.isenabled()


def test_nested_and_overlapping_pauses_end_with_the_last_one():
    first_in, second_done, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with paused():
            first_in.set()
            second_done.wait(10)
            seen["first, after the other thread's pause ended"] = gc.isenabled()
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with paused():
        with paused():
            pass
        seen["nested, after the inner pause"] = gc.isenabled()
    second_done.set()
    thread.join(10)
    assert first_out.is_set()
    assert seen == {
        "nested, after the inner pause": False,
        "first, after the other thread's pause ended": False,
    }
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()


def test_a_pausing_closure_pickles_as_a_spark_task_is_sent():
    from pyspark import cloudpickle

    @pausing
    def task(x: int) -> tuple[int, bool]:
        return x + 1, gc.isenabled()

    again = cloudpickle.loads(cloudpickle.dumps(task))
    assert again(1) == (2, False)
    assert gc.isenabled()
