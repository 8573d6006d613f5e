"""Nexmark's join queries, riverbed beside Flink SQL, each checked against DuckDB.

    .venv/bin/python benchmarks/nexmark_joins.py [--events 1000000]
                                                 [--only q8,q9j,q9i,q9,q4,q3,q20,q13,q7]
                                                 [--no-flink]

**Events.** ``benchmarks/nexmark.py``'s event stream whole (deterministic by
``--seed``, one event a millisecond of event time): of every 50 events 1 person, 3
auctions and 46 bids (the bids as ``nexmark.generate`` makes them). A person's id is
1000 + its number; an auction's id 1000 + its number, its seller the *hot* seller (the
newest person id rounded down to a multiple of 100) three times in four, else one of
the 1,000 newest people; its category one of 10-14; its reserve a price.

**Queries** (Nexmark's joins; q4 and q7 join an aggregate — riverbed's q4 aggregates
the join's rows, its q7 needs no join):

* ``q8`` — persons and the auctions they opened in the same 10-second window: the
  window join of persons (``id``) and auctions (``seller``), one row per (person,
  auction) — Nexmark's q8 then keeps each person once per window;
* ``q9j`` — q9's join: each auction with the bids on it in its first 10 seconds (an
  interval join, ``how="left"``: auctions without a bid kept); Nexmark's q9 bounds each
  auction by its own ``expires`` and keeps the highest bid — riverbed's interval is
  fixed, and the highest bid an aggregation over the joined rows;
* ``q9i`` — q9's join as Nexmark bounds it: each auction with the bids up to its own
  ``expires`` (``until="expires"``; ``within=("0s", "20s")`` the longest an auction
  runs, so state stays bounded), inner — Flink runs it as a regular join with the
  time condition (``expires`` is no time attribute of its);
* ``q9`` — q9 whole: each auction's winning bid, the highest of its bids up to its
  ``expires`` (ties: the earliest, then the smallest bidder). riverbed: q9i's join and
  an aggregation of its rows in the same driver (``Joined(join)``) — per auction, in
  the 10 s window of the *auction's* time (every row of an auction in one window), the
  whole row of the highest price (``ArgMax(["right_ts", "bidder", "price"],
  by="price")``). Flink: the interval join (``BETWEEN A.ts AND A.ts + 20
  s``, and ``B.ts <= A.expires``) with a window Top-N over the auction's time (its
  insert-only form: Nexmark's ``ROW_NUMBER()`` over a regular join updates rows, which
  a file sink cannot take);
* ``q4`` — the average closing price per category: each auction's highest bid up to its
  ``expires`` (q9i's join), averaged per category. riverbed: the join and an
  aggregation of its rows in one driver — the highest price per (auction, category) in
  the 10 s window of the auction's time (``output="final"``), and chained after it in
  the same driver (``Chained(q4_max, Joined(join))``) their ``Mean`` per category over
  a day's window (the whole run). Flink: the interval join, a window aggregation over the
  auction's time (10 s), then a 1-day window aggregation over its ``window_time`` — its
  insert-only form (Nexmark's group aggregations update rows);
* ``q3`` — sellers in OR, ID or CA with their auctions of category 10 (a ``where`` on
  each side); ``q20`` — each bid with its auction's row, auctions of category 10.
  Nexmark's are *regular* joins: no window, no interval, so Flink keeps every row of
  both tables for good. riverbed keeps state only as long as an interval: its join is
  the interval the stream's rule gives — an auction's seller is one of the 1,000 newest
  people (at most 50 s of event time before it: ``within=("0s", "60s")``), a bid's
  auction one of the newest 100 (at most ~2 s before it: ``within=("10s", "0s")``) — and
  the check against DuckDB's *regular* join (no bound) shows the two answers equal on
  this stream. (A stream without such a rule needs its bound from the data's own
  lifetime — Nexmark's ``expires``: ``until=``, as q9i.)
* ``q13`` — each bid with its row of Nexmark's side input (10,000 rows keyed 0-9999),
  on ``auction mod 10000`` (a lookup join: ``right=Lookup(…)``, the table as of each
  batch, no state; the key a derived column, ``columns={"left": {"side_key": …}}``).
  Flink runs it as a regular join with the bounded table (its filesystem tables are no
  lookup source: ``FOR SYSTEM_TIME AS OF`` is refused without a versioned table's
  primary key), so it keeps the bids in state too.
* ``q7`` — the highest bids: each bid whose price is the highest of a 10-second window
  ending at most 10 s after it (Nexmark's join of the bids with their windows'
  maximum, ``BETWEEN window_end - 10 s AND window_end``). riverbed: one aggregation,
  per 10 s window every bid at its highest price — ``ArgMax(["auction", "bidder",
  "price", "ts"], by="price", ties="all")``, a list per window, unnested for the check.
  (Nexmark's ``BETWEEN`` is closed at both ends: a bid at exactly a window's end — the
  next window's start — at that window's highest price is also one of its rows; a
  window of riverbed's is half-open. No such bid on this stream: the check is exact.)
  Flink: as Nexmark writes it, its window aggregation joined with the bids (a regular
  join: ``window_end`` is no time attribute).

**Where they go.** Typed riverbed topics (4 partitions each), CSV files for Flink (one
per source task, each in time order), DataFrames for DuckDB. riverbed runs from its
topics with ``availableNow`` in ``--batches`` batches per side, then — as Flink's
bounded input ends — one event a day later on each side closes every window and
interval (not timed). Flink runs from submission to its last row (its fixed cost, a
job over 1,000 events, reported beside). Prints events/s per query per system and
riverbed / Flink.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import riverbed.log
from riverbed.stream import (
    Aggregation,
    ArgMax,
    Chained,
    Join,
    Joined,
    Lookup,
    Max,
    Mean,
    Topic,
    Tumbling,
    read_joined,
    read_results,
    start,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nexmark import BASE, generate  # noqa: E402
from nexmark import SCHEMA as BIDS  # noqa: E402

PERSONS = "id long, name string, state string, ts timestamp"
AUCTIONS = "id long, seller long, category long, reserve long, expires timestamp, ts timestamp"
SCHEMAS = {"persons": PERSONS, "auctions": AUCTIONS, "bids": BIDS}
KEYS = {"persons": "id", "auctions": "id", "bids": "auction"}
SIDES = {
    "q8": ("persons", "auctions"),
    "q9j": ("auctions", "bids"),
    "q9i": ("auctions", "bids"),
    "q9": ("auctions", "bids"),  # and an aggregation of the joined rows
    "q4": ("auctions", "bids"),  # and two aggregations, chained, in the join's driver
    "q3": ("persons", "auctions"),
    "q20": ("bids", "auctions"),
    "q13": ("bids",),  # and the side table (a lookup)
    "q7": ("bids",),  # one aggregation: every bid at its window's highest price
}
END = -1  # the id (and auction) of the far-later events that end the input


def people_and_auctions(events: int, seed: int = 1, rate: int = 1000) -> dict[str, pd.DataFrame]:
    """The persons and auctions of the event stream whose bids ``nexmark.generate`` makes."""
    rng = np.random.default_rng(seed + 1)
    index = np.arange(events, dtype=np.int64)
    slot = index % 50

    def times(which: np.ndarray) -> pd.Series:
        return BASE + pd.to_timedelta(which * 1000 // rate, unit="ms")

    people = index[slot == 0]
    pid = 1000 + people // 50
    persons = pd.DataFrame(
        {
            "id": pid,
            "name": np.char.add("person-", pid.astype(str)).astype(object),
            "state": np.array(["OR", "ID", "CA", "WA", "AZ"])[rng.integers(0, 5, len(pid))],
            "ts": times(people),
        }
    )
    persons["state"] = persons["state"].astype(object)
    opened = index[(slot >= 1) & (slot <= 3)]
    n = len(opened)
    newest_person = 1000 + opened // 50  # the person of this 50 came first
    hot = rng.integers(0, 4, n) > 0
    other = np.maximum(newest_person - rng.integers(0, 1000, n), 1000)
    auctions = pd.DataFrame(
        {
            "id": 1000 + opened // 50 * 3 + (opened % 50 - 1),
            "seller": np.where(hot, np.maximum(newest_person // 100 * 100, 1000), other),
            "category": 10 + rng.integers(0, 5, n),
            "reserve": (10.0 ** (rng.random(n) * 6.0)).astype(np.int64) * 100,
            # an auction's end: 1-20 s after it opens (Nexmark: its own length)
            "expires": times(opened) + pd.to_timedelta(rng.integers(1000, 20_000, n), unit="ms"),
            "ts": times(opened),
        }
    )
    return {"persons": persons, "auctions": auctions}


def side_table() -> pd.DataFrame:
    """q13's side input: keys 0-9999, each with a value."""
    key = np.arange(10_000, dtype=np.int64)
    return pd.DataFrame({"key": key, "value": np.char.add("side-", key.astype(str)).astype(object)})


