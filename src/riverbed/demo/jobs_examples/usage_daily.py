"""Per-customer daily usage, from the ``usage`` topic of a riverbed log, on Spark.

Work ids are days (``20261103``); one chunk aggregates two days. Each day's table is
written as its own file (``day=<day>.parquet``) through ``ctx.output``, so it is
published only if this attempt is the one recorded DONE — a worker that dies, or a
zombie that wakes up after its chunk was given to another worker, publishes nothing.
"""

from __future__ import annotations

import os
import time

import riverbed.log
from riverbed.config import load_config
from riverbed.jobs import Job
from riverbed.jobs.context import Context


def usage_log() -> str:
    """The configured log (RIVERBED_LOG; by default the file log under RIVERBED_HOME)."""
    return load_config().log_url


def main(ctx: Context, work_ids: list[int]) -> None:
    days = set(work_ids)
    log = riverbed.log.open(usage_log())
    rows = [
        (r.value["customer"], r.value["day"], r.value["units"])
        for p in range(log.topic("usage").partitions)
        for r in log.iter_records("usage", p)
        if r.value["day"] in days
    ]
    log.close()
    events = ctx.spark.createDataFrame(rows, "customer string, day long, units long")
    daily = (
        events.groupBy("day", "customer")
        .agg({"units": "sum", "*": "count"})
        .withColumnRenamed("sum(units)", "units")
        .withColumnRenamed("count(1)", "events")
        .toPandas()
    )
    for day in work_ids:
        ctx.output.write_parquet(f"day={day}.parquet", daily[daily.day == day])
    # The demo's data is small; RIVERBED_DEMO_PACE keeps each chunk running long
    # enough for its crashes to land mid-chunk.
    time.sleep(float(os.environ.get("RIVERBED_DEMO_PACE", "0")))


job = Job(main=main, chunk_size=2, kind="spark", retries=2, retry_backoff="1s")
