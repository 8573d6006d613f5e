"""What a finished batch writes besides its result table: the side topics (late and
malformed records) and the optional sinks (a SQL table, a results topic). Shared by
the log-native path (:mod:`riverbed.stream.direct`) and the DataFrame path
(:mod:`riverbed.stream.runner`)."""

from __future__ import annotations

import pandas as pd

from riverbed.stream.engine import BatchLog, EngineConfig
from riverbed.stream.errors import StreamValueError
from riverbed.stream.sinks import plain

SIDE_LIMIT = 100_000  # late / malformed records written per batch to the side topics


def side_outputs(
    config: EngineConfig,
    batch_id: int,
    batches: BatchLog,
    dlq: pd.DataFrame | None,
    late: pd.DataFrame | None,
) -> None:
    """Write up to SIDE_LIMIT records each to <name>.dlq and <name>.late, once per batch."""
    if all(frame is None or frame.empty for frame in (dlq, late)):
        return
    if config.log_url is None or (batches.get(batch_id) or {}).get("side_outputs_written"):
        return
    config.fence()
    import riverbed.log

    log_ = riverbed.log.open(config.log_url)
    try:
        for suffix, frame in ((".dlq", dlq), (".late", late)):
            if frame is None or frame.empty:
                continue
            topic = config.spec.name + suffix
            if topic not in log_.topics():
                log_.create_topic(topic, 1)
            log_.producer(topic).send_batch(
                [
                    {k: plain(v) for k, v in row.items()} | {"batch_id": batch_id}
                    for row in frame.head(SIDE_LIMIT).to_dict("records")
                ]
            )
    finally:
        log_.close()
    batches.update(batch_id, side_outputs_written=True)


def publish(config: EngineConfig, batch_id: int, rows: pd.DataFrame) -> None:
    """The batch's rows to the optional sinks: the SQL table and the results topic."""
    from riverbed.stream.sinks import SqlSink, TopicSink

    if config.sql_url:
        SqlSink(config.sql_url).upsert(config.spec.name, rows)
    if config.results_topic:
        if config.log_url is None:
            raise StreamValueError("a results topic needs a log: pass log_url")
        sink = TopicSink(config.log_url, config.results_topic, config.spec.state_partitions)
        try:
            sink.write(batch_id, rows)
        finally:
            sink.close()


__all__ = ["SIDE_LIMIT", "publish", "side_outputs"]
