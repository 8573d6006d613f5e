"""The log-native path: co-location decisions, batch re-runs, task retries after commit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.log
from riverbed.state import StateConfig
from riverbed.state.provider import PRIVATE
from riverbed.stream import register
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batchlog import next_record, open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.engine import EngineConfig
from riverbed.stream.lognative import in_driver, run_planned, task_attempts
from riverbed.stream.metrics import Count, Distinct
from riverbed.stream.nativeconfig import prepare
from riverbed.stream.specjob import root_cause
from riverbed.windows import Tumbling
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


def engine_config(tmp_path: Path, partitions: int = 3) -> EngineConfig:
    """State, checkpoint and output under ``tmp_path``."""
    return EngineConfig(
        spec(partitions),
        StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable"),
        str(tmp_path / "ckpt"),
        str(tmp_path / "out"),
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


def test_the_recorded_plans_cover_the_topic_once(spark: Any, log_url: str, tmp_path: Path) -> None:
    """Every batch records its slices before it runs: contiguous from batch to batch,
    each batch's input equals its slices, together exactly the topic; no Spark
    streaming checkpoint is written."""
    events = make_events(2000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    run_to_end(spark, spec(3), log_url, tmp_path, "colocated")
    batches = open_batches(str(tmp_path / "ckpt"))
    ids = batches.ids()
    assert len(ids) >= 3 and ids == list(range(len(ids)))
    previous = {p: 0 for p in range(3)}
    for b in ids:
        record = batches.get(b)
        slices = {int(p): se for p, se in record.slices.items()}
        assert record.done and record.input == sum(e - s for s, e in slices.values())
        assert {p: s for p, (s, _) in slices.items()} == previous
        previous = {p: e for p, (_, e) in slices.items()}
    assert sum(batches.get(b).input for b in ids) == 2000
    assert previous == {p.partition: p.end for p in riverbed.log.open(log_url).offsets("events")}
    assert not (tmp_path / "ckpt" / "spark").exists()


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
        prepare(config, {"topic": "nope", "log": log_url})
    with pytest.raises(ValueError, match=r"reads column\(s\) \['flag', 'ts'\]"):
        prepare(config, {"topic": "events", "log": log_url, "schema": "user_id long"})
    with pytest.raises(ValueError, match="co_locate must be"):
        prepare(config, {"topic": "events", "log": log_url, "co_locate": "maybe"})
    with pytest.raises(ValueError, match="steal must be true or false, not 'sometimes'"):
        prepare(config, {"topic": "events", "log": log_url, "steal": "sometimes"})
    with pytest.raises(ValueError, match="co_locate=true needs"):
        prepare(
            EngineConfig(spec(2), config.state, config.checkpoint, config.output),
            {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": "true"},
        )


@pytest.mark.parametrize("co_locate", ["auto", "false"])
def test_rerunning_a_batch_never_double_counts(
    spark: Any, log_url: str, tmp_path: Path, co_locate: str
) -> None:
    events = make_events(1000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    config = engine_config(tmp_path)
    options = {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": co_locate}
    cfg = prepare(config, options)
    batches = open_batches(config.checkpoint)
    ends = riverbed.log.open(log_url).offsets("events")
    half = {str(p.partition): [0, p.end // 2] for p in ends}
    rest = {str(p.partition): [p.end // 2, p.end] for p in ends}

    def run(slices: dict[str, list[int]], batch_id: int) -> None:
        """What the loop does: the plan recorded first, then the batch."""
        record = batches.get(batch_id)
        if record is None:
            record = replace(
                next_record(batches, batch_id, config.spec.watermark_ms),
                slices=slices,
                co_located=cfg.co_located,
            )
            batches.put(batch_id, record)
        run_planned(spark, cfg, batches, batch_id, replace(record, done=False))

    run(half, 0)
    run(rest, 1)
    once = read_results(tmp_path / "out")
    run(rest, 1)  # the same batch again
    run(rest, 1)
    twice = read_results(tmp_path / "out")
    pd.testing.assert_frame_equal(once, twice)
    check(once, events)
    assert open_batches(str(tmp_path / "ckpt")).get(1).co_located is (co_locate == "auto")


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
    batches = open_batches(str(tmp_path / "ckpt"))
    n_batches = len(batches.ids())
    assert n_batches >= 3
    assert len(list(faults.iterdir())) == n_batches  # one injected failure per batch


def test_a_first_offset_entry_left_unfinished_by_a_killed_driver_does_not_block_the_restart(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """A driver SIGKILLed while Spark wrote its first offset-log entry leaves the
    entry's temporary file; Spark alone then refuses the checkpoint forever ("should be
    empty on batch 0"). The restart removes it and runs from the start. (The DataFrame
    path: the log-native path's loop keeps no Spark checkpoint.)"""
    events = make_events(500, hours=2)
    write_events(log_url, events, partitions=3)
    offsets = tmp_path / "ckpt" / "spark" / "offsets"
    offsets.mkdir(parents=True)
    unfinished = offsets / ".0.5d3c2a6e-0f41-4c1b-9f0e-2b8d3e1c7a90.tmp"
    unfinished.write_text('v1\n{"batchWatermarkMs":0')
    got = run_to_end(spark, spec(3), log_url, tmp_path, "spark")
    check(got, events)
    assert not unfinished.exists() and (offsets / "0").exists()


