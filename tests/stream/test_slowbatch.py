"""A slow batch says what it waits on while it waits (riverbed.stream.slowbatch)."""

from __future__ import annotations

import logging
import sys
import time

from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream.slowbatch import SlowBatchWatch, StageProgress, innermost, slow_line

stages = st.lists(
    st.builds(
        StageProgress,
        stage=st.integers(0, 10_000),
        tasks=st.integers(1, 500),
        done=st.integers(0, 500),
        active=st.integers(0, 500),
        failed=st.integers(0, 500),
    ),
    max_size=5,
    unique_by=lambda s: s.stage,
)


@given(
    batch_id=st.integers(0, 10**9),
    elapsed=st.floats(0, 10**6),
    where=st.none() | st.text(min_size=1, max_size=30),
    stages=stages,
    hosts=st.dictionaries(st.sampled_from(["h1", "h2", "h3"]), st.integers(0, 8)),
)
def test_the_line_names_the_batch_and_what_runs(batch_id, elapsed, where, stages, hosts):
    line = slow_line("clicks", batch_id, elapsed, where, stages, hosts)
    assert line.startswith(f"batch {batch_id} of clicks has run for {elapsed:.0f} s")
    assert (f"in {where}" in line) == bool(where)
    if not stages:
        assert "no Spark job of it running" in line
        assert "tasks running on" not in line
        return
    by_stage = sorted(stages, key=lambda s: s.stage)
    positions = [line.index(f"stage {s.stage}: ") for s in by_stage]
    assert positions == sorted(positions)  # in stage order
    for s in stages:
        assert f"stage {s.stage}: {s.done} of {s.tasks} tasks done" in line
        assert (f"{s.active} running" if s.active else "none running") in line
        assert (f"{s.failed} failed" in line) or not s.failed
    for host, n in hosts.items():
        assert (f"{host} ({n})" in line) == (n > 0)


def _in_riverbed(source: str, **names: object) -> dict[str, object]:
    """Functions defined as if in a riverbed module (innermost looks for those)."""
    ns: dict[str, object] = {"__name__": "riverbed.fake", **names}
    exec(source, ns)
    return ns


def test_innermost_names_the_innermost_riverbed_call():
    ns = _in_riverbed(
        "def outer():\n    return inner()\n\ndef inner():\n    return here(sys._getframe())\n",
        sys=sys,
        here=innermost,
    )
    assert ns["outer"]() == "riverbed.fake.inner:5"
    assert innermost(sys._getframe()) is None  # no riverbed frame in the test's stack


def test_a_slow_batch_is_reported_while_it_runs_and_a_quick_one_never(spark, caplog):
    group = "riverbed-sleepy-test"
    sc = spark.sparkContext
    watch = SlowBatchWatch(spark, "sleepy", group, after_s=1.5, every_s=1.5)

    def job(seconds: float) -> list[int]:
        """Two tasks: one of ``seconds / 5``, one of ``seconds``."""
        sc.setJobGroup(group, "sleepy")
        naps = [seconds / 5, seconds]
        return sc.parallelize(range(2), 2).map(lambda x: time.sleep(naps[x]) or x).collect()

    ns = _in_riverbed("def run_batch(job, s):\n    return job(s)\n")
    caplog.set_level(logging.WARNING, logger="riverbed.stream.slowbatch")
    assert job(0.0) == [0, 1]  # Spark's Python workers started: not part of a batch
    try:
        with watch.batch(4):
            time.sleep(0.5)
        assert not caplog.records  # done before after_s: nothing said
        began = time.monotonic()
        with watch.batch(5):
            assert ns["run_batch"](job, 6.0) == [0, 1]
        elapsed = time.monotonic() - began
    finally:
        watch.close()
    lines = [r.getMessage() for r in caplog.records]
    assert 2 <= len(lines) <= elapsed / 1.5 + 1, lines
    first = lines[0]
    assert first.startswith("batch 5 of sleepy has run for "), first
    assert "in riverbed.fake.run_batch:2" in first
    # while the job runs each line shows it; one between its end and the batch's end
    # (the loop writing outputs) says there is none
    with_job = [line for line in lines if "Spark job: stage " in line]
    assert with_job and all("of 2 tasks done" in line for line in with_job), lines
    assert all(line in with_job or "no Spark job of it running" in line for line in lines)
    # Spark's status store catches up on events (here: the short task's end)
    assert any("1 of 2 tasks done, 1 running" in ln and "tasks running on " in ln for ln in lines)
    time.sleep(1.5)
    assert len(caplog.records) == len(lines)  # nothing after the batch ended
    assert not watch._thread.is_alive()
