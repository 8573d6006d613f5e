"""Starting a query on a busy machine: Spark gives the Python process behind a Python
streaming source 10 s to connect back (hard-coded); a query that dies of that before
its first batch is started again from its checkpoint, and counts every event once."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from riverbed.stream.dataframe import START_ATTEMPTS, read_results, transient_start_failure
from riverbed.stream.windows import Tumbling
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import oracle
from tests.stream.test_startup_kills import DATAFRAME_DRIVER, SPEC

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


@pytest.mark.spark
def test_a_source_worker_too_slow_to_connect_back_is_started_again(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    events = make_events(3_000, hours=3, seed=5)
    write_events(f"file://{home / 'log'}", events, partitions=3)
    (tmp_path / "spec.py").write_text(SPEC)
    driver = tmp_path / "driver.py"
    driver.write_text(DATAFRAME_DRIVER)
    marks = tmp_path / "marks"
    marks.mkdir()
    python = tmp_path / "slow-python"
    python.write_text(SLOW_PYTHON.format(marks=marks, python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = {**subprocess_env, "PYSPARK_PYTHON": str(python)}

    run = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "spec.py"), str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert (marks / "first").is_dir() and (marks / "later").is_dir()  # held, then again
    assert f"starting it again from its checkpoint (attempt 2 of {START_ATTEMPTS})" in out
    got = read_results(home / "out")
    want = oracle(events, Tumbling("1h"))[["window_start", "key", "events", "users"]]
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    assert (merged["users"] == merged["users_oracle"]).all()
