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
def test_topic_sink_writes_each_batch_once_per_partition(tmp_path: Path) -> None:
    from riverbed.log import open as open_log
    from riverbed.stream.sinks import TopicSink

    url = f"file://{tmp_path / 'log'}"
    batch0 = pd.concat([rows(0, 10, key=f"f{i}") for i in range(8)], ignore_index=True)
    sink = TopicSink(url, "flags.results", partitions=3)
    before = pd.Timestamp.now(tz="UTC").floor("ms")
    assert sink.write(0, batch0) == 8
    assert sink.write(0, batch0) == 0  # a re-run of batch 0: nothing new
    # a crash after one partition's append: the re-run writes only the others
    batch1 = batch0.assign(users=20, batch_id=1)
    log = open_log(url)
    counts = {p.partition: p.end for p in log.offsets("flags.results")}
    first = min(counts)
    one = batch1[
        [sink.log.partitioner("key-hash").partition(k.encode(), 3) == first for k in batch1["key"]]
    ]
    assert sink.write(1, one) == len(one) > 0
    assert sink.write(1, batch1) == 8 - len(one)
    assert sink.write(0, batch0) == 0  # an old batch never lands after a newer one
    records = [r for p in range(3) for r in log.read("flags.results", p, 0, 100)]
    assert len(records) == 16
    assert sorted((r.value["key"], r.value["batch_id"]) for r in records) == sorted(
        [(f"f{i}", b) for i in range(8) for b in (0, 1)]
    )
    # stamped when written, not with the window's time (a topic's retention counts
    # from its records' timestamps); the window is in the value
    assert all(before <= r.timestamp <= pd.Timestamp.now(tz="UTC") for r in records)
    assert {r.value["window_end"] for r in records} == {(T + pd.Timedelta(hours=1)).isoformat()}
    sink.close()


