"""Time-range jobs reading a riverbed topic by event time.

The time index is checked as a model (Hypothesis: any disorder, appends in any pieces,
retention) and end to end on Spark: out-of-order and late records, chunked runs equal
to pandas, chunks that read only the runs they need, and bad records or a missing
topic reported in one line.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.log
from riverbed.control import connect
from riverbed.jobs.timerange import (
    BadInputError,
    Cumulative,
    Driver,
    LoadedSpec,
    MissingInputError,
    Rolling,
    Rows,
    SpecError,
    TimeRangeJob,
    TopicInput,
    Tumbling,
)
from riverbed.timerange import topic as topic_module
from riverbed.timerange.oracle import pandas_rows
from riverbed.timerange.topic import PartitionIndex, runs_meeting

START = datetime(2026, 1, 1, tzinfo=UTC)


@given(
    st.lists(st.integers(0, 1000), max_size=80),
    st.lists(st.integers(1, 30), min_size=1, max_size=8),
    st.integers(1, 9),
    st.integers(0, 40),
    st.integers(0, 1000),
    st.integers(0, 400),
)
def test_the_ranges_hold_every_record_in_time_whatever_the_disorder(
    stamps: list[int], pieces: list[int], span: int, retained_from: int, lo: int, width: int
) -> None:
    ts = np.array(stamps, dtype=np.int64)
    index = PartitionIndex(span=span)
    at, k = 0, 0
    while at < len(ts):  # appended (and indexed) in pieces of any size
        n = pieces[k % len(pieces)]
        index.add(at, ts[at : at + n])
        at, k = at + n, k + 1
    first = min(retained_from, len(ts))
    index.forget_before(first)
    hi = lo + width
    ranges = runs_meeting(index, lo, hi)
    covered = {o for s, e in ranges for o in range(s, e)}
    wanted = {o for o in range(first, len(ts)) if lo <= ts[o] < hi}
    assert wanted <= covered
    assert all(o >= first for o in covered)
    assert all(e - s <= span for s, e in zip(index.starts, index.ends, strict=True))
    # adjacent runs are merged: ranges neither touch nor overlap
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))


def produce(log_url: str, topic: str, rows: list[tuple[int, datetime, float | None]]) -> None:
    log = riverbed.log.open(log_url)
    try:
        if topic not in log.topics():
            log.create_topic(topic, partitions=2, serde="json")
        with log.producer(topic) as producer:
            for sensor, ts, value in rows:
                producer.send({"sensor": sensor, "value": value}, key=str(sensor), timestamp=ts)
    finally:
        log.close()


def spec_for(job: TimeRangeJob, out: Path) -> LoadedSpec:
    return LoadedSpec(replace(job, name="t", output=str(out)), Path("t.py"), "test")


def readings(n: int, hours: int, seed: int) -> list[tuple[int, datetime, float | None]]:
    rng = np.random.default_rng(seed)
    return [
        (
            int(rng.integers(0, 4)),
            START + timedelta(seconds=int(rng.integers(0, hours * 3600))),  # any order
            float(rng.integers(0, 80)) / 4,
        )
        for _ in range(n)
    ]


def test_a_topic_in_any_order_gives_what_pandas_gives(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_module, "SPAN", 20)  # many small runs to prune
    log_url = f"file://{tmp_path / 'log'}"
    rows = readings(300, hours=4, seed=1)
    # mostly in time order (as producers write), with a tenth of the records late
    rows.sort(key=lambda r: r[1])
    late = rows[::10]
    rows = [r for i, r in enumerate(rows) if i % 10] + late
    produce(log_url, "readings", rows)
    job = TimeRangeJob(
        input=TopicInput("readings", log=log_url, schema="sensor bigint, value double"),
        key="sensor",
        time="timestamp",
        metrics=[
            Rolling("45min", "value", ["mean", "max", "count"]),
            Rows(3, "value", ["sum"]),
            Cumulative("value", ["sum"]),
        ],
        tumbling=[Tumbling("30min", "value", ["count"])],
        chunk="30m",
    )
    driver = assert_chunks_equal_pandas(spark, job, rows, tmp_path / "out")
    hourly = driver.output.read("windows_30m").to_pandas()
    assert hourly.value_count_30m.sum() == 300

    # a chunk in the middle reads a fraction of the topic, not all of it
    index = topic_module._index(log_url, "readings")
    lo = int((START + timedelta(hours=2)).timestamp() * 1000)
    picked = sum(e - s for _, s, e in index.ranges(lo, lo + 30 * 60_000))
    assert 0 < picked < 300 / 2


def assert_chunks_equal_pandas(
    spark: Any, job: TimeRangeJob, rows: list[tuple[int, datetime, float | None]], out: Path
) -> Driver:
    """Run ``job`` over the first four hours in its chunks; its rows equal pandas' over
    ``rows`` (sensor, event time, value), whatever order they were written in. Returns
    the driver, for its other outputs."""
    spec = spec_for(job, out)
    driver = Driver(spec, connect("memory://"), lambda: spark, ttl=5)
    driver.run("2026-01-01", "2026-01-01T04:00")
    got = driver.output.read("rows").to_pandas()
    frame = pd.DataFrame(rows, columns=["sensor", "timestamp", "value"])
    frame["key"] = frame.sensor.astype(str)
    want = pandas_rows(spec.job, frame)
    order = ["sensor", "timestamp", "value"]
    got = got.sort_values(order).reset_index(drop=True)
    want = want.sort_values(order).reset_index(drop=True)[list(got.columns)]
    assert len(got) == len(rows)
    got["timestamp"] = pd.to_datetime(got.timestamp, utc=True)
    want["timestamp"] = pd.to_datetime(want.timestamp, utc=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    return driver


def test_records_appended_later_are_read_by_the_next_run(spark: Any, tmp_path: Path) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    first = readings(60, hours=2, seed=2)
    produce(log_url, "r", sorted(first, key=lambda r: r[1]))
    job = TimeRangeJob(
        input=TopicInput("r", log=log_url),  # schema inferred from the records
        key="sensor",
        time="timestamp",
        metrics=[Cumulative("value", ["count"])],
        chunk="1h",
    )
    spec = spec_for(job, tmp_path / "out")
    cp = connect("memory://")
    Driver(spec, cp, lambda: spark, ttl=5).run("2026-01-01", "2026-01-01T02:00")
    more = [(s, t + timedelta(hours=2), v) for s, t, v in readings(40, hours=1, seed=3)]
    produce(log_url, "r", more)  # the same process: the index grows, it is not rebuilt
    driver = Driver(spec, cp, lambda: spark, ttl=5)
    driver.run("2026-01-01", "2026-01-01T03:00")
    got = driver.output.read("rows").to_pandas()
    assert len(got) == 100
    last = got.sort_values("timestamp").groupby("sensor").value_cum_count.last()
    want = pd.Series([r[0] for r in first + more]).value_counts().sort_index()
    assert (last.sort_index().to_numpy() == want.to_numpy()).all()


def test_a_bad_record_or_a_missing_topic_is_one_clear_error(spark: Any, tmp_path: Path) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    produce(log_url, "r", [(1, START, 1.0)])
    log = riverbed.log.open(log_url)
    log.producer("r").send({"sensor": "not a number", "value": 2.0}, timestamp=START)
    log.close()
    job = TimeRangeJob(
        input=TopicInput("r", log=log_url, schema="sensor bigint, value double"),
        key="sensor",
        time="timestamp",
        metrics=[Cumulative("value", ["count"])],
        chunk="1h",
    )
    driver = Driver(spec_for(job, tmp_path / "out"), connect("memory://"), lambda: spark, ttl=5)
    with pytest.raises(
        BadInputError, match=r"does not fit its schema \(partition \d, offset \d+\)"
    ):
        driver.run("2026-01-01", "2026-01-01T01:00")

    missing = replace(job, input=TopicInput("nope", log=log_url))
    driver = Driver(spec_for(missing, tmp_path / "o2"), connect("memory://"), lambda: spark, ttl=5)
    with pytest.raises(MissingInputError, match="topic 'nope' does not exist"):
        driver.run("2026-01-01", "2026-01-01T01:00")

    with pytest.raises(SpecError, match="Spark DDL"):
        TopicInput("r", schema="")
