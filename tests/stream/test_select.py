"""Selects (``Select(...)``: one stream filtered and projected, riverbed.stream.selects,
run as a one-sided join) on a real Spark session and real topics: every row Spark SQL's
``SELECT … WHERE …`` gives over the same events — decimals, CASE, regular expressions,
NULLs — each once, in log order; a row an expression fails for goes to the dead-letter
topic with the reason, an event the filter drops cannot fail; a batch run again replaces
its rows; the topic path and the DataFrame path give the same rows."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import riverbed.log
from riverbed.stream.batchlog import open_batches
from riverbed.stream.doors import Frame, Topic
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import read_joined, start_join, status
from riverbed.stream.layout import checkpoint_store, commit_key, default_state
from riverbed.stream.selects import Select
from tests.stream.conftest import T0

pytestmark = pytest.mark.spark

BIDS = "auction long, bidder long, price long, channel string, url string, tag string, ts timestamp"
CHANNELS = ["apple", "Google", "Facebook", "spam", "baidu", None]
URLS = [
    "https://www.nexmark.com/a/b/item.htm?query=1",
    "http://shop.example.org/x",
    "ftp://z",
    None,
]

# each output column's Spark SQL (tag: numeric text mostly; 'x' fails the CAST: ANSI)
COLUMNS = {
    "auction": "auction",
    "price": "price * 0.908",  # replaces the field, as SELECT price * 0.908 AS price
    "domain": "regexp_extract(url, '^https?://([^/]+)', 1)",
    "kind": "CASE WHEN lower(channel) IN ('apple', 'google') THEN 'app' "
    "WHEN channel = 'Facebook' THEN 'social' ELSE 'other' END",
    "tag_n": "CAST(tag AS INT)",
    "ts": "ts",
}
WHERE = "price > 100 AND channel <> 'spam'"


def bids(n: int, seed: int, start: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    price = pd.array(rng.integers(0, 10_000, n), dtype="Int64")
    price[rng.random(n) < 0.05] = pd.NA
    tags = np.array([str(int(v)) for v in rng.integers(-50, 50, n)], dtype=object)
    tags[rng.random(n) < 0.04] = "x"  # not a number: a malformed row where it is kept
    tags[rng.random(n) < 0.04] = None
    return pd.DataFrame(
        {
            "auction": np.arange(start, start + n),
            "bidder": rng.integers(0, 500, n),
            "price": price,
            "channel": rng.choice(np.array(CHANNELS, dtype=object), n),
            "url": rng.choice(np.array(URLS, dtype=object), n),
            "tag": tags,
            "ts": T0 + pd.to_timedelta(np.sort(rng.integers(0, 3_600_000, n)), unit="ms"),
        }
    )


def send(log_url: str, topic: str, frame: pd.DataFrame) -> None:
    log = riverbed.log.open(log_url)
    if topic not in log.topics():
        log.create_topic(topic, 3)
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    log.producer(topic).send_batch(
        [{**r, "ts": pd.Timestamp(r["ts"]).isoformat()} for r in rows], key_field="auction"
    )
    log.close()


def spark_answer(spark: Any, events: pd.DataFrame) -> tuple[list[tuple[Any, ...]], set[int]]:
    """Spark SQL's rows for the Select over ``events`` (but ``ts``, compared apart), and
    the auctions Spark's ANSI CAST would fail on (kept by the filter, tag not a number)."""
    frame = events.drop(columns=["ts"]).astype(object).where(events.notna(), None)
    schema = "auction long, bidder long, price long, channel string, url string, tag string"
    spark.createDataFrame(frame, schema).createOrReplaceTempView("bids")
    select = ", ".join(f"{text} AS {name}" for name, text in COLUMNS.items() if name != "ts")
    failing = spark.sql(
        f"SELECT auction FROM bids WHERE ({WHERE}) AND tag IS NOT NULL "
        "AND try_cast(tag AS INT) IS NULL"
    )
    bad = {int(r["auction"]) for r in failing.collect()}
    good = frame[~events["auction"].isin(bad)]  # (ANSI Spark fails the query on the rest)
    spark.createDataFrame(good, schema).createOrReplaceTempView("bids")
    picked = spark.sql(f"SELECT {select} FROM bids WHERE {WHERE}")
    return sorted((tuple(r) for r in picked.collect()), key=lambda r: r[0]), bad


