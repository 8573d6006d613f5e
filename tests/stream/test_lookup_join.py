"""Lookup joins' rows (``Join(left=topic, right=Lookup(...))``, riverbed.stream.lookupjoin)
on a real Spark session and real topics: every event enriched from the table as it was
when its batch was planned — a table changed between backlogs enriches the later events
only, a batch run again joins with its plan's version — each row once, as pandas'
merge of the events read back with each batch's table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import riverbed.log
from riverbed.stream.batchlog import open_batches
from riverbed.stream.doors import Frame, Topic
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import read_joined, start_join, status
from riverbed.stream.joins import Join, Lookup
from riverbed.stream.layout import checkpoint_store, commit_key, default_state
from tests.stream.conftest import T0
from tests.stream.test_stream_join import drain

pytestmark = pytest.mark.spark

ORDERS = "order_id long, customer long, amount double, ts timestamp"


def orders(n: int, seed: int, start: int = 0) -> pd.DataFrame:
    """Orders by customers 0..59 (60..69 are in no table: unmatched), a few without one."""
    rng = np.random.default_rng(seed)
    customer = pd.array(rng.integers(0, 70, n), dtype="Int64")
    customer[rng.random(n) < 0.03] = pd.NA
    return pd.DataFrame(
        {
            "order_id": np.arange(start, start + n),
            "customer": customer,
            "amount": rng.integers(1, 500, n).astype(float),
            "ts": T0 + pd.to_timedelta(np.sort(rng.integers(0, 3_600_000, n)), unit="ms"),
        }
    )


def customers(version: int) -> pd.DataFrame:
    """The table: customers 0..49, then (version 2) renamed 0..9 and added 50..59."""
    ids = np.arange(50 if version == 1 else 60)
    names = [f"c{i}" if version == 1 or i >= 10 else f"c{i}-v2" for i in ids]
    return pd.DataFrame(
        {
            "id": ids,
            "name": names,
            "tier": (ids % 3).astype(np.int32),
            "since": T0 - pd.to_timedelta(ids, unit="D"),
        }
    )


def write_table(path: Path, frame: pd.DataFrame) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path / "part-0.parquet")


def send(log_url: str, topic: str, frame: pd.DataFrame) -> None:
    log = riverbed.log.open(log_url)
    if topic not in log.topics():
        log.create_topic(topic, 3)
    rows = frame.astype({"ts": object, "customer": object}).to_dict("records")
    log.producer(topic).send_batch(
        [
            {**r, "customer": None if pd.isna(r["customer"]) else int(r["customer"]),
             "ts": pd.Timestamp(r["ts"]).isoformat()}
            for r in rows
        ],
        key_field="order_id",
    )  # fmt: skip
    log.close()


def oracle(events: pd.DataFrame, table: pd.DataFrame, how: str) -> pd.DataFrame:
    """pandas' merge: the events with the table's name, tier and since."""
    got = events.merge(table, left_on="customer", right_on="id", how=how).drop(columns=["id"])
    return got


def rows_of(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    cols = ["order_id", "customer", "amount", "ts", "name", "tier", "since"]
    out = frame[cols].astype(object).where(frame[cols].notna(), None)
    return sorted(
        (
            tuple(
                pd.Timestamp(v).value if isinstance(v, pd.Timestamp | np.datetime64) else v
                for v in r
            )
            for r in out.itertuples(index=False)
        ),
        key=lambda r: r[0],
    )


@pytest.mark.parametrize(
    ("how", "in_driver", "parts"),
    [("left", True, None), ("inner", True, None), ("left", False, None), ("inner", True, 3),
     ("left", False, 3)],
)  # fmt: skip
def test_each_batch_joins_with_the_table_as_of_its_plan(
    spark: Any, tmp_path: Path, how: str, in_driver: bool, parts: int | None
) -> None:
    """(``parts``: the table held in parts, each task reading the parts its events'
    keys need — on the driver's threads and in Spark's tasks alike.)"""
    log_url = f"file://{tmp_path / 'log'}"
    table = tmp_path / "customers"
    jobs = {} if in_driver else {"driverBatchRecords": "0"}
    join = Join(
        name="named",
        left=Topic("orders", options={"schema": ORDERS, **jobs}),
        right=Lookup(str(table), on=("customer", "id"), how=how, parts=parts),  # type: ignore[arg-type]
        time="ts",
        topic="orders_named",
    )
    first, second = orders(300, seed=5), orders(300, seed=6, start=300)
    write_table(table, customers(1))
    send(log_url, "orders", first)
    jobs_ran = drain(spark, join, tmp_path, log_url)
    assert (jobs_ran == 0) == in_driver  # small batches in the driver, or Spark jobs
    write_table(table, customers(2))  # renamed and added customers: later events only
    send(log_url, "orders", second)
    drain(spark, join, tmp_path, log_url)

    want = pd.concat([oracle(first, customers(1), how), oracle(second, customers(2), how)])
    got = read_joined(tmp_path / "out")
    assert rows_of(got) == rows_of(want)  # every row once, each with its batch's table
    assert list(got.columns) == [
        "order_id", "customer", "amount", "ts", "name", "tier", "since", "batch_id"
    ]  # fmt: skip
    alone = int(first["customer"].isna().sum() + (first["customer"] >= 50).sum())
    alone += int(second["customer"].isna().sum() + (second["customer"] >= 60).sum())
    batches = open_batches(tmp_path / "cp")
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.done and newest.totals is not None
    assert (newest.totals["joined"], newest.totals["unmatched"]) == (600 - alone, alone)
    assert newest.totals["input"] == 600 and newest.totals["malformed"] == 0
    assert newest.watermark_ms == 0  # nothing waits, nothing is late
    from riverbed.stream.lookupparts import parted

    ids = [str(d["id"]) for b in batches.ids() for d in batches.get(b).lookups or ()]
    assert ids and all(parted(i) == (parts or 0) for i in ids)  # whole, or in 3 parts

    # the join's topic holds the same rows, once
    log = riverbed.log.open(log_url)
    on_topic = sum(o.end - o.start for o in log.offsets("orders_named"))
    log.close()
    assert on_topic == len(want)

    # status: the left side's lag, the table as its right side (no state held)
    info = status(join, tmp_path / "cp", default_state(tmp_path / "cp"), log_url)
    assert info["sides"]["left"]["lag"] == 0
    right = info["sides"]["right"]
    assert right["table"] == str(table) and right["held"] == 0 and right["read_at"]


def test_a_batch_run_again_joins_with_its_plans_version(spark: Any, tmp_path: Path) -> None:
    """The newest batch, planned and then (as after a crash) not done, runs again after
    the table changed: it replaces its rows with the ones its plan's snapshot gives."""
    log_url = f"file://{tmp_path / 'log'}"
    table = tmp_path / "customers"
    join = Join(
        name="named",
        left=Topic("orders", options={"schema": ORDERS}),
        right=Lookup(str(table), on=("customer", "id")),
        time="ts",
    )
    events = orders(200, seed=8)
    write_table(table, customers(1))
    send(log_url, "orders", events)
    drain(spark, join, tmp_path, log_url)
    before = read_joined(tmp_path / "out")
    batches = open_batches(tmp_path / "cp")
    newest_id = batches.ids()[-1]
    newest = batches.get(newest_id)
    assert newest is not None and newest.lookups
    # as if the driver died before its commit, its rows not written yet
    checkpoint_store(tmp_path / "cp").delete_many([commit_key(newest_id)])
    checkpoint_store(tmp_path / "out").delete_many([f"batch_id={newest_id}/part-00000.parquet"])
    assert not open_batches(tmp_path / "cp").get(newest_id).done  # type: ignore[union-attr]
    write_table(table, customers(2))
    drain(spark, join, tmp_path, log_url)
    assert rows_of(read_joined(tmp_path / "out")) == rows_of(before)
    assert open_batches(tmp_path / "cp").ids()[-1] == newest_id  # run again, not planned anew


