"""A riverbed driver that is only a Spark Connect client, as a user's process runs one:
``python connect_driver.py URL LOG CHECKPOINT OUTPUT WINDOW`` aggregates the topic
``events`` of LOG through the server at URL (``WINDOW``: ``tumbling`` or ``session``;
``native``/``native-shuffled``: on the log-native path, its tasks on the server,
co-located or shuffled). A process of its
own: PySpark puts a whole process in Connect mode, and a classic session in the same
process (a test worker's) refuses a Connect one."""

from __future__ import annotations

import sys
from dataclasses import replace


def main(url: str, log_url: str, checkpoint: str, output: str, window: str) -> int:
    from pyspark.sql import SparkSession

    from riverbed.config import SparkConfig
    from riverbed.spark import is_connect, session
    from riverbed.stream import Aggregation, Count, Distinct, Session, Sum, Topic, Tumbling
    from riverbed.stream.dataframe import start
    from riverbed.stream.errors import StreamValueError
    from tests.stream.test_engine import SCHEMA, source

    spark: SparkSession = session(SparkConfig(master=url))
    assert is_connect(spark), type(spark)
    metrics = {"events": Count(), "users": Distinct("user_id"), "total": Sum("amount")}
    spec = Aggregation(
        name=f"remote_{window.replace('-', '_')}", key="flag", time="ts", watermark="10h",
        window=Session("5m") if window == "session" else Tumbling("1h"), metrics=metrics,
        state_partitions=2,
    )  # fmt: skip
    if window.startswith("native"):  # riverbed's own loop; its tasks run on the server
        shuffled = window == "native-shuffled"
        options = {
            "co_locate": "false" if shuffled else "auto", "maxRecordsPerBatch": "400",
            "schema": SCHEMA,
        }  # fmt: skip
        topic = Topic("events", log_url, options)
        spec = replace(spec, state_partitions=3)
        try:
            query = start(
                spark, spec, topic, checkpoint=checkpoint, output=output,
                trigger={"availableNow": True},
            )  # fmt: skip
        except StreamValueError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 2
    else:
        query = start(
            spark, spec, source(spark, log_url, max_records=500), checkpoint=checkpoint,
            output=output, log_url=log_url, trigger={"availableNow": True},
        )  # fmt: skip
    query.awaitTermination(300)
    error = query.exception()
    if error is not None:
        print(f"failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
