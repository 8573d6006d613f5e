"""The log-native path: co-location decisions, batch re-runs, task retries after commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import riverbed.log
from riverbed.state import StateConfig
from riverbed.stream import register
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.direct import logged_slices, plan
from riverbed.stream.engine import BatchLog, EngineConfig
from riverbed.stream.job import root_cause
from riverbed.stream.metrics import Count, Distinct
from riverbed.stream.runner import read_results, start
from riverbed.stream.source import SLICES_DDL
from riverbed.stream.windows import Tumbling
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import PATHS, SCHEMA, oracle, run_to_end

pytestmark = pytest.mark.spark


def spec(partitions: int = 3) -> Aggregation:
    return Aggregation(
        name="flags",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="10h",
        metrics={"events": Count(), "users": Distinct("user_id")},
        state_partitions=partitions,
    )


def check(got: pd.DataFrame, events: pd.DataFrame) -> None:
    want = oracle(events, Tumbling("1h"))
    merged = got.merge(want, on=["window_start", "key"], suffixes=("", "_oracle"))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    assert (merged["users"] == merged["users_oracle"]).all()


def test_topic_keyed_by_another_field_is_shuffled(spark: Any, log_url: str, tmp_path: Path) -> None:
    events = make_events(1500, hours=3)
    write_events(log_url, events, partitions=3, key_field="user_id")  # same count, wrong key
    got = run_to_end(spark, spec(3), log_url, tmp_path, "shuffled")
    check(got, events)


def test_slices_from_the_offset_log_cover_the_topic_once(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """Batches after the first take their slices from Spark's offset log: contiguous,
    each batch's input equals its slices, together exactly the topic."""
    events = make_events(2000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    run_to_end(spark, spec(3), log_url, tmp_path, "colocated")
    batches = BatchLog(str(tmp_path / "ckpt"))
    ids = sorted(int(p.stem) for p in batches.dir.glob("*.json"))
    assert len(ids) >= 3 and logged_slices(str(tmp_path / "ckpt"), 0) is None
    previous: dict[int, int] = {}
    for b in ids[1:]:
        slices = logged_slices(str(tmp_path / "ckpt"), b)
        assert slices is not None
        assert batches.get(b)["input"] == sum(s.end - s.start for s in slices)
        if previous:
            assert all(s.start == previous[s.partition] for s in slices)
        previous = {s.partition: s.end for s in slices}
    assert sum(batches.get(b)["input"] for b in ids) == 2000
    assert previous == {p.partition: p.end for p in riverbed.log.open(log_url).offsets("events")}


def test_co_locate_true_on_a_wrongly_keyed_topic_fails_with_the_fix(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    write_events(log_url, make_events(300, hours=1), partitions=3, key_field="user_id")
    options = {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": "true"}
    query = start(
        spark,
        spec(3),
        options,
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        trigger={"availableNow": True},
    )
    with pytest.raises(Exception) as failure:
        query.awaitTermination(300)
    # what `riverbed stream run` prints: the root cause, not the nested tracebacks
    error = root_cause(failure.value)
    assert error.startswith("NotCoLocatedError: topic 'events' partition")
    assert "not keyed by 'flag'" in error and 'co_locate="false"' in error


def test_bad_source_options_are_named(spark: Any, log_url: str, tmp_path: Path) -> None:
    write_events(log_url, make_events(10, hours=1), partitions=3, key_field="flag")
    config = EngineConfig(
        spec(3),
        StateConfig(local_dir=tmp_path / "l", durable=tmp_path / "d"),
        str(tmp_path / "c"),
        str(tmp_path / "o"),
    )
    with pytest.raises(ValueError, match="topic 'nope' does not exist"):
        plan(spark, config, {"topic": "nope", "log": log_url})
    with pytest.raises(ValueError, match=r"reads column\(s\) \['flag', 'ts'\]"):
        plan(spark, config, {"topic": "events", "log": log_url, "schema": "user_id long"})
    with pytest.raises(ValueError, match="co_locate must be"):
        plan(spark, config, {"topic": "events", "log": log_url, "co_locate": "maybe"})
    with pytest.raises(ValueError, match="co_locate=true needs"):
        plan(
            spark,
            EngineConfig(spec(2), config.state, config.checkpoint, config.output),
            {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": "true"},
        )


@pytest.mark.parametrize("co_locate", ["auto", "false"])
def test_rerunning_a_batch_never_double_counts(
    spark: Any, log_url: str, tmp_path: Path, co_locate: str
) -> None:
    events = make_events(1000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    config = EngineConfig(
        spec(3),
        StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable"),
        str(tmp_path / "ckpt"),
        str(tmp_path / "out"),
    )
    options = {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": co_locate}
    _, run = plan(spark, config, options)
    ends = riverbed.log.open(log_url).offsets("events")
    half = [(p.partition, 0, p.end // 2) for p in ends]
    rest = [(p.partition, p.end // 2, p.end) for p in ends]
    run(spark.createDataFrame(half, SLICES_DDL), 0)
    run(spark.createDataFrame(rest, SLICES_DDL), 1)
    once = read_results(tmp_path / "out")
    run(spark.createDataFrame(rest, SLICES_DDL), 1)  # the same batch again
    run(spark.createDataFrame(rest, SLICES_DDL), 1)
    twice = read_results(tmp_path / "out")
    pd.testing.assert_frame_equal(once, twice)
    check(once, events)
    assert BatchLog(str(tmp_path / "ckpt")).get(1)["co_located"] is (co_locate == "auto")


@pytest.mark.parametrize("path", PATHS)
def test_task_failing_after_its_state_commit_is_retried_without_double_counting(
    spark: Any, log_url: str, tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In every batch a state task dies once right after committing; Spark retries it
    (the test session allows 2 attempts per task) and the retry re-commits the same
    version."""
    assert spark.sparkContext.master == "local[2,2]"
    events = make_events(1500, hours=4)
    write_events(log_url, events, partitions=3, key_field="flag")
    faults = tmp_path / "faults"
    monkeypatch.setenv("RIVERBED_FAULT", f"after_commit:{faults}")
    register(spark)
    got = run_to_end(spark, spec(3), log_url, tmp_path, path)
    check(got, events)
    batches = BatchLog(str(tmp_path / "ckpt"))
    n_batches = len(list(batches.dir.glob("*.json")))
    assert n_batches >= 3
    assert len(list(faults.iterdir())) == n_batches  # one injected failure per batch


def test_a_first_offset_entry_left_unfinished_by_a_killed_driver_does_not_block_the_restart(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """A driver SIGKILLed while Spark wrote its first offset-log entry leaves the
    entry's temporary file; Spark alone then refuses the checkpoint forever ("should be
    empty on batch 0"). The restart removes it and runs from the start."""
    events = make_events(500, hours=2)
    write_events(log_url, events, partitions=3)
    offsets = tmp_path / "ckpt" / "spark" / "offsets"
    offsets.mkdir(parents=True)
    unfinished = offsets / ".0.5d3c2a6e-0f41-4c1b-9f0e-2b8d3e1c7a90.tmp"
    unfinished.write_text('v1\n{"batchWatermarkMs":0')
    got = run_to_end(spark, spec(3), log_url, tmp_path, "colocated")
    check(got, events)
    assert not unfinished.exists() and (offsets / "0").exists()
