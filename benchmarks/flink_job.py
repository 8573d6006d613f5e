"""One Flink SQL job over the benchmark's events, run by ``benchmarks/flink_peer.py`` in
Flink's own virtualenv (it imports PyFlink, never riverbed).

    .venv-flink/bin/python benchmarks/flink_job.py CSV_DIR QUERY STATE

QUERY: ``window`` (window TVF TUMBLE + COUNT(DISTINCT)), ``window-approx``
(APPROX_COUNT_DISTINCT), ``group`` (group aggregation on the hour, mini-batch and
split distinct aggregation on) or ``scan`` (the events read and parsed into a blackhole
sink: what reading the input alone costs). STATE: ``hashmap`` (heap) or ``rocksdb``. Prints one
JSON line: the job's seconds and its final rows ``[flag, window start ms, users,
events]``.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from flink_conf import configure  # beside this script

    csv_dir, query, state = sys.argv[1:4]
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    # Flink's own advice for COUNT(DISTINCT) on skewed keys, for the group aggregation
    configure(env.get_config(), state, tuned=query == "group")
    env.execute_sql(
        f"""CREATE TABLE events (
              user_id BIGINT, flag STRING, ts TIMESTAMP(3),
              WATERMARK FOR ts AS ts - INTERVAL '10' MINUTE
            ) WITH ('connector' = 'filesystem', 'path' = '{csv_dir}', 'format' = 'csv')"""
    )
    distinct = (
        "APPROX_COUNT_DISTINCT(user_id)"
        if query == "window-approx"
        else ("COUNT(DISTINCT user_id)")
    )
    if query.startswith("window"):
        sql = f"""SELECT flag, window_start, {distinct} AS users, COUNT(*) AS events
                  FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' HOUR))
                  GROUP BY flag, window_start, window_end"""
    else:
        sql = """SELECT flag, FLOOR(ts TO HOUR) AS window_start,
                        COUNT(DISTINCT user_id) AS users, COUNT(*) AS events
                 FROM events GROUP BY flag, FLOOR(ts TO HOUR)"""
    began = time.perf_counter()
    if query == "scan":
        env.execute_sql(
            "CREATE TABLE sink (user_id BIGINT, flag STRING, ts TIMESTAMP(3)) "
            "WITH ('connector' = 'blackhole')"
        )
        env.execute_sql("INSERT INTO sink SELECT * FROM events").wait()
        print(json.dumps({"seconds": time.perf_counter() - began, "rows": []}))
        return
    final: dict[tuple[str, int], tuple[int, int]] = {}
    with env.execute_sql(sql).collect() as results:
        for row in results:
            start = row[1].replace(tzinfo=UTC)  # Flink's TIMESTAMP is zone-less: UTC here
            key = (row[0], int(start.timestamp() * 1000))
            kind = str(row.get_row_kind())  # +I, -U, +U, -D
            if kind in ("+I", "+U"):
                final[key] = (int(row[2]), int(row[3]))
            elif kind == "-D":
                final.pop(key, None)
    seconds = time.perf_counter() - began
    rows = [[f, w, u, e] for (f, w), (u, e) in sorted(final.items())]
    print(json.dumps({"seconds": seconds, "rows": rows}))


if __name__ == "__main__":
    main()
