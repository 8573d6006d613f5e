"""One join of ``benchmarks/joins.py`` as a Flink SQL job, run in Flink's own
virtualenv (it imports PyFlink, never riverbed).

    .venv-flink/bin/python benchmarks/joins_flink.py ORDERS_CSV PAYMENTS_CSV QUERY WATERMARK_S

Flink's settings as ``nexmark_flink.py``'s (parallelism 2, heap state); the orders and
payments are CSV files (one per source task, each in time order) with a watermark of
WATERMARK_S seconds; the job ends with its input, which closes every window and
interval. Prints one JSON line: the job's seconds (submission to its end; its rows go to
CSV files inside Flink, read afterwards) and its rows: (order, its time, the payment's
time or empty), times in epoch ms.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

SQL = {
    # each order with its payments 10 minutes before to 1 hour after it, unpaid ones too
    # (times cast to plain timestamps: a sink takes one rowtime column at most)
    "interval": """SELECT o.order_id, CAST(o.ts AS TIMESTAMP(3)), CAST(p.ts AS TIMESTAMP(3))
                   FROM orders o LEFT JOIN payments p ON o.order_id = p.order_id
                   AND p.ts BETWEEN o.ts - INTERVAL '10' MINUTE AND o.ts + INTERVAL '1' HOUR""",
    # orders and payments of one customer in the same 10-minute window (a window join)
    "window": """SELECT L.order_id, CAST(L.ts AS TIMESTAMP(3)), CAST(R.ts AS TIMESTAMP(3))
                 FROM
                   (SELECT * FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts),
                                               INTERVAL '10' MINUTES))) L
                 JOIN
                   (SELECT * FROM TABLE(TUMBLE(TABLE payments, DESCRIPTOR(ts),
                                               INTERVAL '10' MINUTES))) R
                 ON L.customer = R.customer AND L.window_start = R.window_start
                    AND L.window_end = R.window_end""",
}


def _field(text: str) -> Any:
    """An order id as a number, a time as epoch ms (Flink's TIMESTAMP is zone-less: UTC
    here), no payment's time as ``""``."""
    if not text or text.lstrip("-").isdigit():
        return int(text) if text else ""
    moment = datetime.fromisoformat(text.replace(" ", "T")).replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from flink_conf import configure, run_to_csv  # beside this script

    orders, payments, query, watermark_s = sys.argv[1:5]
    seconds = int(watermark_s)  # as h:mm:ss (Flink's SECOND precision stops at 99)
    delay = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    configure(env.get_config(), "hashmap", True)
    for name, path, value in (("orders", orders, "amount"), ("payments", payments, "paid")):
        env.execute_sql(
            f"""CREATE TABLE {name} (
                  customer BIGINT, order_id BIGINT, {value} DOUBLE, ts TIMESTAMP(3),
                  WATERMARK FOR ts AS ts - INTERVAL '{delay}' HOUR TO SECOND
                ) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')"""
        )
    seconds, rows = run_to_csv(env, SQL[query], _field)
    print(json.dumps({"seconds": seconds, "rows": rows}))


if __name__ == "__main__":
    main()
