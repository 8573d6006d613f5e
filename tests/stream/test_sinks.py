"""SQL result tables: upserts that are idempotent and never regress, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.errors import ConfigError
from riverbed.stream.sinks import SqlSink

T = pd.Timestamp("2026-11-21T10:00:00Z")


def rows(batch: int, users: int, key: str = "f1") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "window_start": [T],
            "window_end": [T + pd.Timedelta(hours=1)],
            "key": [key],
            "users": [users],
            "users_is_exact": [True],
            "users_error": [0.0],
            "batch_id": [batch],
        }
    )


def check_sink(sink: SqlSink) -> None:
    assert sink.upsert("flags", pd.concat([rows(0, 10), rows(0, 5, key="f2")])) == 2
    sink.upsert("flags", rows(1, 12))
    sink.upsert("flags", rows(1, 12))  # the same batch again: harmless
    sink.upsert("flags", rows(0, 10))  # a late retry of an older batch: ignored
    table = sink.read("flags")
    assert sorted(zip(table["key"], table["users"], table["batch_id"], strict=True)) == [
        ("f1", 12, 1),
        ("f2", 5, 0),
    ]


def test_sqlite_upserts(tmp_path: Path) -> None:
    check_sink(SqlSink(f"sqlite:///{tmp_path / 'results.db'}"))


@pytest.mark.postgres
def test_postgres_upserts(postgres_db: str) -> None:
    check_sink(SqlSink(postgres_db))


def test_bad_sink_urls_and_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unsupported SQL sink"):
        SqlSink("mysql://x")
    with pytest.raises(ConfigError, match="not a valid SQL"):
        SqlSink(f"sqlite:///{tmp_path / 'r.db'}").upsert("drop table x;--", rows(0, 1))


@pytest.mark.spark
def test_engine_writes_the_same_results_to_sql(spark: Any, tmp_path: Path) -> None:
    from riverbed.stream import (
        Aggregation,
        Count,
        Distinct,
        Tumbling,
        read_results,
        register,
        start,
    )
    from tests.stream.conftest import make_events, write_events

    url = f"file://{tmp_path / 'log'}"
    write_events(url, make_events(1500, hours=3))
    register(spark)
    source = (
        spark.readStream.format("riverbed")
        .option("topic", "events")
        .option("log", url)
        .option("schema", "user_id long, flag string, amount double, ts timestamp")
        .option("maxRecordsPerBatch", 500)
        .load()
    )
    spec = Aggregation(
        name="flags",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="5h",
        metrics={"users": Distinct("user_id"), "n": Count()},
        state_partitions=2,
    )
    sql = f"sqlite:///{tmp_path / 'results.db'}"
    query = start(
        spark,
        spec,
        source,
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        sql=sql,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None
    parquet = read_results(tmp_path / "out")
    table = SqlSink(sql).read("flags")
    assert len(table) == len(parquet)
    merged = parquet.assign(window_start=parquet["window_start"].map(pd.Timestamp.isoformat)).merge(
        table, on=["window_start", "key"], suffixes=("", "_sql")
    )
    assert len(merged) == len(parquet)
    assert (merged["users"] == merged["users_sql"]).all() and (merged["n"] == merged["n_sql"]).all()
