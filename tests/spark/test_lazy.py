"""A deferred session (riverbed.spark.lazy) answers what riverbed asks without a job from
its configuration, as the started session would, and starts Spark when a job needs it —
with the job group its thread asked for before, so the job can be interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from riverbed.config import SparkConfig
from riverbed.errors import InvalidValueError
from riverbed.spark import tasks
from riverbed.spark.lazy import DeferredSession, deferred, local_parallelism, unstarted


@pytest.mark.parametrize(
    ("master", "conf", "want"),
    [
        ("local", {}, 1),
        ("local[3]", {}, 3),
        ("local[*]", {}, 8),
        ("local[2,4]", {}, 2),
        ("local[*, 3]", {}, 8),
        ("local[3]", {"spark.default.parallelism": "5"}, 5),
    ],
)
def test_the_parallelism_of_a_local_master(master: str, conf: dict[str, str], want: int) -> None:
    assert local_parallelism(master, conf, cores=8) == want


def test_what_is_not_a_local_master_or_a_count_is_named() -> None:
    with pytest.raises(InvalidValueError, match="not a local master"):
        local_parallelism("spark://h:7077", {}, cores=2)
    with pytest.raises(InvalidValueError, match=r"spark\.default\.parallelism is 'two'"):
        local_parallelism("local[2]", {"spark.default.parallelism": "two"}, cores=2)


def test_an_unstarted_session_answers_from_its_configuration_and_stops_as_nothing() -> None:
    lazy = deferred(SparkConfig(master="local[3]"))
    assert isinstance(lazy, DeferredSession) and unstarted(lazy)
    assert tasks.master(lazy) == "local[3]" and tasks.parallelism(lazy) == 3
    tasks.tag(lazy, "g", "a group")
    tasks.describe(lazy, "a batch")
    tasks.interrupt(lazy, "g")
    lazy.stop()
    assert unstarted(lazy)
    assert "not started" in repr(lazy)


PROBE = """
import json
from riverbed.config import SparkConfig
from riverbed.spark import session
from riverbed.spark.lazy import DeferredSession, ended, local_parallelism, revived
got = []
for master, conf in [("local", {}), ("local[3]", {}), ("local[*]", {}), ("local[2,4]", {}),
                     ("local[3]", {"spark.default.parallelism": "5"})]:
    config = SparkConfig(master=master, conf=conf)
    s = session(config)
    got.append([master, conf, s.sparkContext.defaultParallelism,
                local_parallelism(master, config.conf, s.sparkContext._jvm.java.lang.Runtime
                                  .getRuntime().availableProcessors())])
    s.stop()
# a context that stops under its session, as the JVM's does when a cluster's master
# removes the application: ended, and revived as a new session that runs jobs
config = SparkConfig(master="local[2]", conf={})
s = session(config)
alive = [ended(s), s.range(3).count()]
s.sparkContext._jsc.sc().stop()
new = revived(s, config)
after = [ended(s), type(new) is DeferredSession, new.range(5).count(), ended(new),
         revived(new, config) is new]
print(json.dumps({"parallelism": got, "alive": alive, "after": after}))
"""


@pytest.mark.spark
def test_the_parallelism_equals_what_spark_gives(subprocess_env: dict[str, str]) -> None:
    """Five sessions, one after another, in a process of their own (one per process);
    then one whose context stops under it is :func:`ended`, and :func:`revived` as a
    new session that runs jobs (what a standby does whose application its master
    removed while it waited)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=subprocess_env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    for master, conf, spark_says, mine in said["parallelism"]:
        assert mine == spark_says, (master, conf)
    assert said["alive"] == [False, 3]
    assert said["after"] == [True, True, 5, False, True]


@pytest.mark.spark
def test_a_job_started_by_a_deferred_session_is_in_its_threads_group(spark: Any) -> None:
    """The thread tags its jobs before Spark starts; its first job starts it (here: the
    worker's running session, which getOrCreate returns) and is in that group, so
    interrupting the group cancels it."""
    lazy = DeferredSession(SparkConfig(master="local[2]"))
    outcome: dict[str, Any] = {}
    tagged = threading.Event()

    def batch() -> None:
        tasks.tag(lazy, "riverbed-test-deferred", "a deferred batch")
        tasks.describe(lazy, "the deferred batch 7")
        tagged.set()
        try:
            outcome["result"] = tasks.map_items(lazy, list(range(2)), _slow)
        except Exception as exc:  # the cancelled job
            outcome["error"] = exc

    thread = threading.Thread(target=batch)
    thread.start()
    tagged.wait(10)
    deadline = time.monotonic() + 120
    while not _running(spark, "riverbed-test-deferred"):
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.1)
    assert lazy.started
    assert tasks.master(lazy) == spark.sparkContext.master  # the started session's now
    tasks.interrupt(lazy, "riverbed-test-deferred")
    thread.join(60)
    assert not thread.is_alive()
    assert "result" not in outcome and "cancel" in str(outcome.get("error", "")).lower()


def _slow(item: int) -> int:
    time.sleep(60)
    return item


def _running(spark: Any, group: str) -> bool:
    tracker = spark.sparkContext.statusTracker()
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        if info is not None and info.status == "RUNNING":
            return True
    return False