def joins(watermark: str, side: str = "side.parquet") -> dict[str, Join]:
    def topic(name: str) -> Topic:
        return Topic(name, options={"schema": SCHEMAS[name]})

    # each auction with its bids up to its own expires (q9's join; q9 and q4 go on)
    q9i = Join(
        name="q9i", left=topic("auctions"), right=topic("bids"), on=("id", "auction"),
        time="ts", within=("0s", "20s"), until="expires", watermark=watermark,
    )  # fmt: skip
    return {
        "q8": Join(
            name="q8",
            left=topic("persons"),
            right=topic("auctions"),
            on=("id", "seller"),
            time="ts",
            window="10s",
            watermark=watermark,
        ),
        "q9j": Join(
            name="q9j",
            left=topic("auctions"),
            right=topic("bids"),
            on=("id", "auction"),
            time="ts",
            within=("0s", "10s"),
            how="left",
            watermark=watermark,
        ),
        "q9i": q9i,
        # q9 and q4 aggregate q9i's rows in the same driver (Joined)
        "q9": dataclasses.replace(q9i, name="q9"),
        "q4": dataclasses.replace(q9i, name="q4"),
        "q3": Join(
            name="q3",
            left=topic("persons"),
            right=topic("auctions"),
            on=("id", "seller"),
            time="ts",
            within=("0s", "60s"),
            where={"left": "state IN ('OR', 'ID', 'CA')", "right": "category = 10"},
            watermark=watermark,
        ),
        "q20": Join(
            name="q20",
            left=topic("bids"),
            right=topic("auctions"),
            on=("auction", "id"),
            time="ts",
            within=("10s", "0s"),
            where={"right": "category = 10"},
            watermark=watermark,
        ),
        "q13": Join(
            name="q13",
            left=topic("bids"),
            right=Lookup(side, on=("side_key", "key"), how="inner"),
            columns={"left": {"side_key": "auction % 10000"}},
            time="ts",
        ),
    }


