"""Stream-stream joins: riverbed beside Flink SQL on the same events, each answer checked
against DuckDB.

    .venv/bin/python benchmarks/joins.py [--orders 200000] [--batches 10] [--no-flink]

**Events.** Orders (one every ``1000 / --rate`` ms of event time, 50,000 customers)
and their payments: 80 % of orders paid once, a tenth of those twice, each payment
between 5 minutes before and 90 minutes after its order; both in time order, as a log
receives them (payments sorted by their own time).

**Queries.**

* ``interval``: each order with its payments 10 minutes before to 1 hour after it,
  unpaid orders kept (``how="left"``; Flink SQL: an interval join, ``LEFT JOIN … ON
  p.ts BETWEEN o.ts - INTERVAL '10' MINUTE AND o.ts + INTERVAL '1' HOUR``);
* ``window``: orders and payments of the same customer in the same 10-minute tumbling
  window (Nexmark q8's shape: persons and the auctions they opened in one window;
  Flink SQL: the window join of two ``TUMBLE`` table functions).

**Where they go.** Typed riverbed topics (4 partitions each, keyed by the join key),
CSV files for Flink (one per source task, each in time order), DataFrames for DuckDB.
riverbed runs from its topics with ``availableNow`` in ``--batches`` batches per side;
Flink from submission to its last row (its fixed cost, a job over 1,000 events, is
reported beside). Every answer is compared with DuckDB's: IDENTICAL, or what differs.
Prints events/s per query per system and riverbed / Flink.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import riverbed.log
from riverbed.stream import Join, Topic, read_joined

HERE = Path(__file__).resolve().parent
BASE = pd.Timestamp("2026-11-20", tz="UTC")
ORDERS = "customer long, order_id long, amount double, ts timestamp"
PAYMENTS = "customer long, order_id long, paid double, ts timestamp"
WATERMARK = "2h"  # > the payments' disorder (their times reach 90 minutes past an order)


def generate(orders: int, seed: int = 1, rate: int = 100) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    ts = BASE + pd.to_timedelta(np.arange(orders) * (1000 // rate), unit="ms")
    o = pd.DataFrame(
        {
            "customer": rng.integers(0, 50_000, orders),
            "order_id": np.arange(orders),
            "amount": rng.integers(1, 100_000, orders) / 100,
            "ts": ts,
        }
    )
    paid = o.sample(frac=0.8, random_state=seed)
    paid = pd.concat([paid, paid.sample(frac=0.1, random_state=seed + 1)])
    shift = pd.to_timedelta(rng.integers(-5 * 60_000, 90 * 60_000, len(paid)), unit="ms")
    p = pd.DataFrame(
        {
            "customer": paid["customer"].to_numpy(),
            "order_id": paid["order_id"].to_numpy(),
            "paid": paid["amount"].to_numpy(),
            "ts": (paid["ts"] + shift).to_numpy(),
        }
    ).sort_values("ts", kind="stable", ignore_index=True)
    return o, p


def joins() -> dict[str, Join]:
    sides = {
        "left": Topic("orders", options={"schema": ORDERS}),
        "right": Topic("payments", options={"schema": PAYMENTS}),
    }
    return {
        "interval": Join(
            name="interval",
            on="order_id",
            time="ts",
            within=("10m", "1h"),
            how="left",
            watermark=WATERMARK,
            **sides,
        ),
        "window": Join(
            name="window",
            on="customer",
            time="ts",
            window="10m",
            watermark=WATERMARK,
            **sides,
        ),
    }


END = -1  # the order id (and customer) of the far-later events that end the input


def fill(url: str, orders: pd.DataFrame, payments: pd.DataFrame) -> None:
    log = riverbed.log.open(url)
    for topic, frame, schema in (("orders", orders, ORDERS), ("payments", payments, PAYMENTS)):
        log.create_topic(topic, 4, schema=schema)
        producer = log.producer(topic)
        for i in range(0, len(frame), 100_000):
            producer.send_batch(
                frame.iloc[i : i + 100_000].to_dict("records"), key_field="order_id"
            )
    log.close()


def end(url: str, orders: pd.DataFrame, payments: pd.DataFrame) -> None:
    """One event a day after the rest on each side, sent once the rest is joined: its
    time moves the watermark past every order and payment, as the end of Flink's
    bounded input does (its watermark goes to the maximum), so a left join's unpaid
    orders are all emitted. (Sent with the rest, an end event read early from one log
    partition would make the other partitions' last events late: the watermark is the
    newest event time seen, as Spark's.) The checks leave them out."""
    log = riverbed.log.open(url)
    later = orders["ts"].max() + pd.Timedelta("1d")
    for topic, frame in (("orders", orders), ("payments", payments)):
        last = frame.iloc[:1].assign(customer=END, order_id=END, ts=later)
        log.producer(topic).send_batch(last.to_dict("records"), key_field="order_id")
    log.close()


def run_riverbed(
    spark: Any, url: str, root: Path, join: Join, batch: int, ending: tuple[pd.DataFrame, ...]
) -> tuple[float, pd.DataFrame]:
    """The join over a log filled by :func:`fill` (each join its own: the end events
    go into it), then its end; the seconds of both runs and the joined rows."""
    from riverbed.stream.joinquery import start_join as start

    began = time.perf_counter()
    query = start(
        spark, join, checkpoint=root / "cp" / join.name, output=root / "out" / join.name,
        log_url=url, trigger={"availableNow": True}, max_records=batch,
    )  # fmt: skip
    query.awaitTermination()
    seconds = time.perf_counter() - began
    end(url, *ending)  # the input's end (not timed: Flink's is the end of its files)
    began = time.perf_counter()
    start(
        spark, join, checkpoint=root / "cp" / join.name, output=root / "out" / join.name,
        log_url=url, trigger={"availableNow": True}, max_records=batch,
    ).awaitTermination()  # fmt: skip
    seconds += time.perf_counter() - began
    got = read_joined(root / "out" / join.name)
    return seconds, got[got["order_id"] != END]


def duckdb_answer(query: str, orders: pd.DataFrame, payments: pd.DataFrame) -> pd.DataFrame:
    import duckdb

    con = duckdb.connect()
    con.register("orders", orders)
    con.register("payments", payments)
    if query == "interval":
        sql = """SELECT o.order_id, o.ts, p.ts AS right_ts FROM orders o LEFT JOIN payments p
                 ON o.order_id = p.order_id
                 AND p.ts BETWEEN o.ts - INTERVAL 10 MINUTE AND o.ts + INTERVAL 1 HOUR"""
    else:
        sql = """SELECT o.order_id, o.ts, p.ts AS right_ts FROM orders o JOIN payments p
                 ON o.customer = p.customer
                 AND time_bucket(INTERVAL 10 MINUTE, o.ts)
                   = time_bucket(INTERVAL 10 MINUTE, p.ts)"""
    return con.execute(sql).df()


def _pairs(frame: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(order, its time, the payment's time or -1), as ms, sorted."""
    ts = pd.to_datetime(frame["ts"], utc=True).dt.as_unit("ms").astype("int64")
    right = pd.to_datetime(frame["right_ts"], utc=True).dt.as_unit("ms")
    rts = np.where(right.isna(), -1, right.fillna(pd.Timestamp(0, tz="UTC")).astype("int64"))
    return sorted(
        zip(frame["order_id"].astype(int).tolist(), ts.tolist(), rts.tolist(), strict=True)
    )


def compare(got: pd.DataFrame, want: pd.DataFrame) -> str:
    a, b = _pairs(got), _pairs(want)
    if a == b:
        return "IDENTICAL"
    return f"DIFFERENT: {len(a)} rows, DuckDB {len(b)}"


def run_flink(python: Path, orders: Path, payments: Path, query: str) -> dict[str, Any]:
    from flink_peer import run_script

    delay = str(int(pd.Timedelta(WATERMARK).total_seconds()))
    return run_script(python, HERE / "joins_flink.py", str(orders), str(payments), query, delay)


def flink_check(rows: list[list[Any]], want: pd.DataFrame) -> str:
    got = sorted((int(o), int(t), int(r) if r not in ("", None) else -1) for o, t, r in rows)
    return "IDENTICAL" if got == _pairs(want) else f"DIFFERENT: {len(got)} rows, DuckDB {len(want)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--only", default="interval,window")
    parser.add_argument("--no-flink", action="store_true")
    args = parser.parse_args()
    from riverbed.config import SparkConfig
    from riverbed.spark import session

    orders, payments = generate(args.orders)
    events = len(orders) + len(payments)
    print(f"{len(orders):,} orders, {len(payments):,} payments", flush=True)
    sys.path.insert(0, str(HERE))
    from flink_peer import flink_python, write_csv

    flink = None if args.no_flink else flink_python()
    spark = session(SparkConfig(master="local[2]", app_name="riverbed-bench-joins"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="rb-joins-") as tmp:
        root = Path(tmp)
        csv_o = write_csv(orders, root / "csv" / "orders")
        csv_p = write_csv(payments, root / "csv" / "payments")
        per_batch = -(-max(len(orders), len(payments)) // args.batches)
        # a warm-up: Spark's workers and the code paths, on a small join of its own
        small_o, small_p = generate(2_000, seed=9)
        warm = f"file://{root / 'warm'}"
        fill(warm, small_o, small_p)
        run_riverbed(spark, warm, root / "warmup", joins()["interval"], 1_000, (small_o, small_p))
        fixed = None
        if flink is not None:
            fo, fp = generate(500, seed=9)
            small = run_flink(
                flink, write_csv(fo, root / "f" / "o"), write_csv(fp, root / "f" / "p"), "interval"
            )
            fixed = small.get("seconds")
        for name in args.only.split(","):
            join = joins()[name]
            want = duckdb_answer(name, orders, payments)
            url = f"file://{root / 'log' / name}"
            fill(url, orders, payments)
            seconds, got = run_riverbed(spark, url, root, join, per_batch, (orders, payments))
            row = {"query": name, "rows": len(want), "riverbed_s": seconds,
                   "riverbed_check": compare(got, want)}  # fmt: skip
            if flink is not None:
                result = run_flink(flink, csv_o, csv_p, name)
                row["flink_s"] = result.get("seconds")
                row["flink_check"] = (
                    flink_check(result["rows"], want) if "rows" in result else result["error"]
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    spark.stop()
    print(f"\n{events:,} events ({len(orders):,} orders + {len(payments):,} payments), "
          f"riverbed in {args.batches} batches per side; Flink's fixed cost per job: "
          f"{fixed if fixed is None else round(fixed, 1)} s")  # fmt: skip
    print(f"{'query':<10}{'rows':>10}{'riverbed ev/s':>16}{'Flink ev/s':>14}{'ratio':>8}  checks")
    for r in rows:
        ours = events / r["riverbed_s"]
        theirs = events / r["flink_s"] if r.get("flink_s") else None
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        print(f"{r['query']:<10}{r['rows']:>10,}{ours:>16,.0f}"
              f"{(f'{theirs:,.0f}' if theirs else '-'):>14}{ratio:>8}  "
              f"riverbed {r['riverbed_check']}, Flink {r.get('flink_check', '-')}")  # fmt: skip


if __name__ == "__main__":
    main()
