"""Aggregations over Spark Connect (Spark 4's way to reach a shared Spark): a riverbed
driver that is only a Connect client of a real server (PySpark's own
``SparkConnectServer``) aggregates a riverbed topic through Spark's micro-batch engine —
the source's and ``foreachBatch``'s Python run on the server — with the same results
and exactly-once restarts as a classic session. Each driver is a process of its own
(``connect_driver.py``), as a user's is."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from riverbed.stream.dataframe import read_results
from riverbed.testing.connect import ConnectServer
from riverbed.windows import Tumbling
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import oracle, session_events, session_oracle

# a Spark Connect server (Spark, started by the fixture) and drivers: the scenario group,
# and its hang guard (tests/conftest.py's SCENARIO_HANG_GUARD)
pytestmark = [pytest.mark.spark, pytest.mark.slow]
DRIVER = Path(__file__).with_name("connect_driver.py")
ROOT = Path(__file__).resolve().parents[2]


# The server runs its Python workers with this wrapper around the tests' interpreter:
# while ``armed`` is in its directory, the first start of a foreachBatch worker after it
# is held 12 s — a Python start-up on a machine too busy to give it any CPU, past Spark's
# hard-coded 10 s — and every other start is at once.
HELD_PYTHON = """#!/bin/sh
case "$*" in
  *foreach_batch_worker*)
    if [ -e "{marks}/armed" ] && mkdir "{marks}/held" 2>/dev/null; then sleep 12; fi ;;
esac
exec "{python}" "$@"
"""


@pytest.fixture(scope="module")
def worker_marks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker-marks")


@pytest.fixture(scope="module")
def connect_url(worker_marks: Path) -> Iterator[str]:
    python = worker_marks.parent / f"{worker_marks.name}-python"
    python.write_text(HELD_PYTHON.format(marks=worker_marks, python=sys.executable))
    python.chmod(0o755)
    with ConnectServer(python=str(python)) as server:
        yield server.url


def _equals_oracle(got: pd.DataFrame, events: pd.DataFrame) -> None:
    want = oracle(events, Tumbling("1h"))
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"
    assert (merged["users"] == merged["users_oracle"]).all()
    assert ((merged["total"] - merged["total_oracle"]).abs() < 1e-6).all()


def _drive(
    url: str, log_url: str, root: Path, window: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DRIVER), url, log_url, str(root / "ckpt"), str(root / "out"), window],
        env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def test_an_aggregation_over_spark_connect_equals_the_oracle_across_a_restart(
    connect_url: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    events = make_events(3000, hours=4, seed=21)
    write_events(log_url, events.iloc[:1800], partitions=3)
    first = _drive(connect_url, log_url, tmp_path, "tumbling", subprocess_env)
    assert first.returncode == 0, first.stderr[-3000:]
    write_events(log_url, events.iloc[1800:], partitions=3)  # more, then again
    second = _drive(connect_url, log_url, tmp_path, "tumbling", subprocess_env)
    assert second.returncode == 0, second.stderr[-3000:]
    _equals_oracle(read_results(tmp_path / "out"), events)


def test_a_foreach_batch_worker_too_slow_to_connect_back_is_started_again(
    connect_url: str, worker_marks: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Over Connect the server starts the query's foreachBatch worker when the client
    starts the query, and refuses the start when the worker does not connect back within
    Spark's 10 s: the driver starts the query again (nothing ran), and the results equal
    the oracle."""
    log_url = f"file://{tmp_path / 'log'}"
    events = make_events(1200, hours=3, seed=27)
    write_events(log_url, events, partitions=3)
    (worker_marks / "armed").touch()
    try:
        done = _drive(connect_url, log_url, tmp_path, "tumbling", subprocess_env)
    finally:
        (worker_marks / "armed").unlink()
    assert (worker_marks / "held").is_dir()  # the first start was held past the 10 s
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert "foreachBatch function's Python worker (on the Connect server) did not connect" in said
    assert "starting it again from its checkpoint (attempt 2 of" in said
    _equals_oracle(read_results(tmp_path / "out"), events)


