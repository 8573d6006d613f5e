"""`riverbed stream run` starts Spark when a batch first needs it (riverbed.spark.lazy): a
run whose batches all run in the driver never starts it — here it could not (no Spark
where SPARK_HOME points) and still gives every count — and one whose batches are Spark
jobs starts it from its trigger loop's thread, with the same counts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.stream.conftest import make_events, write_events

pytestmark = pytest.mark.spark

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp",
           "driverBatchRecords": "{in_driver}"}}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={{"users": Distinct("user_id"), "events": Count()}}, state_partitions=3,
)
"""


def _run(
    tmp_path: Path, env: dict[str, str], in_driver: int
) -> tuple[subprocess.CompletedProcess[str], Counter[str]]:
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC.format(in_driver=in_driver))
    run = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once",
         "--max-records-per-batch", "300"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    counts: Counter[str] = Counter()
    if run.returncode == 0:
        query = subprocess.run(
            [sys.executable, "-m", "riverbed.cli.main", "query", "flags", "--json"],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        for line in query.stdout.splitlines():
            row = json.loads(line)
            counts[row["key"]] += row["events"]
    return run, counts


@pytest.mark.parametrize("in_driver", [1000, 0], ids=["batches-in-the-driver", "spark-jobs"])
def test_spark_starts_when_a_batch_needs_it(
    tmp_path: Path, subprocess_env: dict[str, str], in_driver: int
) -> None:
    home = tmp_path / "home"
    events = make_events(900, hours=2)
    write_events(f"file://{home / 'log'}", events, partitions=3)
    want = Counter(events["flag"])
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    if in_driver:
        # no Spark to start: the run must never need it
        env["SPARK_HOME"] = str(tmp_path / "no-spark-here")
    run, counts = _run(tmp_path, env, in_driver)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "backlog: 900 of 900 records (100 %)" in run.stderr
    assert counts == want


def test_a_run_that_needs_spark_where_none_is_says_so(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The check above could fail: the same run with its batches as Spark jobs, where
    no Spark is, stops at its first batch, saying what it could not start."""
    home = tmp_path / "home"
    write_events(f"file://{home / 'log'}", make_events(300, hours=1), partitions=3)
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]",
           "SPARK_HOME": str(tmp_path / "no-spark-here")}  # fmt: skip
    run, _ = _run(tmp_path, env, in_driver=0)
    assert run.returncode == 1
    assert "no-spark-here" in run.stderr and "spark-submit" in run.stderr
    assert "Traceback" not in run.stderr
