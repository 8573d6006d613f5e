"""Stream-stream joins (riverbed.stream.streamjoin) on a real Spark session and real
topics: interval and window joins, inner and left, restarted between backlogs; every
joined row equals pandas' batch join of the events read back, each once."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import riverbed.log
from riverbed.log.records import RawRecord, now_ms
from riverbed.stream.batchlog import open_batches
from riverbed.stream.doors import Topic
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import read_joined, start_join, status
from riverbed.stream.joins import Join
from riverbed.stream.layout import default_state
from tests.stream.conftest import T0

pytestmark = pytest.mark.spark

ORDERS = "order_id long, amount double, ts timestamp"
PAYMENTS = "order_id long, paid double, ts timestamp"


def orders_and_payments(n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Orders over ~2 hours, each paid (or not) within minutes to hours, some paid twice;
    both in roughly time order, as a log receives them."""
    rng = np.random.default_rng(seed)
    at = T0 + pd.to_timedelta(np.sort(rng.integers(0, 2 * 3_600_000, n)), unit="ms")
    orders = pd.DataFrame(
        {"order_id": np.arange(n), "amount": rng.integers(1, 500, n).astype(float), "ts": at}
    )
    paid = orders.sample(frac=0.8, random_state=seed)
    twice = paid.sample(frac=0.1, random_state=seed + 1)
    payments = pd.concat([paid, twice])
    delay = pd.to_timedelta(rng.integers(-5 * 60_000, 90 * 60_000, len(payments)), unit="ms")
    payments = pd.DataFrame(
        {
            "order_id": payments["order_id"].to_numpy(),
            "paid": payments["amount"].to_numpy(),
            "ts": (payments["ts"] + delay).to_numpy(),
        }
    ).sort_values("ts", kind="stable")
    return orders, payments


def send(log_url: str, topic: str, frame: pd.DataFrame, partitions: int) -> None:
    log = riverbed.log.open(log_url)
    if topic not in log.topics():
        log.create_topic(topic, partitions)
    rows = frame.astype({"ts": object}).to_dict("records")
    log.producer(topic).send_batch(
        [{**r, "ts": pd.Timestamp(r["ts"]).isoformat()} for r in rows], key_field="order_id"
    )
    log.close()


def drain(spark: Any, join: Join, tmp_path: Path, log_url: str) -> int:
    """Run ``join`` over what its topics hold (checkpoint ``cp``, joined rows ``out``);
    returns how many Spark jobs its batches ran (0: all in the driver's threads)."""
    query = start_join(
        spark,
        join,
        checkpoint=tmp_path / "cp",
        output=tmp_path / "out",
        log_url=log_url,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(query._group))


def oracle(join: Join, orders: pd.DataFrame, payments: pd.DataFrame) -> pd.DataFrame:
    both = orders.merge(payments, on="order_id", how="inner", suffixes=("", "_right"))
    both = both.rename(columns={"ts_right": "right_ts"})
    gap = (both["right_ts"] - both["ts"]).dt.total_seconds() * 1000
    if join.window_ms is not None:
        w = f"{join.window_ms}ms"
        hit = both["ts"].dt.floor(w) == both["right_ts"].dt.floor(w)
    else:
        lo, hi = join.bounds_ms
        hit = (gap >= lo) & (gap <= hi)
    pairs = both.loc[hit]
    if join.how == "left":
        alone = orders[~orders["order_id"].isin(pairs["order_id"])]
        pairs = pd.concat([pairs, alone], ignore_index=True)
    return pairs