def test_sessions_over_spark_connect_equal_their_definition(
    connect_url: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    events = session_events(1500, seed=62)
    write_events(log_url, events, partitions=3)
    done = _drive(connect_url, log_url, tmp_path, "session", subprocess_env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = read_results(tmp_path / "out").sort_values(["key", "window_start"])
    want = session_oracle(events, pd.Timedelta("5m")).sort_values(["key", "window_start"])
    assert list(got["key"]) == list(want["key"])
    assert list(got["window_start"]) == list(want["window_start"])
    assert list(got["events"]) == list(want["events"])


@pytest.mark.parametrize("path", ["native", "native-shuffled"])
def test_the_log_native_path_over_spark_connect_equals_the_oracle_across_a_restart(
    connect_url: str, tmp_path: Path, subprocess_env: dict[str, str], path: str
) -> None:
    """riverbed's own trigger loop in a Connect client: its co-located and shuffled
    tasks run as DataFrame jobs on the server (riverbed.spark.tasks), batch after batch
    and again after a restart, with the oracle's results."""
    from riverbed.stream.batchlog import open_batches

    log_url = f"file://{tmp_path / 'log'}"
    events = make_events(2400, hours=4, seed=23)
    write_events(log_url, events.iloc[:1500], partitions=3)
    first = _drive(connect_url, log_url, tmp_path, path, subprocess_env)
    assert first.returncode == 0, first.stderr[-3000:]
    write_events(log_url, events.iloc[1500:], partitions=3)
    second = _drive(connect_url, log_url, tmp_path, path, subprocess_env)
    assert second.returncode == 0, second.stderr[-3000:]
    batches = open_batches(str(tmp_path / "ckpt"))
    records = [batches.get(b) for b in batches.ids()]
    assert len(records) >= 6 and all(r.done for r in records)
    assert {r.co_located for r in records} == {path == "native"}
    _equals_oracle(read_results(tmp_path / "out"), events)


def test_the_demo_runs_over_spark_connect(
    connect_url: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`riverbed demo --master sc://…`: its drivers are Connect clients — the first one
    SIGKILLed mid-stream, the second resuming — and the results are identical to the
    independent answer, as on a classic session."""
    done = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "demo", "--events", "40000",
         "--master", connect_url],
        env={**subprocess_env, "RIVERBED_HOME": str(tmp_path / "home")}, cwd=ROOT,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    said = " ".join(done.stdout.split())  # rich wraps lines at the terminal's width
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"drivers use the Spark at {connect_url}" in said
    assert "SIGKILL the driver" in said or "finished before it could be killed" in said
    assert "exact distinct users: IDENTICAL to the independent answer" in said


SHARDS = 5  # each well inside the suite's per-test timeout on a busy 2-core host


@functools.cache
def _engine_test_ids(env: tuple[tuple[str, str], ...]) -> list[str]:
    """The node ids of tests/stream/test_engine.py, as pytest collects them."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/stream/test_engine.py"],
        env=dict(env), cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    ids = [line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    # over Connect no task runs in the driver process: a "colocated-driver" test runs the
    # very Spark jobs its "colocated" twin does (docs/stream.md, "Spark Connect")
    return [i for i in ids if "colocated-driver" not in i]


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_engine_tests_pass_over_spark_connect(
    connect_url: str, subprocess_env: dict[str, str], shard: int
) -> None:
    """tests/stream/test_engine.py — every path (Spark's micro-batches, co-located and
    shuffled log-native batches), restarts, purges, every window kind and metric —
    again with its ``spark`` fixture a Connect client of the server (a process of its
    own: a process is a Connect client or a classic driver); in shards, every test in
    one of them."""
    env = {k: v for k, v in subprocess_env.items() if k != "PYTEST_ADDOPTS"}
    ids = _engine_test_ids(tuple(sorted(env.items())))
    assert len(ids) >= 40  # the whole module was collected
    _pass_over_connect(connect_url, env, ids[shard::SHARDS])


def test_a_rescale_over_spark_connect_moves_the_state_in_spark_tasks(
    connect_url: str, subprocess_env: dict[str, str]
) -> None:
    """The rescale tests that move state as Spark tasks, with their ``spark`` fixture a
    Connect client: the move (riverbed.spark.tasks.shuffle_job over Connect) writes
    what the driver would, and aggregations rescaled 3 → 5 → 2 equal the oracle."""
    env = {k: v for k, v in subprocess_env.items() if k != "PYTEST_ADDOPTS"}
    module = "tests/stream/test_rescale.py"
    _pass_over_connect(
        connect_url,
        env,
        [
            f"{module}::test_the_move_as_spark_tasks_writes_what_the_driver_would",
            f"{module}::test_rescaling_3_to_5_to_2_equals_the_oracle[colocated]",
            f"{module}::test_rescaling_3_to_5_to_2_equals_the_oracle[shuffled]",
        ],
    )


def test_a_join_of_two_dataframes_over_spark_connect_equals_the_batch_join(
    connect_url: str, subprocess_env: dict[str, str]
) -> None:
    """Stream-stream joins on the DataFrame path with their ``spark`` fixture a Connect
    client: the union of both sides is one streaming query on the server, whose
    ``foreachBatch`` (server-side Python) runs the read and pair tasks as DataFrame jobs
    (riverbed.spark.tasks.frame_shuffle) — every joined row once over restarts."""
    env = {k: v for k, v in subprocess_env.items() if k != "PYTEST_ADDOPTS"}
    test = "tests/stream/test_stream_join.py::test_a_join_of_two_dataframes_over_restarts_"
    _pass_over_connect(
        connect_url,
        env,
        [f"{test}equals_the_batch_join[within-left]", f"{test}equals_the_batch_join[window-inner]"],
    )


def _pass_over_connect(url: str, env: dict[str, str], ids: list[str]) -> None:
    """Run the tests ``ids`` in a process of their own whose ``spark`` fixture is a
    Connect client of ``url``; every one of them must pass."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         *ids],
        env={**env, "RIVERBED_TEST_SPARK_REMOTE": url}, cwd=ROOT,
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    tail = done.stdout[-4000:]
    # a server's error is a long Java trace: its causes first, then the run's end
    causes = [line for line in done.stdout.splitlines() if "Caused by:" in line][:10]
    assert done.returncode == 0, "\n".join(causes) + "\n" + tail + done.stderr[-2000:]
    passed = re.search(rf"\b{len(ids)} passed\b", tail)
    assert passed and "failed" not in tail and "skipped" not in tail, tail