def test_a_lookup_join_refuses_what_it_cannot_do_with_the_fix(spark: Any, tmp_path: Path) -> None:
    table = Lookup("t.parquet", on="customer")
    with pytest.raises(StreamValueError, match="window= is a stream-stream join's"):
        Join(name="j", left="orders", right=table, window="1m")
    with pytest.raises(StreamValueError, match="within= is a stream-stream join's"):
        Join(name="j", left="orders", right=table, within=("0s", "1m"))
    with pytest.raises(StreamValueError, match=r"name the key once, in Lookup\(on=\.\.\.\)"):
        Join(name="j", left="orders", right=table, on="order_id")
    with pytest.raises(StreamValueError, match="it has no where"):
        Join(name="j", left="orders", right=table, where={"right": "tier = 1"})
    with pytest.raises(StreamValueError, match="on= names the key column"):
        Join(name="j", left="orders", right="payments", window="1m")
    # the defaults: the Lookup's key and how; the Join's how when given
    assert Join(name="j", left="orders", right=table).how == "left"
    assert Join(name="j", left="orders", right=table, how="inner").how == "inner"
    assert Join(name="j", left="o", right="p", on="k", window="1m").how == "inner"

    # at start: a key of another type than the table's, a table without the key
    log_url = f"file://{tmp_path / 'log'}"
    send(log_url, "orders", orders(5, seed=1))
    write_table(tmp_path / "names", pd.DataFrame({"id": ["a", "b"], "name": ["x", "y"]}))
    text_keyed = Join(
        name="j", left=Topic("orders", options={"schema": ORDERS}),
        right=Lookup(str(tmp_path / "names"), on=("customer", "id")),
    )  # fmt: skip
    with pytest.raises(StreamValueError, match=r"customer.* is int64 and the table's 'id' is"):
        drain(spark, text_keyed, tmp_path, log_url)
    no_key = replace(text_keyed, right=Lookup(str(tmp_path / "names"), on=("customer", "cid")))
    with pytest.raises(Exception, match="the table has no column 'cid' to join on"):
        drain(spark, no_key, tmp_path / "again", log_url)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_derived_column_is_the_key_of_a_lookup(spark: Any, tmp_path: Path) -> None:
    """Nexmark q13's shape: the table is keyed by ``customer % 50`` (a derived column of
    the events, ``columns=``), which the rows keep; the left side's where reads it."""
    log_url = f"file://{tmp_path / 'log'}"
    table = tmp_path / "customers"
    join = Join(
        name="named",
        left=Topic("orders", options={"schema": ORDERS}),
        right=Lookup(str(table), on=("bucket", "id"), how="inner"),
        time="ts",
        columns={"left": {"bucket": "customer % 50"}},
        where={"left": "bucket < 40"},
    )
    events = orders(300, seed=11)
    write_table(table, customers(1))
    send(log_url, "orders", events)
    drain(spark, join, tmp_path, log_url)
    bucket = events["customer"] % 50
    kept = events.assign(bucket=bucket)[bucket.notna() & (bucket < 40)]
    want = kept.merge(customers(1), left_on="bucket", right_on="id").drop(columns=["id"])
    got = read_joined(tmp_path / "out")
    assert rows_of(got) == rows_of(want) and len(want) > 100
    assert (got["bucket"] == got["customer"] % 50).all()
    with pytest.raises(StreamValueError, match="derive columns of the left side"):
        replace(join, columns={"right": {"x": "1"}})


