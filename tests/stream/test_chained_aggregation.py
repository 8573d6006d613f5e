"""An aggregation over another aggregation's final rows, in one driver
(stream/chained.py): Nexmark q5's shape — events per user and hopping window, then per
window start the largest count and what was spent — over a backlog read in several
starts, in the driver's threads and as Spark jobs; the results equal pandas' two
group-bys of the events."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from riverbed.stream import Aggregation, Chained, Count, Hopping, Max, Sum, Tumbling
from riverbed.stream.batchlog import open_batches
from riverbed.stream.chain import upstream_range
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.doors import Topic
from riverbed.stream.errors import StreamValueError
from tests.stream.conftest import T0, make_events, write_events

pytestmark = pytest.mark.spark

HOUR, HOP = pd.Timedelta("1h"), pd.Timedelta("20min")


def per_user(**changes: Any) -> Aggregation:
    spec = Aggregation(
        name="per_user", key="user_id", time="ts", window=Hopping("1h", "20m"),
        watermark="30m", output="final", state_partitions=3,
        metrics={"n": Count(), "spent": Sum("amount")},
    )  # fmt: skip
    return spec if not changes else Aggregation(**{**spec.__dict__, **changes})


def busiest() -> Aggregation:
    """Per 20 minutes of the windows' starts: the largest count of a user's events in
    one window, what was spent in them all, and how many (user, window) rows."""
    return Aggregation(
        name="busiest", key="all", time="window_start", window=Tumbling("20m"),
        watermark="0s", columns={"all": "'all'"}, state_partitions=2,
        metrics={"top": Max("n"), "spent": Sum("spent"), "rows": Count()},
    )  # fmt: skip


def drain(spark: Any, tmp_path: Path, log_url: str, jobs: dict[str, str]) -> Any:
    source = Topic("events", options={"schema": SCHEMA, **jobs})
    query = start(
        spark, busiest(), Chained(per_user(), source), checkpoint=tmp_path / "cp",
        output=tmp_path / "out", log_url=log_url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return query


SCHEMA = "user_id long, flag string, amount double, ts timestamp"


def windows_closed(events: pd.DataFrame, watermark: pd.Timestamp) -> pd.DataFrame:
    """The upstream's oracle: per (hopping window, user), the windows ``watermark``
    closed (end at or before it)."""
    frames = []
    for back in range(3):  # an event is in the three windows starting up to 40 min before
        start_ = events["ts"].dt.floor("20min") - back * HOP
        frames.append(events.assign(window_start=start_))
    rows = pd.concat(frames)
    rows = rows[rows["window_start"] + HOUR <= watermark]
    return rows.groupby(["window_start", "user_id"]).agg(n=("ts", "size"), spent=("amount", "sum"))


def expected(events: pd.DataFrame, watermark: pd.Timestamp) -> pd.DataFrame:
    up = windows_closed(events, watermark).reset_index()
    up = up.assign(window_start=up["window_start"].dt.floor("20min"))
    out = up.groupby("window_start").agg(
        top=("n", "max"), spent=("spent", "sum"), rows=("user_id", "size")
    )
    return out.reset_index()


@pytest.mark.parametrize("in_driver", [True, False])
def test_an_aggregation_over_an_aggregations_rows_in_one_driver_equals_two_group_bys(
    spark: Any, tmp_path: Path, log_url: str, in_driver: bool
) -> None:
    jobs = {"maxRecordsPerBatch": "150"} | ({} if in_driver else {"driverBatchRecords": "0"})
    events = make_events(900, hours=6, seed=3)
    for a, b in itertools.pairwise([0, 300, 600, 900]):  # a backlog, a start for each
        write_events(log_url, events.iloc[a:b], key_field="user_id")
        query = drain(spark, tmp_path, log_url, jobs)
        ran = len(spark.sparkContext.statusTracker().getJobIdsForGroup(query._group))
        assert (ran == 0) == in_driver
    # a far-later event: every window of the events before it closes upstream
    far = pd.DataFrame(
        {"user_id": [7], "flag": ["f0"], "amount": [1.0], "ts": [T0 + pd.Timedelta("3d")]}
    )
    write_events(log_url, far, key_field="user_id")
    drain(spark, tmp_path, log_url, jobs)

    got = read_results(tmp_path / "out").sort_values("window_start").reset_index(drop=True)
    want = expected(events, far["ts"].iloc[0] - pd.Timedelta("30m"))
    assert got["window_start"].tolist() == want["window_start"].tolist()
    assert got["top"].tolist() == want["top"].tolist()
    assert got["rows"].tolist() == want["rows"].tolist()
    np.testing.assert_allclose(got["spent"].astype(float), want["spent"].astype(float))
    # the upstream's result table holds its closed windows, each once
    upstream = read_results(tmp_path / "cp" / "upstream-results")
    assert len(upstream) == int(want["rows"].sum())
    # the downstream's batches read every finished upstream batch once, in order
    batches = open_batches(tmp_path / "cp")
    ranges = [upstream_range(batches.get(i)) for i in batches.ids()]
    assert all(r is not None and r[0] == "upstream" and r[2] >= r[1] for r in ranges)
    assert [r[1] for r in ranges[1:]] == [r[2] for r in ranges[:-1]]  # type: ignore[index]
    heads = open_batches(tmp_path / "cp" / "upstream")
    assert ranges[-1][2] == heads.ids()[-1] + 1  # type: ignore[index]
    newest = batches.get(batches.ids()[-1])
    assert newest.done and newest.totals["late"] == 0


def test_a_chain_refuses_what_it_cannot_run(spark: Any, tmp_path: Path, log_url: str) -> None:
    write_events(log_url, make_events(10, hours=1), key_field="user_id")
    source = Topic("events", options={"schema": SCHEMA})

    def refused(upstream: Aggregation, spec: Aggregation | None = None) -> str:
        with pytest.raises(StreamValueError) as err:
            start(
                spark, spec or busiest(), Chained(upstream, source), checkpoint=tmp_path / "cp",
                output=tmp_path / "out", log_url=log_url,
            )  # fmt: skip
        return str(err.value)

    assert "set output=\"final\" on 'per_user'" in refused(per_user(output="update"))
    assert "of the same name" in refused(per_user(name="busiest"))
    bad = Aggregation(
        name="busiest", key="all", time="window_start", window=Tumbling("20m"),
        columns={"all": "'all'"}, metrics={"x": Max("nope")},
    )  # fmt: skip
    message = refused(per_user(), bad)
    assert "nope" in message and "per_user" in message