def rows_of(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    cols = ["order_id", "amount", "ts", "paid", "right_ts"]
    out = frame[cols].astype(object).where(frame[cols].notna(), None)
    return sorted(
        tuple(
            pd.Timestamp(v).value if isinstance(v, pd.Timestamp | np.datetime64) else v for v in r
        )
        for r in out.itertuples(index=False)
    )


@pytest.mark.parametrize(
    ("kind", "how", "in_driver"),
    [
        ("within", "left", True),
        ("within", "inner", True),
        ("window", "inner", True),
        ("window", "left", True),
        # every batch a Spark job: its read tasks' events shuffled to the pair tasks
        ("within", "left", False),
    ],
)
def test_a_join_over_restarts_equals_the_batch_join(
    spark: Any, tmp_path: Path, kind: str, how: str, in_driver: bool
) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    shape: dict[str, Any] = {"within": ("10m", "1h")} if kind == "within" else {"window": "30m"}
    jobs = {} if in_driver else {"driverBatchRecords": "0"}
    join = Join(
        name="paid",
        left=Topic("orders", options={"schema": ORDERS, **jobs}),
        right=Topic("payments", options={"schema": PAYMENTS, **jobs}),
        on="order_id",
        time="ts",
        how=how,  # type: ignore[arg-type]
        watermark="2h",
        state_partitions=3,
        **shape,
    )
    orders, payments = orders_and_payments(600, seed=3)
    # three backlogs, a start for each (the state and plan carry over), then far-later
    # events on both sides move the watermark past everything: every left row is due
    cuts = [0, 200, 400, 600]
    for a, b in itertools.pairwise(cuts):
        send(log_url, "orders", orders.iloc[a:b], 3)
        lo, hi = orders["ts"].iloc[a], orders["ts"].iloc[b - 1]
        send(
            log_url,
            "payments",
            payments[(payments["ts"] > lo) & (payments["ts"] <= hi)]
            if a
            else payments[payments["ts"] <= hi],
            2,
        )
        jobs_ran = drain(spark, join, tmp_path, log_url)
        assert (jobs_ran == 0) == in_driver  # small batches in the driver, or Spark jobs
    rest = payments[payments["ts"] > orders["ts"].iloc[-1]]
    late = pd.DataFrame({"order_id": [10**6], "amount": [0.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "payments", pd.concat([rest, late.rename(columns={"amount": "paid"})]), 2)
    send(log_url, "orders", late, 3)
    drain(spark, join, tmp_path, log_url)
    want = oracle(join, orders, payments)
    newest = _every_row_once(tmp_path, want)
    # status: the watermark passed every event but the two far-later ones, still held
    info = status(join, tmp_path / "cp", default_state(tmp_path / "cp"), log_url)
    assert {w: (s["held"], s["lag"]) for w, s in info["sides"].items()} == {
        "left": (1, 0),
        "right": (1, 0),
    }
    assert info["watermark"] == "2026-11-23T22:00:00Z"  # the last events' time less 2h
    alone = int(want["paid"].isna().sum())
    assert (newest.totals["joined"], newest.totals["unmatched"]) == (len(want) - alone + 1, alone)
    assert (alone > 0) == (how == "left")


def _every_row_once(tmp_path: Path, want: pd.DataFrame) -> Any:
    """The joined rows in ``out`` (the far-later orders, ids from 10**6, left out) are
    ``want``, each once; none was late or malformed. Returns the newest batch record."""
    got = read_joined(tmp_path / "out")
    got = got[got["order_id"] < 10**6]
    assert len(want) > 100
    assert rows_of(got) == rows_of(want)  # every row, each once
    batches = open_batches(tmp_path / "cp")
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.done and newest.totals is not None
    assert newest.totals["late"] == 0 and newest.totals["malformed"] == 0
    return newest


def test_a_join_refuses_bad_specs_with_the_fix() -> None:
    with pytest.raises(StreamValueError, match=r"window= .* or within="):
        Join(name="j", left="a", right="b", on="k")
    with pytest.raises(StreamValueError, match="one of the two"):
        Join(name="j", left="a", right="b", on="k", window="1m", within=("0s", "1m"))
    with pytest.raises(StreamValueError, match=r"within=.*before, after"):
        Join(name="j", left="a", right="b", on="k", within="1h")  # type: ignore[arg-type]
    with pytest.raises(StreamValueError, match="a duration"):
        Join(name="j", left="a", right="b", on="k", window="soon")
    with pytest.raises(StreamValueError, match="'inner' or 'left'"):
        Join(name="j", left="a", right="b", on="k", window="1m", how="outer")  # type: ignore[arg-type]
    with pytest.raises(StreamValueError, match="a topic's name"):
        Join(name="j", left=3, right="b", on="k", window="1m")
    with pytest.raises(StreamValueError, match=r"a Spark SQL condition per side, e\.g\."):
        Join(name="j", left="a", right="b", on="k", window="1m", where="x > 1")  # type: ignore[arg-type]
    with pytest.raises(StreamValueError, match="a Spark SQL condition per side"):
        Join(name="j", left="a", right="b", on="k", window="1m", where={"both": "x > 1"})


def test_a_missing_topic_or_column_is_named_with_the_fix(spark: Any, tmp_path: Path) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(10, seed=1)
    send(log_url, "orders", orders, 3)
    join = Join(name="j", left="orders", right="payments", on="order_id", time="ts", window="1m")
    with pytest.raises(StreamValueError, match="riverbed topic create payments"):
        start_join(
            spark, join, checkpoint=tmp_path / "cp", output=tmp_path / "out", log_url=log_url
        )
    send(log_url, "payments", payments, 2)
    wrong = Join(name="j", left="orders", right="payments", on="order", time="ts", window="1m")
    with pytest.raises(StreamValueError, match="on='order' is not a field of the left"):
        start_join(
            spark, wrong, checkpoint=tmp_path / "cp", output=tmp_path / "out", log_url=log_url
        )
    drain(spark, join, tmp_path, log_url)
    clash = Join(
        name="j",
        left=Topic("orders", options={"schema": "order_id long, batch_id long, ts timestamp"}),
        right="payments",
        on="order_id",
        time="ts",
        window="1m",
    )
    with pytest.raises(StreamValueError, match="column 'batch_id' has the name of a column"):
        start_join(
            spark, clash, checkpoint=tmp_path / "cp", output=tmp_path / "out", log_url=log_url
        )
    changed = Join(name="j", left="orders", right="payments", on="order_id", time="ts", window="5m")
    with pytest.raises(StreamValueError, match=r"window_ms=60000.*new checkpoint"):
        start_join(
            spark, changed, checkpoint=tmp_path / "cp", output=tmp_path / "o", log_url=log_url
        )


def test_joined_rows_feed_an_aggregation_through_the_joins_topic(
    spark: Any, tmp_path: Path
) -> None:
    """Enrich, then count: an aggregation reads the join's topic (``topic=``) as its
    events — paid orders and the sum paid per hour — equal to the joined rows grouped."""
    from riverbed.stream import Aggregation, Count, Sum, Tumbling, read_results, start

    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(400, seed=8)
    send(log_url, "orders", orders, 3)
    send(log_url, "payments", payments, 2)
    join = Join(
        name="paid",
        left=Topic("orders", options={"schema": ORDERS}),
        right=Topic("payments", options={"schema": PAYMENTS}),
        on="order_id",
        time="ts",
        within=("10m", "1h"),
        topic="paid_rows",
        state_partitions=2,
    )
    drain(spark, join, tmp_path, log_url)
    hourly = Aggregation(
        name="paid_hourly",
        key="all",
        columns={"all": "'all'"},
        time="ts",
        window=Tumbling("1h"),
        watermark="3h",
        metrics={"pairs": Count(), "paid": Sum("paid")},
        state_partitions=1,
    )
    schema = "order_id long, amount double, ts timestamp, paid double, right_ts timestamp"
    query = start(
        spark,
        hourly,
        Topic("paid_rows", log=log_url, options={"schema": schema}),
        checkpoint=tmp_path / "agg-cp",
        output=tmp_path / "agg-out",
        log_url=log_url,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    joined = read_joined(tmp_path / "out")
    assert len(joined) > 100
    want = (
        joined.assign(window_start=joined["ts"].dt.floor("1h"))
        .groupby("window_start")
        .agg(pairs=("paid", "size"), paid=("paid", "sum"))
        .reset_index()
    )
    got = read_results(tmp_path / "agg-out")[["window_start", "pairs", "paid"]]
    assert got["pairs"].tolist() == want["pairs"].tolist()
    assert got["window_start"].tolist() == want["window_start"].tolist()
    assert np.allclose(got["paid"], want["paid"])


@pytest.mark.kafka
def test_one_side_in_kafka_joins_as_a_riverbed_topic_does(
    spark: Any, tmp_path: Path, kafka_server: Any, kafka_topic: str
) -> None:
    """Orders in a riverbed topic, payments in a Kafka topic (JSON values, keyed by the
    order): the joined rows are pandas' join, and a malformed Kafka record goes to the
    join's .dlq, counted."""
    import json

    from confluent_kafka import Producer

    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(300, seed=9)
    send(log_url, "orders", orders, 3)
    kafka_server.create_topic(kafka_topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap, "acks": "all"})
    for row in payments.astype({"ts": object}).to_dict("records"):
        value = {**row, "ts": pd.Timestamp(row["ts"]).isoformat()}
        producer.produce(kafka_topic, key=str(row["order_id"]), value=json.dumps(value))
    producer.produce(kafka_topic, key="x", value=b"{not json")
    assert producer.flush(30) == 0
    join = Join(
        name="paid",
        left=Topic("orders", options={"schema": ORDERS}),
        right=Topic(
            kafka_topic,
            log=f"kafka://{kafka_server.bootstrap}?serde=json",
            options={"schema": PAYMENTS},
        ),
        on="order_id",
        time="ts",
        within=("10m", "1h"),
        how="left",
        watermark="3h",
    )
    drain(spark, join, tmp_path, log_url)
    got = read_joined(tmp_path / "out")
    inner = oracle(replace(join, how="inner"), orders, payments)
    assert len(inner) > 100
    assert rows_of(got[got["paid"].notna()]) == rows_of(inner)
    batches = open_batches(tmp_path / "cp")
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None and totals["malformed"] == 1
    log = riverbed.log.open(log_url)
    (dlq,) = [r.value for r in log.read("paid.dlq", 0, 0, 10)]
    log.close()
    assert dlq["side"] == "right" and dlq["_error"]


def test_a_join_is_no_aggregation_to_the_commands_that_take_one(tmp_path: Path) -> None:
    """A join's checkpoint is not listed among the aggregations (the console, status by
    name) but among the joins; a command that takes an aggregation says what a join
    spec file is for."""
    from riverbed.errors import ConfigError
    from riverbed.stream.layout import JOIN, MANIFEST, aggregations, joins
    from riverbed.stream.specsource import load_spec

    root = tmp_path / "checkpoints"
    for name, marker in (("paid", JOIN), ("counts", MANIFEST)):
        (root / name / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / name / marker).write_text("{}")
        (root / name / "riverbed" / "batches").mkdir(parents=True, exist_ok=True)
        (root / name / "riverbed" / "batches" / "000000000000.json").write_text("{}")
    assert aggregations(root) == ["counts"] and joins(root) == ["paid"]
    spec = tmp_path / "paid.py"
    spec.write_text(
        "from riverbed.stream import Join\n"
        'join = Join(name="paid", left="o", right="p", on="k", window="1m")\n'
    )
    with pytest.raises(ConfigError, match=r"defines a stream-stream join .* `riverbed stream run`"):
        load_spec(spec)


def test_hostile_records_on_a_side_are_counted_and_sent_to_the_dlq(
    spark: Any, tmp_path: Path
) -> None:
    """A record without the key, one without a time, one whose time is no time, one
    before 1970 and bytes that are no JSON: each counted as malformed and sent to the
    join's .dlq with its reason; the good events still join, and the join goes on."""
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(60, seed=4)
    send(log_url, "orders", orders, 2)
    send(log_url, "payments", payments, 2)
    log = riverbed.log.open(log_url)
    bad = [
        {"order_id": None, "amount": 1.0, "ts": "2026-11-21T00:00:00Z"},
        {"order_id": 7, "amount": 1.0},
        {"order_id": 8, "amount": 1.0, "ts": "yesterday"},
        {"order_id": 9, "amount": 1.0, "ts": "1960-01-01T00:00:00Z"},
    ]
    log.producer("orders").send_batch(bad)
    log.storage.append("orders", 0, [RawRecord(now_ms(), None, b"{not json", {})])
    log.close()
    join = Join(
        name="paid", left="orders", right="payments", on="order_id", time="ts",
        within=("10m", "1h"), watermark="3h",
    )  # fmt: skip
    drain(spark, join, tmp_path, log_url)
    got = read_joined(tmp_path / "out")
    assert rows_of(got) == rows_of(oracle(join, orders, payments))
    batches = open_batches(tmp_path / "cp")
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None and totals["malformed"] == 5
    log = riverbed.log.open(log_url)
    reasons = sorted(str(r.value["_error"]) for r in log.read("paid.dlq", 0, 0, 100))
    log.close()
    assert len(reasons) == 5
    assert any("no order_id to join on" in r for r in reasons)
    assert any("no event time (ts)" in r for r in reasons)
    assert any("before 1970" in r for r in reasons)
    assert any("is not an ISO 8601 time" in r for r in reasons)
    # an order older than the watermark (about T0 - 1h): late — counted, sent whole to
    # .late, not joined
    stale = orders.iloc[:1].assign(order_id=10**5, ts=T0 - pd.Timedelta("1d"))
    send(log_url, "orders", stale, 2)
    drain(spark, join, tmp_path, log_url)
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None and totals["late"] == 1
    log = riverbed.log.open(log_url)
    (late,) = [r.value for r in log.read("paid.late", 0, 0, 10)]
    log.close()
    assert late["order_id"] == 10**5 and late["side"] == "left"
    assert late["amount"] == orders["amount"].iloc[0]
    assert 10**5 not in set(read_joined(tmp_path / "out")["order_id"])


def _frame(spark: Any, log_url: str, topic: str, schema: str) -> Any:
    """A riverbed topic as a streaming DataFrame (Spark's source of riverbed topics)."""
    from riverbed.stream import register

    register(spark)
    return (
        spark.readStream.format("riverbed")
        .option("topic", topic)
        .option("log", log_url)
        .option("schema", schema)
        .option("maxRecordsPerBatch", 150)
        .load()
    )


@pytest.mark.parametrize(("kind", "how"), [("within", "left"), ("window", "inner")])
def test_a_join_of_two_dataframes_over_restarts_equals_the_batch_join(
    spark: Any, tmp_path: Path, kind: str, how: str
) -> None:
    """The DataFrame path (both sides Frame(df): one Spark streaming query over their
    union): restarted between backlogs, every row once, as on the log-native path (the
    window join with a where on its right side: the same read tasks apply it)."""
    from riverbed.stream.doors import Frame

    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(600, seed=4)
    shape: dict[str, Any] = {"within": ("10m", "1h")} if kind == "within" else {"window": "30m"}

    def join() -> Join:
        return Join(
            name="paid",
            left=Frame(_frame(spark, log_url, "orders", ORDERS)),
            right=Frame(_frame(spark, log_url, "payments", PAYMENTS)),
            on="order_id",
            time="ts",
            how=how,  # type: ignore[arg-type]
            watermark="2h",
            state_partitions=3,
            where={"right": "paid >= 30"} if kind == "window" else None,
            **shape,
        )

    def drain_frames() -> None:
        query = start_join(
            spark, join(), checkpoint=tmp_path / "cp", output=tmp_path / "out",
            log_url=log_url, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()
        assert query.exception() is None

    cuts = [0, 200, 400, 600]
    for a, b in itertools.pairwise(cuts):
        send(log_url, "orders", orders.iloc[a:b], 3)
        lo, hi = orders["ts"].iloc[a], orders["ts"].iloc[b - 1]
        chunk = payments[(payments["ts"] > lo) & (payments["ts"] <= hi)] if a else None
        send(log_url, "payments", payments[payments["ts"] <= hi] if chunk is None else chunk, 2)
        drain_frames()
    rest = payments[payments["ts"] > orders["ts"].iloc[-1]]
    late = pd.DataFrame({"order_id": [10**6], "amount": [1000.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "payments", pd.concat([rest, late.rename(columns={"amount": "paid"})]), 2)
    send(log_url, "orders", late, 3)
    drain_frames()
    # a micro-batch only runs with new events: one more on each side moves the watermark
    # past the far-later ones' predecessors (the left join's unmatched orders are due)
    later = late.assign(order_id=10**6 + 1, ts=T0 + pd.Timedelta("4d"))
    send(log_url, "orders", later, 3)
    send(log_url, "payments", later.rename(columns={"amount": "paid"}), 2)
    drain_frames()
    kept = payments[payments["paid"] >= 30] if kind == "window" else payments
    newest = _every_row_once(tmp_path, oracle(join(), orders, kept))
    assert (newest.totals["filtered"] > 0) == (kind == "window")
    assert newest.sources is None  # Spark's checkpoint holds the sources' offsets
    info = status(join(), tmp_path / "cp", default_state(tmp_path / "cp"), log_url)
    assert info["sides"]["left"]["topic"] == "(a DataFrame)"
    assert info["sides"]["left"]["lag"] is None and "lag_error" not in info["sides"]["left"]


def test_a_dataframe_side_beside_a_topic_is_refused_with_the_fix(
    spark: Any, tmp_path: Path
) -> None:
    from riverbed.stream.doors import Frame

    log_url = f"file://{tmp_path / 'log'}"
    send(log_url, "orders", orders_and_payments(5, seed=1)[0], 3)
    join = Join(
        name="j", left=Frame(_frame(spark, log_url, "orders", ORDERS)), right="payments",
        on="order_id", time="ts", window="1m",
    )  # fmt: skip
    with pytest.raises(StreamValueError, match=r"give both as Frame\(df\)"):
        start_join(spark, join, checkpoint=tmp_path / "cp", output=tmp_path / "o", log_url=log_url)
    assert not (tmp_path / "cp").exists()  # refused before the checkpoint records anything


def test_each_sides_where_keeps_its_events_as_sql_would(spark: Any, tmp_path: Path) -> None:
    """``where`` per side: an event it does not keep is never buffered nor paired (a
    left join emits no unmatched row for it) and is counted as filtered; a row it fails
    to evaluate (Spark's ANSI CAST error) is malformed, sent to the .dlq naming the
    condition; one that cannot be evaluated at all is refused at start."""
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(400, seed=6)
    rng = np.random.default_rng(6)
    payments = payments.assign(note=rng.choice(["1", "2", "0", "oops"], len(payments),
                                               p=[0.5, 0.3, 0.15, 0.05]))  # fmt: skip
    schema = "order_id long, paid double, note string, ts timestamp"

    def join(where: dict[str, str]) -> Join:
        return Join(
            name="paid", left=Topic("orders", options={"schema": ORDERS}),
            right=Topic("payments", options={"schema": schema}), on="order_id", time="ts",
            within=("10m", "1h"), how="left", watermark="2h", state_partitions=3, where=where,
        )  # fmt: skip

    send(log_url, "orders", orders, 3)
    send(log_url, "payments", payments, 2)
    for bad, why in [
        ({"right": "nope > 1"}, r"the right side's where: .*nope"),
        ({"left": "amount + 1"}, r"the left side's where: .* not a condition"),
    ]:
        with pytest.raises(StreamValueError, match=why):
            start_join(
                spark, join(bad), checkpoint=tmp_path / "cp", output=tmp_path / "out",
                log_url=log_url,
            )  # fmt: skip
    assert not (tmp_path / "cp").exists()
    where = {"left": "amount >= 100", "right": "CAST(note AS INT) > 0"}
    flush = pd.DataFrame({"order_id": [10**6], "amount": [1000.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "orders", flush, 3)
    send(log_url, "payments", flush.rename(columns={"amount": "paid"}).assign(note="1"), 2)
    query = start_join(
        spark, join(where), checkpoint=tmp_path / "cp", output=tmp_path / "out",
        log_url=log_url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    kept_orders = orders[orders["amount"] >= 100]
    numbers = pd.to_numeric(payments["note"], errors="coerce")
    kept_payments = payments[numbers > 0].drop(columns=["note"])
    want = oracle(join(where), kept_orders, kept_payments)
    got = read_joined(tmp_path / "out")
    got = got[got["order_id"] < 10**6]
    assert rows_of(got) == rows_of(want)
    assert want["paid"].isna().any() and len(want) > 50
    batches = open_batches(tmp_path / "cp")
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None
    assert totals["filtered"] == int((orders["amount"] < 100).sum() + (numbers == 0).sum())
    assert totals["malformed"] == int(numbers.isna().sum()) > 0
    info = status(join(where), tmp_path / "cp", default_state(tmp_path / "cp"), log_url)
    assert info["filtered"] == totals["filtered"]
    log = riverbed.log.open(log_url)
    reasons = [str(r.value["_error"]) for r in log.read("paid.dlq", 0, 0, 1000)]
    log.close()
    assert len(reasons) == totals["malformed"]
    assert all(r.startswith("where: ") and "CAST(note AS INT)" in r for r in reasons), reasons


def test_derived_columns_of_each_side_join_filter_and_are_kept_as_sql_would(
    spark: Any, tmp_path: Path
) -> None:
    """``columns`` per side: the payments carry their order as text (``"o-17"``); a
    derived column casts it to the key they are joined on, another (the amount in
    cents) is what the right side's ``where`` reads and is in the joined rows; a row a
    derived column fails on (ANSI CAST) is malformed, the reason naming the column; one
    that cannot be compiled, or that has a field's name, is refused at start."""
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(400, seed=9)
    rng = np.random.default_rng(9)
    ref = "o-" + payments["order_id"].astype(str)
    ref[rng.random(len(ref)) < 0.04] = "o-oops"
    payments = payments.drop(columns=["order_id"]).assign(ref=ref.to_numpy())
    schema = "ref string, paid double, ts timestamp"

    def join(columns: dict[str, dict[str, str]]) -> Join:
        return Join(
            name="paid", left=Topic("orders", options={"schema": ORDERS}),
            right=Topic("payments", options={"schema": schema}), on=("order_id", "oid"),
            time="ts", within=("10m", "1h"), how="left", watermark="2h", state_partitions=3,
            columns=columns, where={"right": "cents >= 5000"},
        )  # fmt: skip

    send(log_url, "orders", orders, 3)
    log = riverbed.log.open(log_url)
    log.create_topic("payments", 2)
    rows = payments.astype({"ts": object}).to_dict("records")
    log.producer("payments").send_batch(
        [{**r, "ts": pd.Timestamp(r["ts"]).isoformat()} for r in rows], key_field="ref"
    )
    log.close()
    good = {
        "right": {"oid": "CAST(substr(ref, 3) AS BIGINT)", "cents": "CAST(paid * 100 AS BIGINT)"}
    }
    for bad, why in [
        ({"right": {"oid": "nope + 1", "cents": "1"}}, r"right side's columns\['oid'\]: .*nope"),
        ({"right": {"ref": "'x'", "oid": "1", "cents": "1"}}, r"columns\['ref'\] is the name of"),
        ({"right": {"oid": "1"}}, r"right side's where: .*cents"),
    ]:
        with pytest.raises(StreamValueError, match=why):
            start_join(
                spark, join(bad), checkpoint=tmp_path / "cp", output=tmp_path / "out",
                log_url=log_url,
            )  # fmt: skip
    with pytest.raises(StreamValueError, match="maps each new column's name"):
        join({"right": {"bad name": "1"}})
    assert not (tmp_path / "cp").exists()
    flush = pd.DataFrame({"order_id": [10**6], "amount": [1000.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "orders", flush, 3)
    log = riverbed.log.open(log_url)
    log.producer("payments").send_batch(
        [{"ref": f"o-{10**6}", "paid": 1000.0, "ts": flush["ts"].iloc[0].isoformat()}]
    )
    log.close()
    query = start_join(
        spark, join(good), checkpoint=tmp_path / "cp", output=tmp_path / "out",
        log_url=log_url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()

    oid = pd.to_numeric(payments["ref"].str[2:], errors="coerce")
    readable = payments.assign(order_id=oid, cents=(payments["paid"] * 100).astype("int64"))
    kept = readable[oid.notna() & (readable["cents"] >= 5000)].astype({"order_id": "int64"})
    want = oracle(join(good), orders, kept.drop(columns=["ref", "cents"]))
    want = want.merge(kept[["order_id", "ts", "ref", "cents"]].rename(columns={"ts": "right_ts"}),
                      on=["order_id", "right_ts"], how="left")  # fmt: skip
    got = read_joined(tmp_path / "out")
    got = got[got["order_id"] < 10**6]
    assert list(got.columns) == ["order_id", "amount", "ts", "ref", "paid", "right_ts", "oid",
                                 "cents", "batch_id"]  # fmt: skip
    assert rows_of(got) == rows_of(want) and len(want) > 50
    assert (got["oid"].dropna() == got["order_id"][got["oid"].notna()]).all()
    assert sorted(got["cents"].dropna()) == sorted(want["cents"].dropna())
    batches = open_batches(tmp_path / "cp")
    totals = batches.get(batches.ids()[-1]).totals  # type: ignore[union-attr]
    assert totals is not None
    # as in SQL, the key is derived for the events where keeps: one it drops is filtered,
    # whatever its ref (the right side's where needs cents only)
    assert totals["malformed"] == int((oid.isna() & (readable["cents"] >= 5000)).sum()) > 0
    assert totals["filtered"] == int((readable["cents"] < 5000).sum())
    log = riverbed.log.open(log_url)
    reasons = [str(r.value["_error"]) for r in log.read("paid.dlq", 0, 0, 1000)]
    log.close()
    assert len(reasons) == totals["malformed"]
    assert all(r.startswith("columns['oid']: ") for r in reasons), reasons
    # the checkpoint's manifest says what the console shows of them
    from riverbed.stream.specjob import read_manifest

    described = read_manifest(tmp_path / "cp")
    assert described is not None and described["columns"] == good


def test_an_interval_ended_sooner_by_a_column_of_the_left_side(spark: Any, tmp_path: Path) -> None:
    """``until``: each order's own ``due`` time ends its interval (Nexmark q9's auction
    ``expires``): a payment after it does not pair, one with no ``due`` pairs with
    nothing (a left join emits it unmatched); a column that is missing or no timestamp
    is refused at start, as is the join's shape changed under its checkpoint."""
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(500, seed=8)
    rng = np.random.default_rng(8)
    due = orders["ts"] + pd.to_timedelta(rng.integers(0, 50 * 60_000, len(orders)), unit="ms")
    orders = orders.assign(due=due.where(rng.random(len(orders)) > 0.05))
    schema = "order_id long, amount double, due timestamp, ts timestamp"
    text = orders.assign(due=[None if pd.isna(v) else v.isoformat() for v in orders["due"]])
    flush = pd.DataFrame(
        {"order_id": [10**6], "amount": [0.0], "due": [None], "ts": [T0 + pd.Timedelta("3d")]}
    )
    send(log_url, "orders", pd.concat([text, flush]), 3)
    send(log_url, "payments", pd.concat([payments, flush.drop(columns=["due"]).rename(
        columns={"amount": "paid"})]), 2)  # fmt: skip

    def join(until: str | None) -> Join:
        return Join(
            name="due", left=Topic("orders", options={"schema": schema}),
            right=Topic("payments", options={"schema": PAYMENTS}), on="order_id", time="ts",
            within=("10m", "1h"), until=until, how="left", watermark="2h", state_partitions=3,
        )  # fmt: skip

    def run(j: Join) -> None:
        start_join(
            spark, j, checkpoint=tmp_path / "cp", output=tmp_path / "out", log_url=log_url,
            trigger={"availableNow": True},
        ).awaitTermination()  # fmt: skip

    for bad, why in [("paid_at", "not a field of the left"), ("amount", "not a timestamp")]:
        with pytest.raises(StreamValueError, match=f"until='{bad}' is {why}"):
            run(join(bad))
    with pytest.raises(StreamValueError, match="give within="):
        Join(name="j", left="a", right="b", on="k", window="1m", until="due")
    run(join("due"))
    both = orders.merge(payments, on="order_id", suffixes=("", "_right"))
    both = both.rename(columns={"ts_right": "right_ts"})
    gap = both["right_ts"] - both["ts"]
    hit = (gap >= -pd.Timedelta("10m")) & (gap <= pd.Timedelta("1h"))
    hit &= both["due"].notna() & (both["right_ts"] <= both["due"])
    pairs = both.loc[hit]
    want = pd.concat([pairs, orders[~orders["order_id"].isin(pairs["order_id"])]])
    assert hit.sum() < (gap.between(-pd.Timedelta("10m"), pd.Timedelta("1h"))).sum()
    got = read_joined(tmp_path / "out")
    assert rows_of(got[got["order_id"] < 10**6]) == rows_of(want)
    with pytest.raises(StreamValueError, match=r"until='due'.*not until=None"):
        run(join(None))
