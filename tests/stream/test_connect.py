"""Aggregations over Spark Connect (Spark 4's way to reach a shared Spark): a riverbed
driver that is only a Connect client of a real server (PySpark's own
``SparkConnectServer``) aggregates a riverbed topic through Spark's micro-batch engine —
the source's and ``foreachBatch``'s Python run on the server — with the same results
and exactly-once restarts as a classic session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.spark import is_connect
from riverbed.stream import Aggregation, Count, Distinct, Session, Sum, Topic
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.errors import StreamValueError
from riverbed.testing.connect import ConnectServer
from riverbed.windows import Tumbling
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import oracle, session_events, session_oracle, source

# a Spark Connect server (Spark, started by the fixture), in the scenario group: one
# worker runs these one after another, never beside its own classic session's tests
pytestmark = [pytest.mark.spark, pytest.mark.slow]
MODE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture(scope="module")
def connect() -> Iterator[Any]:
    """A Spark Connect server for the module, and a client session of it. PySpark puts a
    whole process in Connect mode (``SPARK_CONNECT_MODE_ENABLED``: its functions and
    builders then speak Connect); the mode is taken back after, so this worker's classic
    sessions work again."""
    from pyspark.sql import SparkSession

    before = os.environ.get(MODE)
    with ConnectServer() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()
            if before is None:
                os.environ.pop(MODE, None)
            else:
                os.environ[MODE] = before


def _run(spark: Any, spec: Aggregation, log_url: str, root: Path) -> None:
    query = start(
        spark, spec, source(spark, log_url, max_records=500), checkpoint=root / "ckpt",
        output=root / "out", log_url=log_url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def test_an_aggregation_over_spark_connect_equals_the_oracle_across_a_restart(
    connect: Any, tmp_path: Path
) -> None:
    assert is_connect(connect)
    log_url = f"file://{tmp_path / 'log'}"
    events = make_events(3000, hours=4, seed=21)
    spec = Aggregation(
        name="remote", key="flag", time="ts", window=Tumbling("1h"), watermark="3h",
        metrics={"events": Count(), "users": Distinct("user_id"), "total": Sum("amount")},
        state_partitions=2,
    )  # fmt: skip
    write_events(log_url, events.iloc[:1800], partitions=3)
    _run(connect, spec, log_url, tmp_path)
    write_events(log_url, events.iloc[1800:], partitions=3)  # more, then again
    _run(connect, spec, log_url, tmp_path)
    got = read_results(tmp_path / "out")
    want = oracle(events, Tumbling("1h"))
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"
    assert (merged["users"] == merged["users_oracle"]).all()
    assert ((merged["total"] - merged["total_oracle"]).abs() < 1e-6).all()


def test_sessions_over_spark_connect_equal_their_definition(connect: Any, tmp_path: Path) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    events = session_events(1500, seed=62)
    write_events(log_url, events, partitions=3)
    spec = Aggregation(
        name="remote_sessions", key="flag", time="ts", window=Session("5m"), watermark="10h",
        metrics={"events": Count()}, state_partitions=2,
    )  # fmt: skip
    _run(connect, spec, log_url, tmp_path)
    got = read_results(tmp_path / "out").sort_values(["key", "window_start"])
    want = session_oracle(events, pd.Timedelta("5m")).sort_values(["key", "window_start"])
    assert list(got["key"]) == list(want["key"])
    assert list(got["window_start"]) == list(want["window_start"])
    assert list(got["events"]) == list(want["events"])


def test_the_log_native_path_over_spark_connect_is_refused_naming_the_way(
    connect: Any, tmp_path: Path
) -> None:
    spec = Aggregation(name="native", key="flag", window=Tumbling("1h"), metrics={"n": Count()})
    with pytest.raises(StreamValueError, match=r"Frame\(spark.readStream.format\('riverbed'\)"):
        start(connect, spec, Topic("events", f"file://{tmp_path / 'log'}"),
              checkpoint=tmp_path / "ckpt", output=tmp_path / "out")  # fmt: skip
    assert not (tmp_path / "out").exists()