def fill(url: str, streams: dict[str, pd.DataFrame], names: tuple[str, ...]) -> None:
    log = riverbed.log.open(url)
    for name in names:
        frame = streams[name]
        log.create_topic(name, 4, schema=SCHEMAS[name])
        producer = log.producer(name)
        for i in range(0, len(frame), 100_000):
            records = frame.iloc[i : i + 100_000].to_dict("records")
            producer.send_batch(records, key_field=KEYS[name])
    log.close()


def end(url: str, streams: dict[str, pd.DataFrame], names: tuple[str, ...]) -> None:
    """One event a day after the rest on each side, sent once the rest is joined: the
    watermark passes every event (as the end of Flink's bounded input does). (Sent with
    the rest, one read early from one partition would make the others' last events
    late: the watermark is the newest event time seen.) The checks leave them out."""
    log = riverbed.log.open(url)
    later = max(streams[n]["ts"].max() for n in names) + pd.Timedelta("1d")
    for name in names:
        frame = streams[name]
        last = frame.iloc[:1].assign(ts=later, **{KEYS[name]: END})
        if name == "auctions":  # (kept by q3's and q20's where: they move the watermark)
            last = last.assign(seller=END, category=10, expires=later + pd.Timedelta("1d"))
        if name == "persons":
            last = last.assign(state="OR")
        log.producer(name).send_batch(last.to_dict("records"), key_field=KEYS[name])
    log.close()


