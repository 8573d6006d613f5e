"""Nexmark's bid queries, riverbed beside Flink SQL, each checked against DuckDB.

    .venv/bin/python benchmarks/nexmark.py [--events 1000000] [--only q15,q17] [--no-flink]

**Events.** A generator written here from the benchmark's published description
(deterministic by ``--seed``): an event stream of persons, auctions and bids in
Nexmark's proportions (1 : 3 : 46 of every 50 events), one event every millisecond of
event time (``--rate`` per second). Only bids are kept (every query here reads bids
only). A bid goes to the *hot* auction — the newest auction id rounded down to a
multiple of 100 — half the time, else to one of the 100 newest auctions; its bidder is
the hot bidder (the newest person id rounded down to a multiple of 100) three times in
four, else one of the 1,000 newest people; its price is ``10^(6·u) · 100`` (u uniform
in [0, 1)); its channel one of the four hot channels (Google, Facebook, Baidu, Apple)
half the time, else one of 10,000 others, each with its url (three path parts of five
random letters and ``item.htm?query=1``, a channel not hot's ``&channel_id=`` after).

**Where they go.** A typed riverbed topic (4 partitions keyed by auction: the per-
auction queries read co-located, the others shuffle partials), CSV files for Flink
(one per source task, each in time order), and a DataFrame for DuckDB.

**Queries.** Nexmark's bid queries:

* ``q0`` pass-through, ``q1`` currency conversion, ``q2`` selection, ``q14``
  calculation, ``q21`` channel id, ``q22`` url directories: per-event projections and
  filters, each a riverbed ``Select`` (:func:`selects`; no ``extra`` column is
  generated, so q14 counts the url's 'c's) — their millions of rows compared by an
  order-free digest (``flink_conf.digest``);
* ``q5`` hot items: bids per auction per 10 s window sliding every 2 s (``final``),
  then, chained after it in the same driver (``Chained``; ``--through-topic``: through
  its results topic, a driver each), the largest count per window and its auction
  (Flink: Nexmark's join of the counts with their maximum);
* ``q11`` user sessions: bids per bidder per session (10 s gap);
* ``q15`` bidding statistics per day, ``q16`` per channel and day (3 filtered counts,
  8 exact distinct counts, filtered), ``q17`` per auction and day (filtered counts,
  min, max, mean, sum);
* the join queries (q8, q9's join): ``benchmarks/nexmark_joins.py``;
* ``topk`` (riverbed and DuckDB only): the 3 most frequent bidders per auction per
  minute, and ``last`` the last bid's price per auction per 10 s — Flink SQL's
  LAST_VALUE is by arrival, not by event time, so it is not the same question.

Each system runs each query once warmed up (riverbed: the query once over 20,000 bids
first, as Spark jobs; Flink: a first job on 1,000 bids whose time is its fixed cost,
reported). riverbed runs from its
topic with ``availableNow`` in ``--batches`` batches (a window of ``final`` output is
written once a later batch's watermark passed it); Flink from submission to
its last row. Every answer is compared with DuckDB's over the same bids: IDENTICAL, or
what differs. Prints events/s per query per system and riverbed / Flink.
"""

from __future__ import annotations

import argparse
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
    Count,
    Distinct,
    Hopping,
    Last,
    Max,
    Mean,
    Min,
    Select,
    Session,
    Sum,
    TopK,
    Tumbling,
    read_joined,
    read_results,
    start,
    start_join,
)

HERE = Path(__file__).resolve().parent
SCHEMA = "auction long, bidder long, price long, channel string, url string, ts timestamp"
BASE = pd.Timestamp("2026-11-20", tz="UTC")
HOT_CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]


