"""How a batch ends, for both paths — the log-native one (:mod:`riverbed.stream.lognative`)
and the DataFrame one (:mod:`riverbed.stream.dataframe`): the side topics (late and
malformed records), then :func:`finish` — the result table, the optional sinks (a SQL
table, a results topic) and the batch record marked done."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.stream.engine import EngineConfig
from riverbed.stream.errors import StreamValueError
from riverbed.stream.records import BatchLog, finish_batch
from riverbed.stream.results import write_output
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


def finish(
    config: EngineConfig,
    batches: BatchLog,
    batch_id: int,
    record: dict[str, Any],
    rows: pd.DataFrame | pa.Table,
    *,
    outputs_from: float | None = None,
) -> None:
    """The end of every batch, whichever path ran it — the one place it is written:

    1. check the driver's fence: a replaced driver publishes nothing;
    2. replace the result table's directory of the batch (atomic; a re-run replaces it);
    3. upsert into the SQL table and append to the results topic, if asked (both
       idempotent per batch id);
    4. mark the batch record done, with running totals — the commit — and every
       ``snapshot_every`` batches run the maintenance (:func:`finish_batch`).

    With ``outputs_from`` (a ``time.perf_counter()`` reading), the time since then is
    recorded as the batch's ``ms.outputs``."""
    config.fence()
    written = write_output(config.output, config.spec, batch_id, rows)
    if config.sql_url or config.results_topic:
        publish(config, batch_id, rows if isinstance(rows, pd.DataFrame) else written.to_pandas())
    if outputs_from is not None:
        record.setdefault("ms", {})["outputs"] = round((time.perf_counter() - outputs_from) * 1000)
    finish_batch(config, batches, batch_id, record)


__all__ = ["SIDE_LIMIT", "finish", "publish", "side_outputs"]
