"""One Nexmark query as a Flink SQL job over the bids of ``benchmarks/nexmark.py``, run
in Flink's own virtualenv (it imports PyFlink, never riverbed).

    .venv-flink/bin/python benchmarks/nexmark_flink.py CSV_DIR QUERY WATERMARK_S

Flink's settings for these shapes, from its performance tuning guide: parallelism 2
(the machine's cores), heap state, mini-batch (5,000 rows / 1 s), two-phase
aggregation, and split distinct aggregation for the ``COUNT(DISTINCT)`` queries. The
bids are CSV files (one per source task, each in time order) with a watermark of
WATERMARK_S seconds; the job ends with its input, which closes every window. Prints
one JSON line: the job's seconds (submission to its end; its rows go to CSV files
inside Flink, read afterwards) and its rows.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

RANKS = """count(*) FILTER (WHERE price < 10000),
           count(*) FILTER (WHERE price >= 10000 AND price < 1000000),
           count(*) FILTER (WHERE price >= 1000000)"""
DISTINCTS = """count(DISTINCT bidder),
           count(DISTINCT bidder) FILTER (WHERE price < 10000),
           count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000),
           count(DISTINCT bidder) FILTER (WHERE price >= 1000000),
           count(DISTINCT auction),
           count(DISTINCT auction) FILTER (WHERE price < 10000),
           count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000),
           count(DISTINCT auction) FILTER (WHERE price >= 1000000)"""
SQL = {
    # hot items: per 10 s window sliding by 2 s, the most bids on one auction — the
    # counts' windows cascaded into a 2 s tumbling window on their window_time (which
    # ends 8 s after the hop window's start); insert-only, as Nexmark's join of the
    # counts with their maximum is not (a file sink cannot take its updates)
    "q5": """WITH counts AS (
                SELECT auction, count(*) AS num, window_time
                FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND,
                               INTERVAL '10' SECOND))
                GROUP BY auction, window_start, window_end, window_time)
             SELECT TIMESTAMPADD(SECOND, -8, window_start) AS starttime, max(num) AS maxn
             FROM TABLE(TUMBLE(TABLE counts, DESCRIPTOR(window_time), INTERVAL '2' SECOND))
             GROUP BY window_start, window_end""",
    # user sessions: bids per bidder per session (10 s gap), the session window TVF
    "q11": """SELECT bidder, window_start, window_end, count(*)
              FROM TABLE(SESSION(TABLE bids PARTITION BY bidder, DESCRIPTOR(ts),
                                 INTERVAL '10' SECOND))
              GROUP BY bidder, window_start, window_end""",
    # bidding statistics per day (a day's tumbling window: final rows only, Flink's
    # window aggregation; Nexmark spells it GROUP BY DATE_FORMAT(dateTime, ...), an
    # updating aggregation whose rows a file sink cannot take)
    "q15": f"""SELECT DATE_FORMAT(window_start, 'yyyy-MM-dd'), count(*), {RANKS}, {DISTINCTS}
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' DAY))
               GROUP BY window_start, window_end""",
    # channel statistics per day
    "q16": f"""SELECT channel, DATE_FORMAT(window_start, 'yyyy-MM-dd'), count(*), {RANKS},
                      {DISTINCTS}
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' DAY))
               GROUP BY channel, window_start, window_end""",
    # auction statistics per day
    "q17": f"""SELECT auction, DATE_FORMAT(window_start, 'yyyy-MM-dd'), count(*), {RANKS},
                      min(price), max(price), avg(price), sum(price)
               FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' DAY))
               GROUP BY auction, window_start, window_end""",
    # the per-event queries (no window, no state; Nexmark's ``extra`` column is not
    # generated, q14 counts the 'c's of the url instead, with Flink's own functions)
    "q0": "SELECT auction, bidder, price, channel, url, ts FROM bids",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, ts FROM bids",
    "q2": "SELECT auction, price FROM bids WHERE MOD(auction, 123) = 0",
    "q14": """SELECT auction, bidder, 0.908 * price AS price,
                     CASE WHEN HOUR(ts) >= 8 AND HOUR(ts) <= 18 THEN 'dayTime'
                          WHEN HOUR(ts) <= 6 OR HOUR(ts) >= 20 THEN 'nightTime'
                          ELSE 'otherTime' END AS bidTimeType,
                     ts, CHAR_LENGTH(url) - CHAR_LENGTH(REPLACE(url, 'c', '')) AS c_counts
              FROM bids WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
    "q21": """SELECT auction, bidder, price, channel,
                     CASE WHEN LOWER(channel) = 'apple' THEN '0'
                          WHEN LOWER(channel) = 'google' THEN '1'
                          WHEN LOWER(channel) = 'facebook' THEN '2'
                          WHEN LOWER(channel) = 'baidu' THEN '3'
                          ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
              FROM bids
              WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL
                 OR LOWER(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    "q22": """SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1,
                     SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3
              FROM bids""",
}
STATELESS = ("q0", "q1", "q2", "q14", "q21", "q22")  # their rows: counted and digested


def plain(text: str) -> Any:
    """A CSV field as a number, a timestamp as epoch ms (Flink's TIMESTAMP is zone-less:
    UTC here), else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if len(text) >= 19 and text[4] == "-" and text[10] == " ":
        moment = datetime.fromisoformat(text.replace(" ", "T")).replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    return text


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from flink_conf import configure, digest, run_to_csv  # beside this script

    csv_dir, query, watermark_s = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tuned = len(sys.argv) <= 4 or sys.argv[4] != "plain"
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    configure(env.get_config(), "hashmap", tuned)
    env.execute_sql(
        f"""CREATE TABLE bids (
              auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
              ts TIMESTAMP(3),
              WATERMARK FOR ts AS ts - INTERVAL '{watermark_s}' SECOND
            ) WITH ('connector' = 'filesystem', 'path' = '{csv_dir}', 'format' = 'csv')"""
    )
    # the rows go to CSV files inside Flink (a Python client collecting them takes
    # ~1-2 ms a row through py4j: most of a job's time at 10,000 rows), read after
    if query in STATELESS:  # millions of rows: their digest (flink_conf.digest)
        kept: list[list[Any]] = []
        count, total = 0, 0

        def fold(row: list[Any]) -> None:
            nonlocal count, total
            kept.append(row)
            if len(kept) >= 100_000:
                n, t = digest(kept)
                count, total = count + n, (total + t) % 2**64
                kept.clear()

        seconds, _ = run_to_csv(env, SQL[query], plain, fold)
        n, t = digest(kept)
        print(json.dumps({"seconds": seconds, "digest": [count + n, (total + t) % 2**64]}))
        return
    seconds, rows = run_to_csv(env, SQL[query], plain)
    print(json.dumps({"seconds": seconds, "rows": sorted(rows, key=str)}))


if __name__ == "__main__":
    main()
