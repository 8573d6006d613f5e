"""One join query of ``benchmarks/nexmark_joins.py`` as a Flink SQL job, run in Flink's own
virtualenv (it imports PyFlink, never riverbed).

    .venv-flink/bin/python benchmarks/nexmark_joins_flink.py PERSONS AUCTIONS BIDS SIDE QUERY \
        WATERMARK_S

Flink's settings as ``nexmark_flink.py``'s (parallelism 2, heap state); each stream is
CSV files (one per source task, each in time order) with a watermark of WATERMARK_S
seconds; the job ends with its input, which closes every window and interval. Prints
one JSON line: the job's seconds (submission to its end; its rows go to CSV files
inside Flink, read afterwards) and its rows, times in epoch ms.
"""

from __future__ import annotations

import json
import sys

SQL = {
    # q8: persons and the auctions they opened in the same 10-second window (the window
    # join of two TUMBLE table functions), one row per (person, auction)
    "q8": """SELECT P.id, A.id, CAST(P.ts AS TIMESTAMP(3)), CAST(A.ts AS TIMESTAMP(3))
             FROM (SELECT * FROM TABLE(TUMBLE(TABLE persons, DESCRIPTOR(ts),
                                              INTERVAL '10' SECOND))) P
             JOIN (SELECT * FROM TABLE(TUMBLE(TABLE auctions, DESCRIPTOR(ts),
                                              INTERVAL '10' SECOND))) A
             ON P.id = A.seller AND P.window_start = A.window_start
                AND P.window_end = A.window_end""",
    # q9's join: each auction with the bids of its first 10 seconds (an interval join),
    # auctions without one kept
    "q9j": """SELECT A.id, B.bidder, B.price, CAST(B.ts AS TIMESTAMP(3))
              FROM auctions A LEFT JOIN bids B ON A.id = B.auction
              AND B.ts BETWEEN A.ts AND A.ts + INTERVAL '10' SECOND""",
    # q9's join as Nexmark bounds it: each auction with the bids up to its own expires
    # (a regular join with a time condition: expires is not a time attribute)
    "q9i": """SELECT A.id, B.bidder, B.price, CAST(B.ts AS TIMESTAMP(3))
              FROM auctions A JOIN bids B ON A.id = B.auction
              AND B.ts BETWEEN A.ts AND A.expires""",
    # q9 whole: each auction's highest bid up to its expires (ties: the earliest, then
    # the smallest bidder) — the interval join (time attributes kept) then a window
    # Top-N over the auction's time, Flink's insert-only form (Nexmark's ROW_NUMBER()
    # over a regular join updates its rows, which a file sink cannot take)
    "q9": """SELECT id, bidder, price, CAST(bts AS TIMESTAMP(3)) FROM (
               SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, id
                                            ORDER BY price DESC, bts ASC, bidder ASC) AS n
               FROM TABLE(TUMBLE(TABLE q9_joined, DESCRIPTOR(ats), INTERVAL '10' SECOND)))
             WHERE n <= 1""",
    # q4: the average closing price per category — each auction's highest bid up to its
    # expires (a window aggregation over the auction's time, 10 s), averaged per
    # category over a 1-day window of its window_time (the insert-only form)
    "q4": """SELECT category, AVG(CAST(final AS DOUBLE))
             FROM TABLE(TUMBLE(TABLE q4_max, DESCRIPTOR(wt), INTERVAL '1' DAY))
             GROUP BY window_start, window_end, category""",
    # q3: sellers in OR, ID or CA and their auctions of category 10 — Nexmark's regular
    # join (no window, no interval: Flink keeps both tables' rows for good)
    "q3": """SELECT P.id, P.name, P.state, A.id
             FROM persons P JOIN auctions A ON P.id = A.seller
             WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')""",
    # q20: bids with their auction's row, for auctions of category 10 (a regular join)
    # q13: each bid with its side input's row on auction mod 10000 — a regular join with
    # the bounded table: Flink's filesystem tables are no lookup source
    "q13": """SELECT B.auction, B.bidder, B.price, CAST(B.ts AS TIMESTAMP(3)), S.`value`
              FROM bids B JOIN side S ON MOD(B.auction, 10000) = S.`key`""",
    # q7: the bids with the highest price of a 10-second window ending at most 10 s
    # after them (Nexmark's; a regular join: window_end is no time attribute)
    "q7": """SELECT B.auction, B.bidder, B.price, CAST(B.ts AS TIMESTAMP(3))
             FROM bids B JOIN (
               SELECT MAX(price) AS maxprice, window_end
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
               GROUP BY window_start, window_end) M
             ON B.price = M.maxprice
             WHERE B.ts BETWEEN M.window_end - INTERVAL '10' SECOND AND M.window_end""",
    "q20": """SELECT B.auction, B.bidder, B.price, B.channel, CAST(B.ts AS TIMESTAMP(3)),
                     A.seller, A.reserve, CAST(A.ts AS TIMESTAMP(3))
              FROM bids B JOIN auctions A ON B.auction = A.id WHERE A.category = 10""",
}
TABLES = {
    "persons": "id BIGINT, name STRING, state STRING",
    "auctions": "id BIGINT, seller BIGINT, category BIGINT, reserve BIGINT, expires TIMESTAMP(3)",
    "bids": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING",
}


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from flink_conf import configure, run_to_csv  # beside this script
    from nexmark_flink import plain

    persons, auctions, bids, side, query, watermark_s = sys.argv[1:7]
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    configure(env.get_config(), "hashmap", True)
    for name, path in (("persons", persons), ("auctions", auctions), ("bids", bids)):
        env.execute_sql(
            f"""CREATE TABLE {name} (
                  {TABLES[name]}, ts TIMESTAMP(3),
                  WATERMARK FOR ts AS ts - INTERVAL '{int(watermark_s)}' SECOND
                ) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')"""
        )
    env.execute_sql(
        f"""CREATE TABLE side (`key` BIGINT, `value` STRING)
            WITH ('connector' = 'filesystem', 'path' = '{side}', 'format' = 'csv')"""
    )
    env.execute_sql(
        """CREATE TEMPORARY VIEW q9_joined AS
           SELECT A.id, A.category, A.ts AS ats, B.bidder, B.price, B.ts AS bts
           FROM auctions A JOIN bids B ON A.id = B.auction
           AND B.ts BETWEEN A.ts AND A.ts + INTERVAL '20' SECOND AND B.ts <= A.expires"""
    )
    env.execute_sql(
        """CREATE TEMPORARY VIEW q4_max AS
           SELECT id, category, MAX(price) AS final, window_time AS wt
           FROM TABLE(TUMBLE(TABLE q9_joined, DESCRIPTOR(ats), INTERVAL '10' SECOND))
           GROUP BY window_start, window_end, window_time, id, category"""
    )
    seconds, rows = run_to_csv(env, SQL[query], plain)
    print(json.dumps({"seconds": seconds, "rows": rows}))


if __name__ == "__main__":
    main()
