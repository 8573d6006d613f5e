"""One Nexmark query as a Flink SQL job over the bids of ``benchmarks/nexmark.py``, run
in Flink's own virtualenv (it imports PyFlink, never riverbed).

    .venv-flink/bin/python benchmarks/nexmark_flink.py CSV_DIR QUERY WATERMARK_S

Flink's settings for these shapes, from its performance tuning guide: parallelism 2
(the machine's cores), heap state, mini-batch (5,000 rows / 1 s), two-phase
aggregation, and split distinct aggregation for the ``COUNT(DISTINCT)`` queries. The
bids are CSV files (one per source task, each in time order) with a watermark of
WATERMARK_S seconds; the job ends with its input, which closes every window. Prints
one JSON line: the job's seconds (submission to its last row) and its final rows
(retractions applied).
"""

from __future__ import annotations

import json
import sys
import time
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
COUNTS_Q5 = """SELECT auction, count(*) AS num, window_start AS starttime
    FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
    GROUP BY auction, window_start, window_end"""
SQL = {
    # hot items: per 10 s window sliding by 2 s, the auctions with the most bids
    "q5": f"""SELECT a.starttime, a.auction, a.num FROM ({COUNTS_Q5}) a
        JOIN (SELECT starttime, max(num) AS maxn FROM ({COUNTS_Q5}) GROUP BY starttime) m
        ON a.starttime = m.starttime AND a.num >= m.maxn""",
    # user sessions: bids per bidder per session (10 s gap)
    "q11": """SELECT bidder, SESSION_START(ts, INTERVAL '10' SECOND),
                     SESSION_END(ts, INTERVAL '10' SECOND), count(*)
              FROM bids GROUP BY bidder, SESSION(ts, INTERVAL '10' SECOND)""",
    # bidding statistics per day
    "q15": f"""SELECT DATE_FORMAT(ts, 'yyyy-MM-dd'), count(*), {RANKS}, {DISTINCTS}
               FROM bids GROUP BY DATE_FORMAT(ts, 'yyyy-MM-dd')""",
    # channel statistics per day
    "q16": f"""SELECT channel, DATE_FORMAT(ts, 'yyyy-MM-dd'), count(*), {RANKS}, {DISTINCTS}
               FROM bids GROUP BY channel, DATE_FORMAT(ts, 'yyyy-MM-dd')""",
    # auction statistics per day
    "q17": f"""SELECT auction, DATE_FORMAT(ts, 'yyyy-MM-dd'), count(*), {RANKS},
                      min(price), max(price), avg(price), sum(price)
               FROM bids GROUP BY auction, DATE_FORMAT(ts, 'yyyy-MM-dd')""",
}


def plain(value: Any) -> Any:
    if isinstance(value, datetime):  # Flink's TIMESTAMP is zone-less: UTC here
        return int(value.replace(tzinfo=UTC).timestamp() * 1000)
    return value


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    csv_dir, query, watermark_s = sys.argv[1], sys.argv[2], int(sys.argv[3])
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "2")
    conf.set("table.exec.resource.default-parallelism", "2")
    conf.set("state.backend.type", "hashmap")
    conf.set("table.exec.mini-batch.enabled", "true")
    conf.set("table.exec.mini-batch.allow-latency", "1 s")
    conf.set("table.exec.mini-batch.size", "5000")
    conf.set("table.optimizer.agg-phase-strategy", "TWO_PHASE")
    conf.set("table.optimizer.distinct-agg.split.enabled", "true")
    env.execute_sql(
        f"""CREATE TABLE bids (
              auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
              ts TIMESTAMP(3),
              WATERMARK FOR ts AS ts - INTERVAL '{watermark_s}' SECOND
            ) WITH ('connector' = 'filesystem', 'path' = '{csv_dir}', 'format' = 'csv')"""
    )
    began = time.perf_counter()
    final: dict[tuple[Any, ...], list[Any]] = {}
    keys = {"q5": 2, "q11": 3, "q15": 1, "q16": 2, "q17": 2}[query]
    with env.execute_sql(SQL[query]).collect() as results:
        for row in results:
            values = [plain(v) for v in row]
            kind = str(row.get_row_kind())  # +I, -U, +U, -D
            if kind in ("+I", "+U"):
                final[tuple(values[:keys])] = values
            else:
                final.pop(tuple(values[:keys]), None)
    seconds = time.perf_counter() - began
    print(json.dumps({"seconds": seconds, "rows": sorted(final.values(), key=str)}))


if __name__ == "__main__":
    main()