@pytest.mark.parametrize(("how", "parts"), [("left", None), ("inner", None), ("left", 4)])
def test_a_dataframes_events_are_enriched_as_of_each_micro_batch(
    spark: Any, tmp_path: Path, how: str, parts: int | None
) -> None:
    """The DataFrame path: ``Join(left=Frame(df), right=Lookup(...))`` — one Spark
    streaming query over the left DataFrame, each micro-batch joined with the table's
    snapshot its record names (planned before anything of it is written): a table
    changed between backlogs enriches the later events only, each row once."""
    from riverbed.stream import register

    register(spark)
    log_url = f"file://{tmp_path / 'log'}"
    table = tmp_path / "customers"

    def drain_frame() -> None:
        frame = (
            spark.readStream.format("riverbed").option("topic", "orders")
            .option("log", log_url).option("schema", ORDERS)
            .option("maxRecordsPerBatch", 120).load()
        )  # fmt: skip
        join = Join(
            name="named", left=Frame(frame), time="ts", topic="orders_named",
            right=Lookup(str(table), on=("customer", "id"), how=how, parts=parts),  # type: ignore[arg-type]
        )  # fmt: skip
        query = start_join(
            spark, join, checkpoint=tmp_path / "cp", output=tmp_path / "out",
            log_url=log_url, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()
        assert query.exception() is None

    first, second = orders(300, seed=5), orders(300, seed=6, start=300)
    write_table(table, customers(1))
    send(log_url, "orders", first)
    drain_frame()
    write_table(table, customers(2))  # renamed and added customers: later events only
    send(log_url, "orders", second)
    drain_frame()

    want = pd.concat([oracle(first, customers(1), how), oracle(second, customers(2), how)])
    got = read_joined(tmp_path / "out")
    assert rows_of(got) == rows_of(want)  # every row once, each with its batch's table
    batches = open_batches(tmp_path / "cp")
    records = [batches.get(b) for b in batches.ids()]
    assert len(records) >= 6 and all(r is not None and r.done and r.lookups for r in records)
    held = {r.lookups[0]["id"] for r in records if r is not None and r.lookups}
    assert len(held) == 2 and all(i.endswith(".p4") == bool(parts) for i in held)
    newest = records[-1]
    assert newest is not None and newest.totals is not None
    alone = int(first["customer"].isna().sum() + (first["customer"] >= 50).sum())
    alone += int(second["customer"].isna().sum() + (second["customer"] >= 60).sum())
    assert (newest.totals["joined"], newest.totals["unmatched"]) == (600 - alone, alone)
    log = riverbed.log.open(log_url)
    on_topic = sum(o.end - o.start for o in log.offsets("orders_named"))
    log.close()
    assert on_topic == len(want)  # the join's topic: the same rows, once