@pytest.mark.parametrize(
    ("master", "attempts"),
    [("local", 1), ("local[2]", 1), ("local[*]", 1), ("local[2,2]", 2), ("local[*, 4]", 4)],
)
def test_a_task_in_the_driver_gets_the_attempts_spark_would_give_it(
    master: str, attempts: int
) -> None:
    assert task_attempts(master) == attempts


@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_only_small_batches_of_a_local_master_run_in_the_driver(records: int, limit: int) -> None:
    small = limit > 0 and records <= limit  # a batch with no input too (0: never)
    assert in_driver(records, limit, "local[2]") is small
    assert in_driver(records, limit, "local") is small
    for elsewhere in ("spark://h1:7077", "local-cluster[2,1,1024]", "yarn"):
        assert in_driver(records, limit, elsewhere) is False


def test_partitions_kept_open_by_driver_batches_are_let_go_for_a_spark_job(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """Small batches run in the driver keep their state partitions open between them
    (riverbed.state.openpool); a big batch of the same query runs as a Spark job, whose
    tasks (other processes) can open them only because the driver let them go first —
    kept, they would wait out the lock and fail the query. Exact either way."""
    import time

    small = make_events(400, hours=2, seed=3)
    write_events(log_url, small, partitions=3, key_field="flag")
    options = {"topic": "events", "log": log_url, "schema": SCHEMA}
    options |= {"maxRecordsPerBatch": "5000", "driverBatchRecords": "600"}
    cfg = StateConfig(local_dir=tmp_path / "state", durable=f"file://{tmp_path / 'durable'}")
    query = start(
        spark,
        spec(3),
        options,
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        trigger={"processingTime": "0 seconds"},
        state=replace(cfg, lock_timeout=5.0),
    )
    try:
        query.processAllAvailable()  # the backlog: one batch of 400, in the driver
        big = make_events(3000, hours=2, seed=4)
        big["ts"] = big["ts"] + pd.Timedelta(minutes=30)
        write_events(log_url, big, partitions=3, key_field="flag")
        deadline = time.monotonic() + 120
        while sum(p["numInputRows"] for p in query.recentProgress) < 3400:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the big batch did not finish"
            time.sleep(0.2)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes[0] <= 600 and max(sizes) > 600, sizes  # both kinds ran
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(f"riverbed-flags-{query.id}")
    assert jobs, "no batch ran as a Spark job"
    # the tasks had the partitions themselves: none waited for the driver and then
    # worked on a private copy
    assert not (tmp_path / "state" / PRIVATE).exists()
    check(read_results(tmp_path / "out"), pd.concat([small, big], ignore_index=True))


def test_small_batches_run_in_the_driver_and_big_ones_as_a_spark_job(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """The same batches, exact either way; in the driver no Spark job is launched —
    co-located, or shuffled (the partials routed to the state partitions by the
    driver's threads; by default up to 100,000 records a batch)."""
    events = make_events(1500, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    tracker = spark.sparkContext.statusTracker()
    cases = [("100000", "auto", False), ("0", "auto", True), (None, "false", False),
             ("0", "false", True)]  # fmt: skip
    for limit, co_locate, as_jobs in cases:
        options = {"topic": "events", "log": log_url, "schema": SCHEMA, "co_locate": co_locate}
        options |= {"maxRecordsPerBatch": "500"}
        if limit is not None:
            options["driverBatchRecords"] = limit
        root = tmp_path / f"{limit}-{co_locate}"
        query = start(
            spark,
            spec(3),
            options,
            checkpoint=root / "ckpt",
            output=root / "out",
            trigger={"availableNow": True},
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        check(read_results(root / "out"), events)
        jobs = tracker.getJobIdsForGroup(f"riverbed-flags-{query.id}")  # the loop's group
        assert (len(jobs) >= 3) is as_jobs, (limit, jobs)  # 3 batches: a job each, or none
        plans = {r.co_located for b in open_batches(str(root / "ckpt")).ids()
                 if (r := open_batches(str(root / "ckpt")).get(b)) is not None}  # fmt: skip
        assert plans == {co_locate == "auto"}


def test_decimal_metric_columns_become_the_nearest_doubles() -> None:
    """As Spark's BigDecimal.doubleValue and Python's float(Decimal) give them (Arrow's
    own decimal-to-double cast is 1 ulp off for about one value in seven)."""
    from decimal import Decimal

    import pyarrow as pa

    from riverbed.stream.lognative import decimal_doubles

    values = [Decimal(p) * Decimal("0.908") for p in range(1, 20_000, 7)] + [None]
    got = decimal_doubles(pa.array(values, pa.decimal128(24, 3))).to_pylist()
    assert got == [None if v is None else float(v) for v in values]