def rows_of(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    cols = [c for c in COLUMNS if c != "ts"]
    out = frame[cols].astype(object).where(frame[cols].notna(), None)
    return sorted((tuple(r) for r in out.itertuples(index=False)), key=lambda r: r[0])


def drain(spark: Any, select: Select, tmp_path: Path, log_url: str) -> int:
    query = start_join(
        spark, select, checkpoint=tmp_path / "cp", output=tmp_path / "out", log_url=log_url,
        trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    if not hasattr(query, "_group"):  # a DataFrame's: Spark's streaming query, Spark's jobs
        return -1
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(query._group))


@pytest.mark.parametrize("in_driver", [True, False])
def test_a_select_gives_what_spark_sql_gives_each_row_once(
    spark: Any, tmp_path: Path, in_driver: bool
) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    jobs = {} if in_driver else {"driverBatchRecords": "0"}
    select = Select(
        name="picked", source=Topic("bids", options={"schema": BIDS, **jobs}),
        where=WHERE, columns=COLUMNS, time="ts", topic="picked_out", key="auction",
    )  # fmt: skip
    first, second = bids(400, seed=3), bids(400, seed=4, start=400)
    send(log_url, "bids", first)
    assert (drain(spark, select, tmp_path, log_url) == 0) == in_driver
    send(log_url, "bids", second)  # a second backlog, after a restart
    drain(spark, select, tmp_path, log_url)

    events = pd.concat([first, second], ignore_index=True)
    want, bad = spark_answer(spark, events)
    got = read_joined(tmp_path / "out")
    assert list(got.columns) == [*COLUMNS, "batch_id"]
    assert rows_of(got) == want and len(want) > 300 and bad  # every row once, Spark's values
    assert isinstance(got["price"].dropna().iloc[0], Decimal)  # a decimal, as Spark gives it
    # the event time as given, and log order within each batch: by partition, offset
    times = events.set_index("auction")["ts"]
    assert (pd.to_datetime(got["ts"]).dt.tz_convert(None) == times[got["auction"]].values).all()

    batches = open_batches(tmp_path / "cp")
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.done and newest.totals is not None
    price, channel = events["price"], events["channel"]
    dropped = int((~((price > 100).fillna(False) & (channel != "spam") & channel.notna())).sum())
    assert newest.totals["input"] == 800 and newest.totals["filtered"] == dropped
    assert newest.totals["malformed"] == len(bad) and newest.totals["joined"] == len(want)
    assert newest.watermark_ms == 0 and newest.totals["late"] == 0  # nothing waits

    log = riverbed.log.open(log_url)
    try:  # the topic holds the same rows, once; the failed ones are dead letters, with why
        assert sum(o.end - o.start for o in log.offsets("picked_out")) == len(want)
        dead = [r.value for o in log.offsets("picked.dlq") for r in log.read(
            "picked.dlq", o.partition, o.start, o.end - o.start)]  # fmt: skip
    finally:
        log.close()
    assert sorted(int(v["auction"]) for v in dead) == sorted(bad)
    assert all(v["_error"].startswith("columns['tag_n']: ") for v in dead)

    info = status(select.join, tmp_path / "cp", default_state(tmp_path / "cp"), log_url)
    assert info["sides"]["left"]["lag"] == 0 and info["watermark"] is None
    assert info["sides"]["left"]["held"] == 0 and "right" not in info["sides"]


def test_a_select_of_every_field_and_a_batch_run_again(spark: Any, tmp_path: Path) -> None:
    """No ``columns``: every field as it is (no decimals made doubles, times to the
    microsecond); the newest batch, planned and then (as after a crash) not done, runs
    again and replaces its rows."""
    log_url = f"file://{tmp_path / 'log'}"
    select = Select(name="all", source={"topic": "bids", "schema": BIDS}, where="bidder % 7 = 0")
    events = bids(300, seed=9)
    events["ts"] += pd.to_timedelta(np.arange(300), unit="us")  # sub-millisecond times
    send(log_url, "bids", events)
    drain(spark, select, tmp_path, log_url)
    before = read_joined(tmp_path / "out")
    want = events[events["bidder"] % 7 == 0]
    assert list(before.columns) == [*events.columns, "batch_id"]
    assert sorted(before["auction"]) == sorted(want["auction"]) and len(want) > 20
    got_ts = pd.to_datetime(before.set_index("auction")["ts"]).dt.tz_convert(None)
    assert (got_ts[want["auction"]].values == want["ts"].values).all()

    batches = open_batches(tmp_path / "cp")
    newest_id = batches.ids()[-1]
    checkpoint_store(tmp_path / "cp").delete_many([commit_key(newest_id)])
    checkpoint_store(tmp_path / "out").delete_many([f"batch_id={newest_id}/part-00000.parquet"])
    drain(spark, select, tmp_path, log_url)
    after = read_joined(tmp_path / "out")
    assert after.sort_values("auction").equals(before.sort_values("auction"))
    assert open_batches(tmp_path / "cp").ids()[-1] == newest_id  # run again, not planned anew


def test_a_dataframes_events_are_selected_as_a_topics_are(spark: Any, tmp_path: Path) -> None:
    from riverbed.stream import register

    register(spark)
    log_url = f"file://{tmp_path / 'log'}"
    events = bids(300, seed=5)
    send(log_url, "bids", events)
    frame = (
        spark.readStream.format("riverbed").option("topic", "bids").option("log", log_url)
        .option("schema", BIDS).option("maxRecordsPerBatch", 120).load()
    )  # fmt: skip
    select = Select(name="picked", source=Frame(frame), where=WHERE, columns=COLUMNS, time="ts")
    drain(spark, select, tmp_path, log_url)
    want, bad = spark_answer(spark, events)
    got = read_joined(tmp_path / "out")
    assert rows_of(got) == want and bad
    batches = open_batches(tmp_path / "cp")
    assert len(batches.ids()) >= 3  # micro-batches of at most 120 records


def test_a_select_refuses_what_it_cannot_do_with_the_fix(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(StreamValueError, match="needs key="):
        Select(name="s", source="bids", topic="out")
    with pytest.raises(StreamValueError, match="key='bidder' is not one of its columns"):
        Select(name="s", source="bids", columns=["auction"], topic="out", key="bidder")
    with pytest.raises(StreamValueError, match="maps each output column's name"):
        Select(name="s", source="bids", columns={"a b": "auction"})
    with pytest.raises(StreamValueError, match="'batch_id' is riverbed's"):
        Select(name="s", source="bids", columns={"batch_id": "auction"})
    with pytest.raises(StreamValueError, match="names its topic"):
        Select(name="s", source={"schema": BIDS})
    with pytest.raises(StreamValueError, match="is a topic's name"):
        Select(name="s", source=3)

    log_url = f"file://{tmp_path / 'log'}"
    send(log_url, "bids", bids(5, seed=1))
    source = Topic("bids", options={"schema": BIDS})
    cases = [
        (Select(name="s", source=source, columns={"x": "nope + 1"}), "columns.*nope"),
        (
            Select(name="s", source=source, columns={"x": "soundex(url)"}),
            "SOUNDEX is not supported",
        ),
        # where reads the source's fields, not the output's names (as in SQL)
        (
            Select(name="s", source=source, columns={"dollars": "price"}, where="dollars > 1"),
            "where.*dollars",
        ),
        (Select(name="s", source=source, where="price"), "not a condition"),
        (Select(name="s", source=source, time="when"), "time='when' is not a field"),
        (Select(name="s", source="nothing_here"), "topic 'nothing_here' does not exist"),
    ]
    for select, match in cases:
        with pytest.raises(StreamValueError, match=match):
            drain(spark, select, tmp_path, log_url)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_select_restarted_with_changed_columns_is_refused_and_keeps_its_rows(
    spark: Any, tmp_path: Path
) -> None:
    """Its output's files keep one set of columns: a restart on the same checkpoint with
    a column changed (its type, a name, one more) is refused naming it, with the fix,
    before anything is written; a changed ``where`` runs (later batches filter by it). A
    checkpoint of an older riverbed (no columns recorded) runs, and records them."""
    import json

    from riverbed.stream.layout import JOIN

    log_url = f"file://{tmp_path / 'log'}"
    source = Topic("bids", options={"schema": BIDS})
    columns = {"auction": "auction", "price": "price"}
    send(log_url, "bids", bids(100, seed=3))
    select = Select(name="s", source=source, columns=columns, where="price > 10")
    drain(spark, select, tmp_path, log_url)
    before = read_joined(tmp_path / "out")
    send(log_url, "bids", bids(50, seed=4, start=100))
    changed = [
        ({"auction": "auction", "price": "price * 0.9"}, "columns price decimal"),
        ({"auction": "auction", "dollars": "price"}, "columns dollars int64"),
        ({**columns, "url": "url"}, "now columns url string"),
        ({"price": "price", "auction": "auction"}, r"\(in this order\)"),
    ]
    for given, match in changed:
        with pytest.raises(StreamValueError, match=f"{match}.*start on a new checkpoint"):
            drain(spark, Select(name="s", source=source, columns=given), tmp_path, log_url)
    assert read_joined(tmp_path / "out").equals(before)

    shape_file = tmp_path / "cp" / JOIN
    recorded = json.loads(shape_file.read_text())
    assert recorded["columns"] == [["auction", "int64"], ["price", "int64"], ["batch_id", "int64"]]
    shape_file.write_text(json.dumps({k: v for k, v in recorded.items() if k != "columns"}))
    select = Select(name="s", source=source, columns=columns, where="price > 5000")
    drain(spark, select, tmp_path, log_url)
    assert json.loads(shape_file.read_text()) == recorded
    after = read_joined(tmp_path / "out")
    new = after[after["auction"] >= 100]
    assert len(after) == len(before) + len(new) and len(new) and (new["price"] > 5000).all()


@pytest.mark.kafka
def test_a_kafka_topics_events_are_selected_as_a_riverbed_topics_are(
    spark: Any, tmp_path: Path, kafka_server: Any, kafka_topic: str
) -> None:
    """The source in Kafka (JSON values): the rows Spark SQL gives, a record that is not
    JSON malformed and sent to the Select's .dlq, counted."""
    import json

    from confluent_kafka import Producer

    events = bids(300, seed=12).assign(tag="7")
    kafka_server.create_topic(kafka_topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap, "acks": "all"})
    rows = events.astype(object).where(events.notna(), None).to_dict("records")
    for row in rows:
        value = {**row, "ts": pd.Timestamp(row["ts"]).isoformat()}
        producer.produce(kafka_topic, key=str(row["auction"]), value=json.dumps(value))
    producer.produce(kafka_topic, key="x", value=b"{not json")
    assert producer.flush(30) == 0
    log_url = f"file://{tmp_path / 'log'}"
    source = Topic(kafka_topic, log=f"kafka://{kafka_server.bootstrap}?serde=json",
                   options={"schema": BIDS})  # fmt: skip
    select = Select(name="picked", source=source, where=WHERE, columns=COLUMNS, time="ts")
    drain(spark, select, tmp_path, log_url)
    want, bad = spark_answer(spark, events)
    assert rows_of(read_joined(tmp_path / "out")) == want and not bad and len(want) > 100
    batches = open_batches(tmp_path / "cp")
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None and totals["malformed"] == 1 and totals["input"] == 301
    log = riverbed.log.open(log_url)
    (dead,) = [r.value for r in log.read("picked.dlq", 0, 0, 10)]
    log.close()
    assert dead["_error"]