def generate(events: int, seed: int = 1, rate: int = 1000) -> pd.DataFrame:
    """The bids of a Nexmark event stream of ``events`` events (see the module)."""
    rng = np.random.default_rng(seed)
    index = np.arange(events, dtype=np.int64)
    slot = index % 50
    bids = index[slot >= 4]  # of every 50 events: 1 person, 3 auctions, 46 bids
    n = len(bids)
    epoch = bids // 50
    auctions = epoch * 3 + 3  # auctions and people created before each bid
    people = epoch + 1
    newest_auction, newest_person = 1000 + auctions - 1, 1000 + people - 1
    hot = rng.integers(0, 2, n) > 0
    recent = newest_auction - rng.integers(0, 100, n)
    auction = np.where(hot, newest_auction // 100 * 100, np.maximum(recent, 1000))
    hot_bidder = rng.integers(0, 4, n) > 0
    other = newest_person - rng.integers(0, 1000, n)
    bidder = np.where(hot_bidder, newest_person // 100 * 100 + 1, np.maximum(other, 1000))
    price = (10.0 ** (rng.random(n) * 6.0)).astype(np.int64) * 100
    hot_channel = rng.integers(0, 2, n) > 0
    which = rng.integers(0, 4, n)
    number = rng.integers(0, 10_000, n)
    channel = np.where(
        hot_channel,
        np.array(HOT_CHANNELS)[which],
        np.char.add("channel-", number.astype(str)),
    )
    hot_urls, urls = _urls(seed)
    url = np.where(hot_channel, hot_urls[which], urls[number])
    return pd.DataFrame(
        {
            "auction": auction,
            "bidder": bidder,
            "price": price,
            "channel": channel.astype(object),
            "url": url.astype(object),
            "ts": BASE + pd.to_timedelta(bids * 1000 // rate, unit="ms"),
        }
    )


def _urls(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The hot channels' urls and the 10,000 others', as Nexmark makes them: three path
    parts of five random letters, ``item.htm?query=1``, and for a channel not hot its
    ``&channel_id=``."""
    rng = np.random.default_rng(seed + 1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))

    def bases(n: int) -> np.ndarray:
        words = ["".join(w) for w in letters[rng.integers(0, 26, (n * 3, 5))]]
        parts = np.array(words, dtype=object).reshape(n, 3)
        return np.array(
            [f"https://www.nexmark.com/{a}/{b}/{c}/item.htm?query=1" for a, b, c in parts],
            dtype=object,
        )

    others = bases(10_000) + np.array([f"&channel_id={i}" for i in range(10_000)], dtype=object)
    return bases(len(HOT_CHANNELS)), others


# -- riverbed ------------------------------------------------------------------------------
RANKS = {
    "rank1": "price < 10000",
    "rank2": "price >= 10000 AND price < 1000000",
    "rank3": "price >= 1000000",
}


def _statistics() -> dict[str, Any]:
    """q15/q16's metrics: bids, bidders and auctions, in all and per price rank."""
    metrics: dict[str, Any] = {"bids": Count()}
    metrics |= {f"{r}_bids": Count(where=w) for r, w in RANKS.items()}
    for column in ("bidder", "auction"):
        metrics[f"{column}s"] = Distinct(column, mode="exact")
        metrics |= {f"{r}_{column}s": Distinct(column, where=w) for r, w in RANKS.items()}
    return metrics


def specs(watermark: str) -> dict[str, list[Aggregation]]:
    """Each query as riverbed aggregations (q5: two, chained)."""
    day = Tumbling("1d")
    return {
        "q5": [
            Aggregation(
                name="q5_counts",
                key="auction",
                time="ts",
                window=Hopping("10s", "2s"),
                watermark=watermark,
                output="final",
                metrics={"num": Count()},
                state_partitions=4,
            ),
            Aggregation(
                name="q5_hot",
                key="all",
                time="window_start",
                window=Tumbling("2s"),
                watermark="0s",
                columns={"all": "'all'", "auction_id": "CAST(key AS BIGINT)"},
                metrics={"maxn": Max("num"), "auction": ArgMax("auction_id", by="num")},
                state_partitions=4,
            ),
        ],
        "q11": [
            Aggregation(
                name="q11",
                key="bidder",
                time="ts",
                window=Session("10s"),
                watermark=watermark,
                metrics={"bids": Count()},
                state_partitions=4,
            )
        ],
        "q15": [
            Aggregation(
                name="q15",
                key="day",
                time="ts",
                window=day,
                watermark=watermark,
                columns={"day": "'day'"},
                metrics=_statistics(),
                state_partitions=4,
            )
        ],
        "q16": [
            Aggregation(
                name="q16",
                key="channel",
                time="ts",
                window=day,
                watermark=watermark,
                metrics=_statistics(),
                state_partitions=4,
            )
        ],
        "q17": [
            Aggregation(
                name="q17",
                key="auction",
                time="ts",
                window=day,
                watermark=watermark,
                state_partitions=4,
                metrics={
                    "bids": Count(),
                    **{f"{r}_bids": Count(where=w) for r, w in RANKS.items()},
                    "min_price": Min("price"),
                    "max_price": Max("price"),
                    "avg_price": Mean("price"),
                    "sum_price": Sum("price"),
                },
            )
        ],
        "topk": [
            Aggregation(
                name="topk",
                key="auction",
                time="ts",
                window=Tumbling("1m"),
                watermark=watermark,
                metrics={"top": TopK("bidder", 3)},
                state_partitions=4,
            )
        ],
        "last": [
            Aggregation(
                name="last",
                key="auction",
                time="ts",
                window=Tumbling("10s"),
                watermark=watermark,
                metrics={"price": Last("price")},
                state_partitions=4,
            )
        ],
    }


STATELESS = ("q0", "q1", "q2", "q14", "q21", "q22")
CHANNEL_ID = "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)"
DAYTIME = (
    "CASE WHEN hour(ts) >= 8 AND hour(ts) <= 18 THEN 'dayTime' "
    "WHEN hour(ts) <= 6 OR hour(ts) >= 20 THEN 'nightTime' ELSE 'otherTime' END"
)


def selects(source: dict[str, str]) -> dict[str, Select]:
    """The per-event queries as riverbed Selects over ``source`` (Nexmark's, but that
    its ``extra`` column is not generated: q14 counts the url's 'c's; Spark's
    regexp_extract gives "" where Flink's gives NULL, so q21 asks for a non-empty one;
    Flink's SPLIT_INDEX is Spark's ``get(split(…), i)``)."""
    channels = " ".join(
        f"WHEN lower(channel) = '{c.lower()}' THEN '{i}'"
        for i, c in enumerate(["Apple", "Google", "Facebook", "Baidu"])
    )
    spark_sql: dict[str, tuple[dict[str, str] | list[str] | None, str | None]] = {
        "q0": (["auction", "bidder", "price", "channel", "url", "ts"], None),
        "q1": (
            {"auction": "auction", "bidder": "bidder", "price": "0.908 * price", "ts": "ts"},
            None,
        ),
        "q2": (["auction", "price"], "auction % 123 = 0"),
        "q14": (
            {
                "auction": "auction",
                "bidder": "bidder",
                "price": "0.908 * price",
                "bidTimeType": DAYTIME,
                "ts": "ts",
                "c_counts": "length(url) - length(replace(url, 'c', ''))",
            },
            "0.908 * price > 1000000 AND 0.908 * price < 50000000",
        ),
        "q21": (
            {
                "auction": "auction",
                "bidder": "bidder",
                "price": "price",
                "channel": "channel",
                "channel_id": f"CASE {channels} ELSE {CHANNEL_ID} END",
            },
            f"{CHANNEL_ID} <> '' OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')",
        ),
        "q22": (
            {
                "auction": "auction",
                "bidder": "bidder",
                "price": "price",
                "channel": "channel",
                "dir1": "get(split(url, '/'), 3)",
                "dir2": "get(split(url, '/'), 4)",
                "dir3": "get(split(url, '/'), 5)",
            },
            None,
        ),
    }
    return {
        q: Select(name=q, source=source, columns=columns, where=where, time="ts")
        for q, (columns, where) in spark_sql.items()
    }


def run_select(spark: Any, url: str, root: Path, query: str, batch: int) -> tuple[float, Any]:
    """A per-event query over the bids topic in batches of ``batch``: seconds, its rows."""
    source = {"topic": "bids", "log": url, "schema": SCHEMA, "maxRecordsPerBatch": str(batch)}
    select = selects(source)[query]
    began = time.perf_counter()
    running = start_join(
        spark, select, checkpoint=root / "ckpt", output=root / "out", log_url=url,
        trigger={"availableNow": True},
    )  # fmt: skip
    running.awaitTermination()
    assert running.exception() is None, running.exception()
    return time.perf_counter() - began, read_joined(root / "out").drop(columns=["batch_id"])


def fill(url: str, bids: pd.DataFrame) -> None:
    log = riverbed.log.open(url)
    log.create_topic("bids", 4, schema=SCHEMA)
    producer = log.producer("bids")
    for i in range(0, len(bids), 100_000):
        producer.send_batch(bids.iloc[i : i + 100_000].to_dict("records"), key_field="auction")
    log.close()


def run_riverbed(
    spark: Any,
    url: str,
    root: Path,
    chain: list[Aggregation],
    batch: int,
    driver_records: int | None = None,
    through_topic: bool = False,
) -> tuple[float, list[pd.DataFrame]]:
    """The query's aggregations (a chained one over the final rows of the one before:
    in one driver, or with ``through_topic`` in a driver each, the next reading the
    one before's results topic); seconds in all, and each one's result table."""
    began = time.perf_counter()
    # batches of up to this many records run in the driver (riverbed's default: 50,000)
    driver = {} if driver_records is None else {"driverBatchRecords": str(driver_records)}
    source: Any = (
        {"topic": "bids", "log": url, "schema": SCHEMA}
        | {"maxRecordsPerBatch": str(batch)}
        | driver
    )
    if through_topic:
        for i, spec in enumerate(chain):
            chained = i + 1 < len(chain)
            query = start(
                spark, spec, source, checkpoint=root / f"ckpt-{spec.name}",
                output=root / f"out-{spec.name}",
                topic=f"{spec.name}.results" if chained else None,
                log_url=url, trigger={"availableNow": True},
            )  # fmt: skip
            query.awaitTermination()
            assert query.exception() is None, query.exception()
            print(f"    {spec.name}: {time.perf_counter() - began:.1f} s in", flush=True)
            # the next one's events: this one's results (specsource.chained_source)
            source = {
                "topic": f"{spec.name}.results", "log": url,
                "schema": "window_start timestamp, window_end timestamp, num long, batch_id long",
                "maxRecordsPerBatch": str(batch),
            } | driver  # fmt: skip
    else:  # each after the one before, in one driver (stream/chained.py)
        for spec in chain[:-1]:
            source = Chained(spec, source, output=root / f"out-{spec.name}")
        last = chain[-1]
        query = start(
            spark, last, source, checkpoint=root / f"ckpt-{last.name}",
            output=root / f"out-{last.name}", log_url=url, trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination()
        assert query.exception() is None, query.exception()
    seconds = time.perf_counter() - began
    return seconds, [read_results(root / f"out-{spec.name}") for spec in chain]


# -- DuckDB, and the checks ----------------------------------------------------------------
def duckdb_answer(bids: pd.DataFrame, query: str) -> pd.DataFrame:
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("bids", bids)
    bucket = "time_bucket(INTERVAL {}, ts, TIMESTAMPTZ '1970-01-01 00:00:00+00')"
    ranks = ", ".join(f"count(*) FILTER (WHERE {w}) AS {r}_bids" for r, w in RANKS.items())
    distincts = ", ".join(
        f"count(DISTINCT {c}) AS {c}s, "
        + ", ".join(f"count(DISTINCT {c}) FILTER (WHERE {w}) AS {r}_{c}s" for r, w in RANKS.items())
        for c in ("bidder", "auction")
    )
    day = bucket.format("1 DAY")
    sql = {
        "q5": f"""WITH w AS (SELECT unnest(generate_series(
                        {bucket.format("2 SECOND")} - INTERVAL 8 SECOND,
                        {bucket.format("2 SECOND")}, INTERVAL 2 SECOND)) AS window_start, auction
                     FROM bids),
                  c AS (SELECT window_start, auction, count(*) AS num FROM w GROUP BY ALL)
                  SELECT window_start, max(num) AS maxn,
                         arg_min(auction, (-num, auction)) AS auction
                  FROM c GROUP BY window_start""",
        "q11": """WITH s AS (SELECT *, sum(CASE WHEN prev IS NULL OR ts - prev > INTERVAL 10 SECOND
                                           THEN 1 ELSE 0 END) OVER (PARTITION BY bidder ORDER BY ts
                                           ROWS UNBOUNDED PRECEDING) AS session
                             FROM (SELECT *, lag(ts) OVER (PARTITION BY bidder ORDER BY ts) AS prev
                                   FROM bids))
                  SELECT bidder AS key, min(ts) AS window_start,
                         max(ts) + INTERVAL 10 SECOND AS window_end, count(*) AS bids
                  FROM s GROUP BY bidder, session""",
        "q15": f"SELECT {day} AS window_start, count(*) AS bids, {ranks}, {distincts} "
        "FROM bids GROUP BY ALL",
        "q16": f"SELECT {day} AS window_start, channel AS key, count(*) AS bids, {ranks}, "
        f"{distincts} FROM bids GROUP BY ALL",
        "q17": f"""SELECT {day} AS window_start, auction::VARCHAR AS key, count(*) AS bids, {ranks},
                   min(price)::DOUBLE AS min_price, max(price)::DOUBLE AS max_price,
                   avg(price) AS avg_price, sum(price)::DOUBLE AS sum_price
                   FROM bids GROUP BY ALL""",
        "q0": "SELECT auction, bidder, price, channel, url, ts FROM bids",
        "q1": "SELECT auction, bidder, 0.908 * price AS price, ts FROM bids",
        "q2": "SELECT auction, price FROM bids WHERE auction % 123 = 0",
        "q14": f"""SELECT auction, bidder, 0.908 * price AS price, {DAYTIME} AS bidTimeType, ts,
                   length(url) - length(replace(url, 'c', '')) AS c_counts
                   FROM bids WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
        "q21": f"""SELECT auction, bidder, price, channel,
                   CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google'
                   THEN '1' WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) =
                   'baidu' THEN '3' ELSE {CHANNEL_ID} END AS channel_id FROM bids
                   WHERE {CHANNEL_ID} <> ''
                      OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
        "q22": """SELECT auction, bidder, price, channel, string_split(url, '/')[4] AS dir1,
                  string_split(url, '/')[5] AS dir2, string_split(url, '/')[6] AS dir3
                  FROM bids""",
        "topk": f"""SELECT {bucket.format("1 MINUTE")} AS window_start, auction::VARCHAR AS key,
                    list(bidder) AS bidders FROM bids GROUP BY ALL""",
        "last": f"""SELECT {bucket.format("10 SECOND")} AS window_start, auction::VARCHAR AS key,
                    arg_max(price, (ts, -price)) AS price FROM bids GROUP BY ALL""",
    }[query]
    frame = con.execute(sql).df()
    if query in STATELESS:
        return frame
    frame["window_start"] = pd.to_datetime(frame["window_start"], utc=True)
    return frame


def rows_digest(frame: pd.DataFrame) -> tuple[int, int]:
    """:func:`flink_conf.digest` of a frame's rows."""
    from flink_conf import digest

    return digest(frame.itertuples(index=False, name=None))


def compare(query: str, got: list[pd.DataFrame], want: pd.DataFrame) -> str:
    """IDENTICAL, or what differs, between riverbed's result table and DuckDB's answer."""
    table = got[-1]
    if query in STATELESS:  # the same rows, each once, in any order
        if list(table.columns) != list(want.columns):
            return f"DIFFERENT columns: {list(table.columns)} vs {list(want.columns)}"
        ours, theirs = rows_digest(table), rows_digest(want)
        if ours == theirs:
            return f"IDENTICAL ({ours[0]} rows)"
        return f"DIFFERENT: {ours[0]} rows, DuckDB {theirs[0]} (or their values)"
    if query == "q5":  # windows riverbed's watermark closed (the last few stay open)
        want = want[want["window_start"].isin(table["window_start"])]
        on = ["window_start"]
    elif query == "q15":
        on = ["window_start"]
    elif query == "q11":
        want = want.assign(key=want["key"].astype(str))
        want["window_end"] = pd.to_datetime(want["window_end"], utc=True)
        on = ["window_start", "key"]
    else:
        on = ["window_start", "key"]
    merged = want.merge(table, on=on, how="outer", suffixes=("_duckdb", ""), indicator=True)
    missing = int((merged["_merge"] != "both").sum())
    if missing:
        return f"DIFFERENT: {missing} rows on one side only (of {len(want)})"
    if query == "topk":
        for row in merged.itertuples():
            counts = pd.Series(row.bidders).value_counts()
            pairs = [(int(p["value"]), int(p["count"])) for p in row.top]
            if [c for _, c in pairs] != counts.iloc[:3].tolist():
                return "DIFFERENT top-k counts"
            if any(counts[v] != c for v, c in pairs):
                return "DIFFERENT top-k values"
        return f"IDENTICAL ({len(merged)} rows)"
    columns = [c for c in want.columns if c not in on]
    for column in columns:
        a, b = merged[f"{column}_duckdb"], merged[column]
        same = (a == b) | (a.isna() & b.isna())
        if column == "avg_price":
            same = np.isclose(a, b, rtol=1e-12)
        if not same.all():
            return f"DIFFERENT {column}: {int((~same).sum())} of {len(merged)} rows"
    return f"IDENTICAL ({len(merged)} rows)"


# -- Flink ---------------------------------------------------------------------------------
def run_flink(python: Path, csv: Path, query: str, watermark_s: int) -> dict[str, Any]:
    from flink_peer import run_script

    return run_script(python, HERE / "nexmark_flink.py", str(csv), query, str(watermark_s))


def flink_check(query: str, rows: list[list[Any]], want: pd.DataFrame) -> str:
    """Flink's final rows (a per-event query's: their digest) against DuckDB's answer."""
    if query in STATELESS:
        theirs = tuple(rows)
        ours = rows_digest(want)
        if theirs == ours:
            return "IDENTICAL"
        return f"DIFFERENT: {theirs[0]} rows, DuckDB {ours[0]} (or their values)"
    ms = want["window_start"].dt.as_unit("ms").astype("int64")
    if query == "q5":
        got = dict((int(w), int(n)) for w, n in rows)  # (window start, the most bids)
        truth = dict(zip(ms, want["maxn"], strict=True))
        if got == truth:
            return "IDENTICAL"
        return f"DIFFERENT max in {sum(got.get(w) != n for w, n in truth.items())} windows"
    if query == "q11":
        got = {(str(b), s) for b, s, _, _ in rows}
        truth = set(zip(want["key"].astype(str), ms, strict=True))
        counts = sorted(r[3] for r in rows) == sorted(want["bids"].tolist())
        return "IDENTICAL" if got == truth and counts else "DIFFERENT sessions"
    numbers = ["bids", "rank1_bids", "rank2_bids", "rank3_bids"] + (
        ["min_price", "max_price"] if query == "q17" else _distinct_names()
    )
    keyed = {"q15": 1, "q16": 2, "q17": 2}[query]  # Flink's key columns: [key,] day
    got_rows = {tuple(str(v) for v in r[:keyed]): r[keyed:] for r in rows}
    if len(got_rows) != len(want):
        return f"DIFFERENT: {len(got_rows)} rows, DuckDB {len(want)}"
    for _, row in want.iterrows():
        day = row["window_start"].strftime("%Y-%m-%d")
        key = (day,) if keyed == 1 else (str(row["key"]), day)
        values = got_rows.get(key)
        if values is None or [float(v) for v in values[: len(numbers)]] != [
            float(row[c]) for c in numbers
        ]:
            return f"DIFFERENT at {key}"
    return "IDENTICAL"


def _distinct_names() -> list[str]:
    return [f"{p}{c}s" for c in ("bidder", "auction") for p in ("", "rank1_", "rank2_", "rank3_")]


# -- the run ---------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=1000, help="events per second of event time")
    parser.add_argument("--batches", type=int, default=10, help="riverbed's batches a query")
    parser.add_argument("--watermark", type=int, default=10, help="seconds, both systems")
    parser.add_argument(
        "--only", default="q0,q1,q2,q5,q11,q14,q15,q16,q17,q21,q22,topk,last"
    )  # fmt: skip
    parser.add_argument("--no-flink", action="store_true")
    parser.add_argument(
        "--driver-records", type=int, default=None,
        help="riverbed's driverBatchRecords (default: its own, 50,000)",
    )  # fmt: skip
    parser.add_argument(
        "--through-topic", action="store_true",
        help="q5's second aggregation in a driver of its own, over the first's results topic",
    )  # fmt: skip
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from stream import bench_session

    queries = args.only.split(",")
    bids = generate(args.events, args.seed, args.rate)
    batch = -(-len(bids) // args.batches)
    print(
        f"Nexmark: {args.events:,} events, {len(bids):,} bids over "
        f"{(bids['ts'].max() - bids['ts'].min()).total_seconds():,.0f} s of event time; "
        f"{bids['auction'].nunique():,} auctions, {bids['bidder'].nunique():,} bidders",
        flush=True,
    )
    flink: dict[str, dict[str, Any]] = {}
    fixed = None
    with tempfile.TemporaryDirectory(prefix="rb-nexmark-") as tmp:
        root = Path(tmp)
        if not args.no_flink:
            from flink_peer import flink_python, write_csv

            python = flink_python()
            csv = write_csv(bids, root / "csv")
            tiny = write_csv(bids.head(1000), root / "csv-tiny")
            fixed = run_flink(python, tiny, "q17", args.watermark).get("seconds")
            for query in queries:
                if query in ("topk", "last"):
                    continue
                flink[query] = run_flink(python, csv, query, args.watermark)
                if "digest" in flink[query]:  # a per-event query's many rows
                    flink[query]["rows"] = flink[query].pop("digest")
                print(f"  Flink {query}: {flink[query].get('seconds', 'error')}", flush=True)
        spark = bench_session()
        url = f"file://{root / 'log'}"
        fill(url, bids)
        warm = f"file://{root / 'warm'}"
        fill(warm, bids.head(20_000))
        all_specs = specs(f"{args.watermark}s")
        # every query's own way warmed up once (its Spark jobs: shuffled or co-located
        # stages, the Python workers, the JIT), as a running stream is: the first query
        # measured cold took ~50% longer (q15 9-10 s first, 6.3 s after another)
        for query in queries:
            if query in STATELESS:
                run_select(spark, warm, root / f"warmup-{query}", query, 5_000)
                continue
            run_riverbed(spark, warm, root / f"warmup-{query}", all_specs[query], 5_000, 0)
        rows = []
        for query in queries:
            if query in STATELESS:
                seconds, table = run_select(spark, url, root / query, query, batch)
                tables = [table]
            else:
                seconds, tables = run_riverbed(
                    spark, url, root / query, all_specs[query], batch, args.driver_records,
                    args.through_topic,
                )  # fmt: skip
            want = duckdb_answer(bids, query)
            ours = compare(query, tables, want)
            theirs = flink.get(query, {})
            rows.append(
                {
                    "query": query,
                    "riverbed_s": seconds,
                    "riverbed_rate": len(bids) / seconds,
                    "riverbed_check": ours,
                    "flink_s": theirs.get("seconds"),
                    "flink_rate": len(bids) / theirs["seconds"] if "seconds" in theirs else None,
                    "flink_check": (
                        flink_check(query, theirs["rows"], want)
                        if "rows" in theirs
                        else theirs.get("error", "not run")
                    ),
                }
            )
            print(f"  riverbed {query}: {seconds:.1f} s, {ours}", flush=True)
        spark.stop()
    report(rows, fixed, len(bids))


def report(rows: list[dict[str, Any]], fixed: float | None, bids: int) -> None:
    print()
    print(
        "| query | riverbed s | riverbed bids/s | vs DuckDB | Flink s | Flink bids/s | "
        "vs DuckDB | riverbed / Flink |"
    )
    print("|---|---:|---:|---|---:|---:|---|---:|")
    for r in rows:
        ratio = r["riverbed_rate"] / r["flink_rate"] if r["flink_rate"] else None
        print(
            f"| {r['query']} | {r['riverbed_s']:.1f} | {r['riverbed_rate']:,.0f} | "
            f"{r['riverbed_check']} | "
            + (f"{r['flink_s']:.1f} | {r['flink_rate']:,.0f} | " if r["flink_s"] else "— | — | ")
            + f"{r['flink_check']} | "
            + (f"**{ratio:.2f}x** |" if ratio else "— |")
        )
    if fixed is not None:
        print(f"\nFlink's fixed cost of a job (1,000 bids): {fixed:.1f} s, included above.")
    print(f"{bids:,} bids; riverbed in batches, warmed up; Flink parallelism 2, mini-batch.")


if __name__ == "__main__":
    main()