def q7_highest(watermark: str) -> Aggregation:
    """q7 in one pass: per 10-second window of bids, every bid at its highest price (a
    window's row: the list of them, ``ties="all"``), written once the window closes."""
    return Aggregation(
        name="q7", key="all", time="ts", window=Tumbling("10s"), watermark=watermark,
        output="final", columns={"all": "'all'"}, state_partitions=4,
        metrics={"top": ArgMax(["auction", "bidder", "price", "ts"], by="price", ties="all")},
    )  # fmt: skip


def q9_winners() -> Aggregation:
    """q9's second half: per auction, the whole row of its highest bid. The window is
    the auction's time's (every joined row of an auction in one); over the join's rows
    in its driver, the aggregation's watermark waits for what the join may still emit
    (an auction's rows until its 20 s are past the join's watermark): 0 s of its own."""
    return Aggregation(
        name="q9_win", key="id", time="ts", window=Tumbling("10s"), watermark="0s",
        metrics={"win": ArgMax(["right_ts", "bidder", "price"], by="price")},
        state_partitions=4,
    )  # fmt: skip


def q4_chain() -> list[Aggregation]:
    """q4's aggregations: each auction's closing price (the highest of its joined bids,
    in the 10 s window of the auction's time, over the join's rows in its driver;
    written once, to its results topic), then their average per category over the day
    (the end's far-later auction left out)."""
    return [
        Aggregation(
            name="q4_max", key=["id", "category"], time="ts", window=Tumbling("10s"),
            watermark="0s", output="final", metrics={"final": Max("price")},
            state_partitions=4,
        ),
        Aggregation(
            name="q4_avg", key="category", time="window_start", window=Tumbling("1d"),
            watermark="0s", where=f"id <> {END}", metrics={"avg": Mean("final")},
            state_partitions=4,
        ),
    ]  # fmt: skip


