"""A driver joining two riverbed topics on the DataFrame path (both sides ``Frame(df)``
over ``spark.readStream.format("riverbed")``), as a user's process runs one:
``python join_frames_driver.py LOG CHECKPOINT OUTPUT SHAPE HOW [--once] [--records N]``
— SHAPE ``within`` (10 minutes before to 1 hour after), ``window`` (30 minutes) or
``lookup:<table>`` (the orders enriched from a Parquet file's ``label`` by order id); runs
until stopped (a micro-batch a second), or with ``--once`` over what the topics hold;
each side's micro-batch at most N records (default 60)."""

from __future__ import annotations

import sys


def main(
    log_url: str, checkpoint: str, output: str, shape: str, how: str, once: bool, records: int
) -> int:
    from dataclasses import replace

    from riverbed.config import load_config
    from riverbed.spark import session
    from riverbed.stream import Frame, Join, Lookup, register
    from riverbed.stream.joinquery import start_join

    # riverbed.toml's and RIVERBED_SPARK_CONF's settings, as a user's driver would take
    # them (the tests' quick ones: no UI, 2 shuffle partitions, a C1 JVM)
    config = load_config().spark
    spark = session(replace(config, master="local[2]", app_name="riverbed-join-frames"))
    register(spark)

    def side(topic: str, schema: str) -> Frame:
        return Frame(
            spark.readStream.format("riverbed")
            .option("topic", topic)
            .option("log", log_url)
            .option("schema", schema)
            .option("maxRecordsPerBatch", records)
            .load()
        )

    orders = side("orders", "order_id long, amount double, ts timestamp")
    if shape.startswith("lookup:"):  # the orders enriched from a Parquet table
        join = Join(
            name="labelled", left=orders, time="ts", topic="labelled_rows", how=how,  # type: ignore[arg-type]
            right=Lookup(shape.split(":", 1)[1], on="order_id", columns={"label": "label"}),
        )  # fmt: skip
    else:
        join = Join(
            name="paid", left=orders,
            right=side("payments", "order_id long, paid double, ts timestamp"),
            on="order_id", time="ts", how=how, watermark="2h", state_partitions=3,  # type: ignore[arg-type]
            **({"within": ("10m", "1h")} if shape == "within" else {"window": "30m"}),  # type: ignore[arg-type]
        )  # fmt: skip
    trigger = {"availableNow": True} if once else {"processingTime": "1 second"}
    query = start_join(
        spark, join, checkpoint=checkpoint, output=output, log_url=log_url, trigger=trigger
    )
    query.awaitTermination()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    given = sys.argv[1:]
    records = 60
    if "--records" in given:
        at = given.index("--records")
        records = int(given[at + 1])
        del given[at : at + 2]
    args = [a for a in given if a != "--once"]
    sys.exit(main(*args[:5], once="--once" in given, records=records))