def test_a_joins_topic_is_typed_and_written_by_column_once_per_partition(
    tmp_path: Path,
) -> None:
    """A join's rows (an Arrow table) go to a topic created typed with their columns
    and batch_id, as typed columns; a re-run of a batch, or of the partitions a crash
    left unwritten, adds nothing twice."""
    import pyarrow as pa

    from riverbed.log import open as open_log
    from riverbed.stream.sinks import TopicSink

    url = f"file://{tmp_path / 'log'}"
    times = pa.array([T.value // 1000 + i for i in range(12)], pa.timestamp("us", tz="UTC"))
    table = pa.table({"id": pa.array(range(12), pa.int64()), "name": [f"n{i}" for i in range(12)],
                      "ts": times, "batch_id": pa.array([0] * 12, pa.int64())})  # fmt: skip
    sink = TopicSink(url, "joined", partitions=3, schema=table.schema)
    log = open_log(url)
    assert log.topic("joined").schema == "id long, name string, ts timestamp, batch_id long"
    assert sink.write_table(0, table, "id") == 12
    assert sink.write_table(0, table, "id") == 0  # a re-run of batch 0: nothing new
    partitions = sink.log.producer("joined").column_partitions(table, "id")
    assert partitions is not None and len(set(partitions.tolist())) == 3
    first = table.filter(pa.array(partitions == partitions.min()))
    assert sink.write_table(1, first, "id") == first.num_rows  # a crash after one partition
    assert sink.write_table(1, table, "id") == 12 - first.num_rows
    records = [r for p in range(3) for r in log.read("joined", p, 0, 100)]
    assert sorted((r.value["id"], r.value["batch_id"]) for r in records) == sorted(
        (i, b) for i in range(12) for b in (0, 1)
    )
    assert {r.value["name"] for r in records} == {f"n{i}" for i in range(12)}
    sink.close()
    # a column a topic cannot carry: the topic holds JSON records, written row by row
    odd = table.append_column("tags", pa.array([["a"]] * 12, pa.list_(pa.string())))
    sink = TopicSink(url, "joined_json", partitions=2, schema=odd.schema)
    assert log.topic("joined_json").schema is None
    assert sink.write_table(0, odd, "id") == 12 and sink.write_table(0, odd, "id") == 0
    sink.close()
    log.close()


@pytest.mark.spark
@pytest.mark.parametrize("path", ["spark", "direct", "spark-doors", "direct-doors"])
def test_engine_writes_the_same_results_to_sql_topic_and_live_state(
    spark: Any, tmp_path: Path, path: str
) -> None:
    """Both engine paths, each spelled both ways: the source as a dict or a DataFrame
    with ``output``/``sql``/``topic`` keywords, and (``-doors``) as a Source object
    with a list of sinks (riverbed.stream.doors)."""
    from riverbed.log import open as open_log
    from riverbed.state import StateConfig
    from riverbed.stream import (
        Aggregation,
        Count,
        Distinct,
        Frame,
        ResultsTopic,
        ResultTable,
        SqlTable,
        Topic,
        Tumbling,
        read_live,
        read_results,
        register,
        start,
    )
    from tests.stream.conftest import make_events, write_events

    url = f"file://{tmp_path / 'log'}"
    write_events(url, make_events(1500, hours=3))
    register(spark)
    options = {
        "topic": "events",
        "log": url,
        "schema": "user_id long, flag string, amount double, ts timestamp",
        "maxRecordsPerBatch": "500",
    }
    source: Any = options
    if path.startswith("spark"):
        source = spark.readStream.format("riverbed").options(**options).load()
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
    if path.endswith("doors"):
        rest = {k: v for k, v in options.items() if k not in ("topic", "log")}
        door = Frame(source) if path.startswith("spark") else Topic("events", url, rest)
        query = start(
            spark,
            spec,
            door,
            checkpoint=tmp_path / "ckpt",
            sinks=[ResultTable(tmp_path / "out"), SqlTable(sql), ResultsTopic("flags.results")],
            log_url=url,
            trigger={"availableNow": True},
        )
    else:
        query = start(
            spark,
            spec,
            source,
            checkpoint=tmp_path / "ckpt",
            output=tmp_path / "out",
            sql=sql,
            topic="flags.results",
            log_url=url,
            trigger={"availableNow": True},
        )
    query.awaitTermination(300)
    assert query.exception() is None
    parquet = read_results(tmp_path / "out")
    assert parquet["n"].sum() == 1500

    # SQL: the same rows
    table = SqlSink(sql).read("flags")
    assert len(table) == len(parquet)
    merged = parquet.assign(window_start=parquet["window_start"].map(pd.Timestamp.isoformat)).merge(
        table, on=["window_start", "key"], suffixes=("", "_sql")
    )
    assert len(merged) == len(parquet)
    assert (merged["users"] == merged["users_sql"]).all() and (merged["n"] == merged["n_sql"]).all()

    # topic: every batch's rows once; the newest per (window, key) equals the table
    log = open_log(url)
    records = [
        r
        for p in log.offsets("flags.results")
        for r in log.read("flags.results", p.partition, 0, 10**6)
    ]
    values = pd.DataFrame([r.value for r in records])
    assert not values.duplicated(["batch_id", "window_start", "key"]).any()
    assert all(r.key == r.value["key"].encode() for r in records)
    newest = values.sort_values("batch_id").drop_duplicates(["window_start", "key"], keep="last")
    assert sorted(zip(newest["key"], newest["users"], newest["n"], strict=True)) == sorted(
        zip(parquet["key"], parquet["users"], parquet["n"], strict=True)
    )

    # live from state: now, and as of the end of batch 0
    state = StateConfig(
        local_dir=tmp_path / "ckpt" / "local-state", durable=tmp_path / "ckpt" / "state"
    )
    live = read_live(spec, state)
    columns = ["window_start", "key", "users", "n"]
    pd.testing.assert_frame_equal(
        live[columns].reset_index(drop=True),
        parquet[columns].reset_index(drop=True),
        check_dtype=False,
    )
    first = read_live(spec, state, batch_id=0)
    batch0 = values[values["batch_id"] == 0]
    assert first["n"].sum() == batch0["n"].sum() == 500
    assert sorted(first["key"]) == sorted(batch0["key"])


def check_tombstones(sink: SqlSink) -> None:
    """A session merged away (``deleted``) is deleted from the SQL table — unless the
    stored row is newer than the tombstone."""
    first = pd.concat([rows(0, 3, key="a"), rows(0, 4, key="b")], ignore_index=True)
    sink.upsert("visits", first.assign(deleted=False))
    later = T - pd.Timedelta(minutes=30)  # "a" now starts earlier: its old row goes
    grown = rows(1, 9, key="a").assign(window_start=[later], deleted=False)
    gone = rows(1, 0, key="a").assign(deleted=True, window_end=pd.NaT)
    assert sink.upsert("visits", pd.concat([grown, gone], ignore_index=True)) == 2
    stale = rows(0, 0, key="b").assign(deleted=True, batch_id=-1)  # older than the row
    sink.upsert("visits", stale)
    table = sink.read("visits")
    assert "deleted" not in table.columns
    assert sorted(zip(table["key"], table["users"], table["batch_id"], strict=True)) == [
        ("a", 9, 1),
        ("b", 4, 0),
    ]
    assert pd.Timestamp(table[table["key"] == "a"]["window_start"].iloc[0]) == later


def test_sqlite_deletes_sessions_merged_away(tmp_path: Path) -> None:
    check_tombstones(SqlSink(f"sqlite:///{tmp_path / 'results.db'}"))


@pytest.mark.postgres
def test_postgres_deletes_sessions_merged_away(postgres_db: str) -> None:
    check_tombstones(SqlSink(postgres_db))


@pytest.mark.spark
def test_sessions_in_sql_and_topic_sinks_equal_the_result_table(spark: Any, tmp_path: Path) -> None:
    """Sessions merging across batches: the SQL table holds the current sessions only,
    and a topic consumer that applies records in order (deletes included) ends with
    the same rows."""
    from riverbed.log import open as open_log
    from riverbed.stream import Aggregation, Count, Session, read_results, start
    from tests.stream.conftest import write_events
    from tests.stream.test_engine import session_events

    url = f"file://{tmp_path / 'log'}"
    write_events(url, session_events(1200, seed=71).sample(frac=1, random_state=1))
    spec = Aggregation(
        name="visits",
        key="flag",
        time="ts",
        window=Session("5m"),
        watermark="10h",
        metrics={"n": Count()},
        state_partitions=3,
    )
    sql = f"sqlite:///{tmp_path / 'results.db'}"
    options = {
        "topic": "events",
        "log": url,
        "schema": "user_id long, flag string, amount double, ts timestamp",
        "maxRecordsPerBatch": "300",
    }
    query = start(
        spark,
        spec,
        options,
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        sql=sql,
        topic="visits.results",
        log_url=url,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None
    parquet = read_results(tmp_path / "out")
    want = sorted(
        zip(
            parquet["window_start"].map(pd.Timestamp.isoformat),
            parquet["key"],
            parquet["n"],
            strict=False,
        )
    )
    table = SqlSink(sql).read("visits")
    assert sorted(zip(table["window_start"], table["key"], table["n"], strict=True)) == want
    log = open_log(url)
    records = [
        r.value
        for p in log.offsets("visits.results")
        for r in log.read("visits.results", p.partition, 0, 10**6)
    ]
    assert any(v["deleted"] for v in records)
    seen: dict[tuple[str, str], Any] = {}
    for value in sorted(records, key=lambda v: v["batch_id"]):
        if value["deleted"]:
            seen.pop((value["window_start"], value["key"]), None)
        else:
            seen[(value["window_start"], value["key"])] = value["n"]
    assert sorted((s, k, n) for (s, k), n in seen.items()) == want
    log.close()


def test_result_records_by_column_are_the_rows_plain_values() -> None:
    """The results topics' records, built column by column, are each row's values as
    ``plain`` makes them one by one: timestamps as ISO text (NaT: null), NaN as null,
    numpy numbers as Python's, decimals as text, TopK's arrays as lists."""
    from decimal import Decimal

    import numpy as np

    from riverbed.stream.sinks import plain, result_records

    frame = pd.DataFrame(
        {
            "window_start": [T, T + pd.Timedelta(minutes=5), T],
            "window_end": [T + pd.Timedelta(hours=1), pd.NaT, T + pd.Timedelta(hours=1)],
            "key": ["a", "b", "c"],
            "n": np.array([1, 2, 3], dtype=np.int64),
            "avg": [1.5, float("nan"), 2.0],
            "ok": [True, False, True],
            "price": [Decimal("1.10"), None, Decimal("3")],
            "top": [np.array([{"value": "x", "count": 2}]), np.array([]), None],
            "batch_id": [7, 7, 7],
        }
    )
    got = result_records(9, frame)
    want = [
        (str(row["key"]), {k: plain(v) for k, v in row.items()} | {"batch_id": 9})
        for row in frame.to_dict("records")
    ]
    assert got == want
    assert got[1][1]["window_end"] is None and got[1][1]["avg"] is None
    assert got[0][1]["window_start"] == T.isoformat() and got[0][1]["price"] == "1.10"
    assert result_records(9, frame.iloc[:0]) == []
