"""Starting a query on a busy machine: Spark gives the Python process behind a Python
streaming source 10 s to connect back (hard-coded); a query that dies of that before
its first batch is started again from its checkpoint, and counts every event once."""

from __future__ import annotations

import itertools
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream import Aggregation, Count, Distinct, register
from riverbed.stream.dataframe import (
    START_ATTEMPTS,
    read_results,
    start,
    start_phase,
    transient_start_failure,
)
from riverbed.stream.querystart import start_waits
from riverbed.windows import Tumbling
from tests.stream.conftest import make_events, write_events

# Spark starts the source's Python process as `<python> -m <runner>`; the first such
# start is held 12 s (a Python start-up on a machine too busy to give it any CPU), later
# ones and every other Python worker start at once.
SLOW_PYTHON = """#!/bin/sh
case "$*" in
  *python_streaming_source_runner*)
    if mkdir "{marks}/first" 2>/dev/null; then sleep 12; else mkdir -p "{marks}/later"; fi ;;
esac
exec "{python}" "$@"
"""


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (
            "[STREAM_FAILED] Query terminated with exception: Python worker failed to connect "
            "back. SQLSTATE: XXKST",
            True,
        ),
        (
            "java.net.SocketTimeoutException: Timed out while waiting for the Python worker to "
            "connect back",
            True,
        ),
        (
            "[STREAM_FAILED] ... ValueError: topic 'events' has 3 partitions, the checkpoint 4",
            False,
        ),
        ("Python worker exited unexpectedly (crashed)", False),
        ("", False),
    ],
)
def test_only_a_python_worker_too_slow_to_connect_back_is_retried(
    failure: str, transient: bool
) -> None:
    assert transient_start_failure(failure) is transient


@pytest.mark.parametrize(
    ("active", "message", "phase"),
    [
        (True, "Initializing StreamExecution", "initializing"),
        (True, "Initializing sources", "initializing"),
        (True, "Waiting for data to arrive", "running"),
        (True, "Getting offsets from riverbed", "running"),
        # the moment a start fails, the status says so while the query is still active
        # (stopping its sources): taken for running, a failed start went unretried (CI)
        (True, "Terminated with exception: Python worker failed to connect back.", "ending"),
        (True, "Stopped", "ending"),
        (False, "Initializing sources", "ending"),
        (False, None, "ending"),
    ],
)
def test_a_query_failing_to_start_is_seen_ending_before_it_turns_inactive(
    active: bool, message: str | None, phase: str
) -> None:
    assert start_phase(active, message) == phase


@pytest.mark.spark
def test_a_source_worker_too_slow_to_connect_back_is_started_again(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The session's Python for the riverbed source is a wrapper that holds the first
    start of Spark's streaming-source runner 12 s: the query fails as on a starved host
    and is started again, and counts every event once."""
    from tests.stream.test_engine import oracle, source

    log_url = f"file://{tmp_path / 'log'}"
    events = make_events(3_000, hours=3, seed=5)
    write_events(log_url, events, partitions=3)
    marks = tmp_path / "marks"
    marks.mkdir()
    python = tmp_path / "slow-python"
    python.write_text(SLOW_PYTHON.format(marks=marks, python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    context = spark.sparkContext
    before = context.pythonExec
    context.pythonExec = str(python)  # what register() hands the data source's workers
    try:
        df = source(spark, log_url)
        with caplog.at_level("WARNING", logger="riverbed.stream.querystart"):
            query = start(
                spark, AGGREGATION, df, checkpoint=tmp_path / "ckpt", output=tmp_path / "out",
                log_url=log_url, trigger={"availableNow": True},
            )  # fmt: skip
            query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        context.pythonExec = before
        register(spark)  # the source's workers are plain Python again
    assert (marks / "first").is_dir() and (marks / "later").is_dir()  # held, then again
    assert f"starting it again from its checkpoint (attempt 2 of {START_ATTEMPTS})" in caplog.text
    got = read_results(tmp_path / "out")
    want = oracle(events, Tumbling("1h"))[["window_start", "key", "events", "users"]]
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    assert (merged["users"] == merged["users_oracle"]).all()


AGGREGATION = Aggregation(
    name="startup", key="flag", time="ts", window=Tumbling("1h"), watermark="3h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)  # fmt: skip


@given(
    first=st.floats(0.1, 10, allow_nan=False),
    most=st.floats(10, 60, allow_nan=False),
    patience=st.floats(1, 600, allow_nan=False),
)
def test_the_waits_between_starts_double_up_to_a_cap_and_add_up_to_the_patience(
    first: float, most: float, patience: float
) -> None:
    waits = start_waits(first, most, patience)
    assert sum(waits) == pytest.approx(patience)
    assert all(0 < w <= most for w in waits)
    assert waits[0] == min(first, patience)
    for before, after in itertools.pairwise(waits[:-1]):  # the last one is cut to fit
        assert after == min(before * 2, most)


def test_a_start_is_tried_over_minutes_not_seconds() -> None:
    # five tries 2-8 s apart (20 s) all failed in a one-core run: the default outlasts that
    assert sum(start_waits()) >= 120 and len(start_waits()) + 1 == START_ATTEMPTS