def run_joined(spark: Any, url: str, root: Path, join: Join, batch: int) -> float:
    """q9: the join and the aggregation over its rows; q4: the join, the closing price
    over its rows, their average per category over those — one driver: its seconds."""
    source: Any = Joined(join, max_records=batch)
    if join.name == "q9":
        spec = q9_winners()
    else:
        closing, spec = q4_chain()
        source = Chained(closing, source, output=root / "out" / closing.name)
    began = time.perf_counter()
    query = start(
        spark, spec, source, checkpoint=root / "cp" / spec.name,
        output=root / "out" / spec.name, log_url=url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return time.perf_counter() - began


def run_highest(
    spark: Any, url: str, root: Path, batch: int, watermark: str, driver: str | None = None
) -> float:
    """q7's one aggregation over the bids: its seconds."""
    began = time.perf_counter()
    options = {"topic": "bids", "log": url, "schema": BIDS, "maxRecordsPerBatch": str(batch)}
    if driver is not None:
        options["driverBatchRecords"] = driver
    query = start(
        spark, q7_highest(watermark), options,
        checkpoint=root / "cp" / "q7", output=root / "out" / "q7", log_url=url,
        trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return time.perf_counter() - began


def q7_rows(output: Path) -> pd.DataFrame:
    """q7's result rows as the bids they list, one row each (the end's window out)."""
    rows = [dict(r) for listed in read_results(output)["top"] for r in listed]
    bids = pd.DataFrame(rows, columns=["auction", "bidder", "price", "ts"])
    return bids[bids["auction"] != END]


def run_riverbed(
    spark: Any, url: str, root: Path, name: str, join: Join | None, batch: int,
    streams: dict[str, pd.DataFrame], watermark: str = "10s",
) -> tuple[float, pd.DataFrame]:  # fmt: skip
    """The query over its log, then its end: the seconds of both runs, its rows (q9 and
    q4: the aggregations over the join's rows; q7: one aggregation, no join)."""
    from riverbed.stream.joinquery import start_join

    if join is None:  # q7: every bid at its window's highest price, in one pass
        seconds = run_highest(spark, url, root, batch, watermark)
        end(url, streams, SIDES[name])
        seconds += run_highest(spark, url, root, batch, watermark)
        return seconds, q7_rows(root / "out" / "q7")

    def run() -> float:
        began = time.perf_counter()
        start_join(
            spark, join, checkpoint=root / "cp" / join.name, output=root / "out" / join.name,
            log_url=url, trigger={"availableNow": True}, max_records=batch,
        ).awaitTermination()  # fmt: skip
        return time.perf_counter() - began

    if join.name in ("q9", "q4"):  # the join and an aggregation of its rows, one driver
        seconds = run_joined(spark, url, root, join, batch)
        end(url, streams, SIDES[join.name])
        seconds += run_joined(spark, url, root, join, batch)
        if join.name == "q9":  # the winners
            won = read_results(root / "out" / "q9_win")
            return seconds, won[won["key"] != str(END)]
        return seconds, read_results(root / "out" / "q4_avg")
    seconds = run()
    end(url, streams, SIDES[join.name])
    seconds += run()
    got = read_joined(root / "out" / join.name)
    # (a left join's unmatched row has no auction: NULL, which is not the end either)
    ended = pd.Series(False, index=got.index)
    for column in ("id", "auction"):
        if column in got:
            ended |= got[column].eq(END).fillna(False).astype(bool)
    return seconds, got[~ended]


def _ms(column: pd.Series) -> np.ndarray:
    """Times as epoch ms, -1 for none."""
    times = pd.to_datetime(column, utc=True).dt.as_unit("ms")
    present = times.notna().to_numpy()
    out = np.full(len(times), -1, dtype=np.int64)
    out[present] = times[present].astype("int64").to_numpy()
    return out


def _ints(column: pd.Series) -> list[int]:
    return [-1 if pd.isna(v) else int(v) for v in column.tolist()]


def rows_of(query: str, frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """The rows both systems give, sorted: q8 (person, auction, their times); q9j
    (auction, bidder, price, the bid's time; -1 for an auction without a bid); q3
    (person, name, state, auction); q20 (auction, bidder, price, channel, the bid's
    time, seller, reserve, the auction's time)."""
    if query == "q8":
        columns = [_ints(frame["id"]), _ints(frame["right_id"])]
        columns += [_ms(frame["ts"]).tolist(), _ms(frame["right_ts"]).tolist()]
    elif query == "q3":
        columns = [_ints(frame["id"]), frame["name"].tolist(), frame["state"].tolist()]
        columns.append(_ints(frame["right_id"]))
    elif query == "q13":
        columns = [_ints(frame[c]) for c in ("auction", "bidder", "price")]
        columns += [_ms(frame["ts"]).tolist(), frame["value"].tolist()]
    elif query == "q7":
        columns = [_ints(frame[c]) for c in ("auction", "bidder", "price")]
        columns.append(_ms(frame["ts"]).tolist())
    elif query == "q9":  # riverbed's result rows, or DuckDB's
        if "win_bidder" in frame:
            frame = frame.rename(columns={"win_bidder": "bidder", "win_price": "price",
                                          "win_right_ts": "right_ts", "key": "id"})  # fmt: skip
        columns = [_ints(frame[c]) for c in ("id", "bidder", "price")]
        columns.append(_ms(frame["right_ts"]).tolist())
    elif query == "q4":  # (category, the average to 6 decimal places)
        frame = frame.rename(columns={"key": "category"})
        columns = [_ints(frame["category"]), [round(float(v), 6) for v in frame["avg"]]]
    elif query == "q20":
        columns = [_ints(frame[c]) for c in ("auction", "bidder", "price")]
        columns += [frame["channel"].tolist(), _ms(frame["ts"]).tolist()]
        columns += [_ints(frame["seller"]), _ints(frame["reserve"])]
        columns.append(_ms(frame["right_ts"]).tolist())
    else:
        columns = [_ints(frame[c]) for c in ("id", "bidder", "price")]
        columns.append(_ms(frame["right_ts"]).tolist())
    return sorted(zip(*columns, strict=True))


def duckdb_answer(query: str, streams: dict[str, pd.DataFrame]) -> pd.DataFrame:
    import duckdb

    con = duckdb.connect()
    for name, frame in streams.items():
        con.register(name, frame)
    if query == "q8":
        sql = """SELECT p.id, a.id AS right_id, p.ts, a.ts AS right_ts FROM persons p
                 JOIN auctions a ON p.id = a.seller
                 AND time_bucket(INTERVAL 10 SECOND, p.ts)
                   = time_bucket(INTERVAL 10 SECOND, a.ts)"""
    elif query == "q3":  # Nexmark's regular joins: no bound in time
        sql = """SELECT p.id, p.name, p.state, a.id AS right_id FROM persons p
                 JOIN auctions a ON p.id = a.seller
                 WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')"""
    elif query == "q9i":
        sql = """SELECT a.id, b.bidder, b.price, b.ts AS right_ts FROM auctions a
                 JOIN bids b ON a.id = b.auction AND b.ts BETWEEN a.ts AND a.expires"""
    elif query == "q9":
        sql = """SELECT id, bidder, price, right_ts FROM (
                   SELECT a.id, b.bidder, b.price, b.ts AS right_ts,
                          row_number() OVER (PARTITION BY a.id
                                             ORDER BY b.price DESC, b.ts, b.bidder) AS n
                   FROM auctions a JOIN bids b
                   ON a.id = b.auction AND b.ts BETWEEN a.ts AND a.expires)
                 WHERE n = 1"""
    elif query == "q4":
        sql = """SELECT category, avg(final) AS avg FROM (
                   SELECT a.id, a.category, max(b.price) AS final FROM auctions a
                   JOIN bids b ON a.id = b.auction AND b.ts BETWEEN a.ts AND a.expires
                   GROUP BY a.id, a.category)
                 GROUP BY category"""
    elif query == "q7":
        sql = """WITH m AS (SELECT time_bucket(INTERVAL 10 SECOND, ts) + INTERVAL 10 SECOND
                                   AS window_end, max(price) AS maxprice
                            FROM bids GROUP BY 1)
                 SELECT b.auction, b.bidder, b.price, b.ts FROM bids b JOIN m
                 ON b.price = m.maxprice
                 AND b.ts BETWEEN m.window_end - INTERVAL 10 SECOND AND m.window_end"""
    elif query == "q13":
        sql = """SELECT b.auction, b.bidder, b.price, b.ts, s.value FROM bids b
                 JOIN side s ON b.auction % 10000 = s.key"""
    elif query == "q20":
        sql = """SELECT b.auction, b.bidder, b.price, b.channel, b.ts, a.seller, a.reserve,
                        a.ts AS right_ts
                 FROM bids b JOIN auctions a ON b.auction = a.id WHERE a.category = 10"""
    else:
        sql = """SELECT a.id, b.bidder, b.price, b.ts AS right_ts FROM auctions a
                 LEFT JOIN bids b ON a.id = b.auction
                 AND b.ts BETWEEN a.ts AND a.ts + INTERVAL 10 SECOND"""
    return con.execute(sql).df()


def compare(query: str, got: pd.DataFrame, want: pd.DataFrame) -> str:
    a, b = rows_of(query, got), rows_of(query, want)
    if a != b:  # a few rows of each side that the other does not have
        ours, theirs = set(a), set(b)
        print(f"{query}: only riverbed's {[r for r in a if r not in theirs][:3]}, "
              f"only DuckDB's {[r for r in b if r not in ours][:3]}", flush=True)  # fmt: skip
    return "IDENTICAL" if a == b else f"DIFFERENT: {len(a)} rows, DuckDB {len(b)}"


def _cell(value: Any) -> Any:
    """A value of Flink's CSV rows as :func:`rows_of` gives it: -1 for none, whole
    numbers as ints, text as it is."""
    if value == "" or value is None:
        return -1
    try:
        return int(value)
    except ValueError:
        return value


def flink_check(query: str, rows: list[list[Any]], want: pd.DataFrame) -> str:
    got = sorted(tuple(_cell(v) for v in r) for r in rows)
    if query == "q4":  # (category, the average to 6 decimal places)
        got = sorted((int(c), round(float(a), 6)) for c, a in rows)
    truth = rows_of(query, want)
    return "IDENTICAL" if got == truth else f"DIFFERENT: {len(got)} rows, DuckDB {len(truth)}"


def run_flink(python: Path, csv: dict[str, Path], query: str, watermark_s: int) -> dict[str, Any]:
    from flink_peer import run_script

    paths = [str(csv[n]) for n in ("persons", "auctions", "bids", "side")]
    return run_script(python, HERE / "nexmark_joins_flink.py", *paths, query, str(watermark_s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=1000, help="events per second of event time")
    parser.add_argument("--batches", type=int, default=10, help="riverbed's batches per side")
    parser.add_argument("--watermark", type=int, default=10, help="seconds, both systems")
    parser.add_argument("--only", default="q8,q9j,q9i,q9,q4,q3,q20,q13,q7")
    parser.add_argument("--no-flink", action="store_true")
    args = parser.parse_args()
    from riverbed.config import SparkConfig
    from riverbed.spark import session

    streams = people_and_auctions(args.events, args.seed, args.rate)
    streams["bids"] = generate(args.events, args.seed, args.rate)
    streams["side"] = side_table()
    print(
        "Nexmark: "
        + ", ".join(f"{len(f):,} {n}" for n, f in streams.items())
        + f" over {args.events / args.rate:,.0f} s of event time",
        flush=True,
    )
    from flink_peer import flink_python, write_csv

    flink = None if args.no_flink else flink_python()
    spark = session(SparkConfig(master="local[2]", app_name="riverbed-bench-nexmark-joins"))
    rows = []
    fixed = None
    with tempfile.TemporaryDirectory(prefix="rb-nexmark-joins-") as tmp:
        root = Path(tmp)
        csv = {n: write_csv(f, root / "csv" / n) for n, f in streams.items()}
        # a warm-up: Spark's workers and the code paths, on a small stream of its own
        small = people_and_auctions(20_000, seed=9)
        small["bids"] = generate(20_000, seed=9)
        small["side"] = side_table()
        warm = f"file://{root / 'warm'}"
        fill(warm, small, SIDES["q9j"])
        run_riverbed(spark, warm, root / "warmup", "q9j", joins("10s")["q9j"], 2_000, small)
        if flink is not None:
            tiny = {n: write_csv(f.head(300), root / "tiny" / n) for n, f in small.items()}
            fixed = run_flink(flink, tiny, "q9j", args.watermark).get("seconds")
        for name in args.only.split(","):
            side = root / "side" / "side.parquet"
            if not side.exists():  # q13's table, read by riverbed's lookup
                side.parent.mkdir(parents=True, exist_ok=True)
                streams["side"].to_parquet(side, index=False)
            join = joins(f"{args.watermark}s", str(side)).get(name)  # (q7: none)
            names = SIDES[name]
            events = sum(len(streams[n]) for n in names)
            per_batch = -(-max(len(streams[n]) for n in names) // args.batches)
            want = duckdb_answer(name, streams)
            url = f"file://{root / 'log' / name}"
            fill(url, streams, names)
            seconds, got = run_riverbed(spark, url, root, name, join, per_batch, streams,
                                        f"{args.watermark}s")  # fmt: skip
            row: dict[str, Any] = {
                "query": name, "events": events, "rows": len(want), "riverbed_s": seconds,
                "riverbed_check": compare(name, got, want),
            }  # fmt: skip
            if flink is not None:
                result = run_flink(flink, csv, name, args.watermark)
                row["flink_s"] = result.get("seconds")
                row["flink_check"] = (
                    flink_check(name, result["rows"], want) if "rows" in result else result["error"]
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    spark.stop()
    print(f"\nriverbed in {args.batches} batches per side; Flink's fixed cost per job: "
          f"{fixed if fixed is None else round(fixed, 1)} s (included)")  # fmt: skip
    print("| query | events | rows | riverbed events/s | Flink events/s | riverbed / Flink "
          "| checks |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ours = r["events"] / r["riverbed_s"]
        theirs = r["events"] / r["flink_s"] if r.get("flink_s") else None
        ratio = f"**{ours / theirs:.2f}x**" if theirs else "-"
        print(f"| `{r['query']}` | {r['events']:,} | {r['rows']:,} | {ours:,.0f} | "
              f"{(f'{theirs:,.0f}' if theirs else '-')} | {ratio} | "
              f"riverbed {r['riverbed_check']}, Flink {r.get('flink_check', '-')} |")  # fmt: skip


if __name__ == "__main__":
    main()
