"""A standby's executors are warmed while it waits (riverbed.stream.warmup)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream import warmup
from riverbed.stream.warmup import expected_executors, shortfall, warm_up, warm_up_in_background


@given(cores=st.integers(1, 64), per=st.integers(1, 8))
def test_a_cluster_session_expects_its_cores_over_the_cores_of_an_executor(cores, per):
    conf = {
        "spark.master": "spark://h1:7077",
        "spark.cores.max": str(cores),
        "spark.executor.cores": str(per),
    }
    assert expected_executors(conf) == max(1, cores // per)


def test_a_session_that_does_not_say_expects_nothing_to_wait_for():
    assert expected_executors({"spark.master": "local[2]", "spark.cores.max": "4"}) is None
    assert expected_executors({"spark.master": "spark://h1:7077"}) is None  # no cap
    assert expected_executors({"spark.master": "spark://h1:7077", "spark.cores.max": "x"}) is None
    assert expected_executors({"spark.master": "spark://h", "spark.cores.max": "0"}) is None
    assert expected_executors({}) is None


def test_warming_up_imports_the_task_modules_in_a_task_on_every_core(spark):
    assert warm_up(spark, wait_s=5) == spark.sparkContext.defaultParallelism == 2


@given(expected=st.integers(1, 64), registered=st.integers(0, 64))
def test_a_standby_short_of_executors_says_how_many_came_of_how_many(expected, registered):
    registered = min(registered, expected - 1)
    line = shortfall(registered, expected, 120.0)
    assert "120 s" in line
    assert f"the {expected}" in line
    if registered == 0:
        assert line.startswith("no executor") and "free core" in line
    else:
        assert line.startswith(f"{registered} of the {expected} executors")


def test_a_standby_whose_executors_do_not_come_says_so_and_still_warms_what_runs(
    spark, monkeypatch
):
    # a local session registers no executor besides the driver: asked for three, it
    # waits, says none came, and runs the warm-up tasks in the driver all the same
    monkeypatch.setattr(warmup, "expected_executors", lambda conf: 3)
    said: list[str] = []
    assert warm_up(spark, wait_s=0.5, say=said.append) == 2
    assert said == [shortfall(0, 3, 0.5)]


def test_a_warm_up_that_fails_says_why_instead_of_staying_silent():
    class Stopped:  # what a session whose JVM went away answers
        @property
        def sparkContext(self):
            raise RuntimeError("SparkContext was shut down [stage 3]")

    said: list[str] = []
    warm_up_in_background(Stopped(), said.append).join(10)
    assert said == [
        "warming up the executors failed (SparkContext was shut down [stage 3]): a takeover "
        "starts them itself, slower, not wrong"
    ]


STOPPED = """
import json
from riverbed.config import SparkConfig
from riverbed.spark import lazy, session
from riverbed.stream.warmup import warm_up_in_background
config = SparkConfig(master="local[2]", conf={})
said = {}
# the driver ends (a --once run's end) while its standby's warm-up runs
spark = session(config)
lazy.stop(spark)
said["stopped"] = []
warm_up_in_background(spark, said["stopped"].append).join(60)
# the application ends under it (the JVM's context stops, as its master's removal does)
spark = session(config)
spark.sparkContext._jsc.sc().stop()
said["ended"] = []
warm_up_in_background(spark, said["ended"].append).join(60)
print(json.dumps(said))
"""


@pytest.mark.spark
def test_a_warm_up_ended_by_its_driver_says_nothing_and_by_its_application_says_so(
    subprocess_env,
):
    done = subprocess.run([sys.executable, "-c", STOPPED], env=subprocess_env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["stopped"] == []
    assert said["ended"] == [f"{warmup.ENDED}: a takeover starts a new one (Spark's log says why)"]
