"""Running an aggregation as a Structured Streaming query, and reading its results."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from riverbed.config import load_config
from riverbed.spark import is_connect, s3a
from riverbed.spark.checkpoint import clear_unfinished_start
from riverbed.state import StateConfig
from riverbed.stream import backfill, lookups, rescale, specrecord
from riverbed.stream.aggregation import DELETED, Aggregation
from riverbed.stream.batch import (
    SIDE_LIMIT,
    finish,
    side_outputs,
    side_outputs_written,
)
from riverbed.stream.batchlog import Batches, BatchRecord, next_record, open_batches
from riverbed.stream.derive import (
    KEPT,
    UNMATCHED,
    Derivation,
    compile_for,
    input_types,
    map_in_arrow,
    spark_schema,
)
from riverbed.stream.doors import as_source, split_sinks
from riverbed.stream.engine import PARTIAL_SCHEMA, EngineConfig, merger, preaggregate
from riverbed.stream.errors import StreamValueError
from riverbed.stream.fencing import check_term
from riverbed.stream.layout import (
    checkpoint_store,
    default_state,
    location,
    spark_location,
)
from riverbed.stream.lookups import tables as lookup_tables
from riverbed.stream.metrics import Custom
from riverbed.stream.pipeline import Pipeline
from riverbed.stream.plan import Trigger, parse_trigger
from riverbed.stream.querystart import START_ATTEMPTS, start_phase, start_query
from riverbed.stream.querystart import transient_start_failure as transient_start_failure
from riverbed.stream.results import current, output_schema, read_table
from riverbed.stream.validity import spark_reason
from riverbed.windows import late_column

log = logging.getLogger(__name__)


def _generation(
    spark: Any,
    checkpoint: str | Path,
    spec: Aggregation,
    state: StateConfig,
    fence: Callable[[], None],
) -> rescale.Generation:
    """The state generation batches use: the current one, or — ``state_partitions``
    changed, as ``stream plan`` said — a new one the state is moved to now (in Spark
    tasks)."""
    now = rescale.current(checkpoint, spec.state_partitions)
    if now.partitions == spec.state_partitions:
        return now
    return rescale.move(
        checkpoint,
        state,
        spec.name,
        spec.sessions,
        now,
        spec.state_partitions,
        fence,
        spark=spark,
    )


def _restore(
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig,
    spec: Aggregation,
    options: dict[str, str] | None,
    source: tuple[str | Path, str],
    fence: Callable[[], None],
) -> None:
    from riverbed.stream import savepoints

    if options is None:
        raise StreamValueError(
            "a DataFrame source cannot start from a savepoint: riverbed cannot read its "
            "events again from the savepoint's offsets (a riverbed or Kafka topic can)"
        )
    home, name = source
    savepoints.restore(
        checkpoint,
        output,
        state,
        spec.name,
        spec.sessions,
        home,
        savepoints.read(home, name),
        fence,
    )


def foreach_batch(config: EngineConfig) -> Any:
    """The ``foreachBatch`` function for ``config``."""
    spec = config.spec
    batches = open_batches(config.checkpoint, config.fence)

    def run(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        record = batches.get(batch_id)
        if record is None:  # first run of this batch: fix its watermark from earlier ones
            record = next_record(batches, batch_id, spec.watermark_ms)
            record.spec = config.shape
            # and the version of each lookup table it joins with (lookups.py)
            record.lookups = lookups.planned(config, batches.previous(batch_id))
        watermark = record.watermark_ms
        engine = lookups.running(config, batches, batch_id, record)
        tables = lookup_tables(config.checkpoint, engine.lookups)
        derived = _derivation(spec, df.schema, tables)
        if derived is not None:  # the spec's columns and where, as the tasks evaluate them
            df = df.mapInArrow(
                map_in_arrow(spec, config.checkpoint, engine.lookups),
                spark_schema(derived, df.schema),
            )
        # an event the aggregation cannot count is malformed (validity.py), beside what
        # the source found malformed itself (its _error column, when it has one)
        unusable = spark_reason(spec, df.schema)
        error = F.coalesce(F.col("_error"), unusable) if "_error" in df.columns else unusable
        # Read the source once: every step below (stats, side outputs, partials) uses it.
        df = df.withColumn("_error", error).cache()
        kept = F.col(KEPT) if KEPT in df.columns else F.lit(True)
        usable = F.col("_error").isNull()
        whole = df.filter(usable & kept).drop("_error", KEPT, UNMATCHED)
        # the event time as epoch ms from here on: pandas' nanoseconds (toPandas,
        # mapInPandas) end in 2262, the calendar in 9999 (validity.py)
        good = whole.select(
            *[F.unix_millis(F.col(c)).alias(c) if c == spec.time else c for c in spec.reads()]
        )
        try:
            # one Spark job for every number the batch records (each its own count was a
            # job of two stages — five a batch, the most of a small batch's time)
            event_ms = F.unix_millis(F.col(spec.time))
            is_late = late_column(spec.window, event_ms, watermark)
            numbers = [
                F.max(F.when(usable & kept, event_ms)).alias("max_ms"),
                F.count(F.when(usable & kept, 1)).alias("n"),
                F.count(F.when(usable & kept & is_late, 1)).alias("late"),
                F.count(F.when(~usable, 1)).alias("malformed"),
                F.count(F.when(usable & ~kept, 1)).alias("filtered"),
            ]
            if spec.lookups:
                numbers.append(F.count(F.when(usable & F.col(UNMATCHED), 1)).alias("unmatched"))
            stats = df.agg(*numbers).first()
            if stats["max_ms"] is not None:
                record.max_event_ms = max(record.max_event_ms, int(stats["max_ms"]))
            # counted once: a re-run keeps the recorded counts
            if record.late is None:
                record.late = int(stats["late"])
            if record.malformed is None:
                record.malformed = int(stats["malformed"])
            if record.filtered is None:
                record.filtered = int(stats["filtered"])
            if record.unmatched is None and spec.lookups:
                record.unmatched = int(stats["unmatched"])
            batches.put(batch_id, record)
            _side_outputs(config, df, lambda: whole.filter(is_late), batch_id, batches, record)

            session = df.sparkSession
            partials = good.mapInPandas(preaggregate(spec, watermark), PARTIAL_SCHEMA)
            heartbeat = session.createDataFrame(
                [(p, 0, None, b"") for p in range(spec.state_partitions)], PARTIAL_SCHEMA
            )
            out = (
                partials.unionByName(heartbeat)
                .groupBy("state_partition")
                .applyInPandas(
                    merger(config, batch_id, watermark, record.previous_watermark_ms),
                    output_schema(spec),
                )
            )
            # the rows a batch emits are few (the windows it changed or closed): collect
            # them as Arrow and write them the way the log-native path does
            rows = out.toArrow()
            record = batches.get(batch_id) or record
            # every record read, as log-native counts it
            read = int(stats["n"]) + (record.malformed or 0) + (record.filtered or 0)
            finish(config, batches, batch_id, replace(record, input=read), rows)
        finally:
            df.unpersist()

    return run


def _derivation(spec: Aggregation, schema: Any, tables: Sequence[Any] = ()) -> Derivation | None:
    """The spec's lookups, columns and where over a DataFrame of ``schema`` (a Spark
    StructType) and lookup snapshots ``tables``, compiled (and so refused, if it cannot
    be evaluated) on the driver."""
    if not spec.derives:
        return None
    from pyspark.sql.pandas.types import to_arrow_schema

    return compile_for(
        spec,
        input_types(to_arrow_schema(schema, timezone="UTC")),
        [t.schema for t in tables],
    )


def _utc(frame: pd.DataFrame) -> pd.DataFrame:
    """Spark writes UTC instants to Parquet; they read back naive. Make them UTC again."""
    for column in ("window_start", "window_end"):
        if column in frame and frame[column].dt.tz is None:
            frame[column] = frame[column].dt.tz_localize("UTC")
    return frame


def _side_outputs(
    config: EngineConfig,
    df: Any,
    late: Callable[[], Any],
    batch_id: int,
    batches: Batches,
    record: BatchRecord,
) -> None:
    """Malformed records to <name>.dlq, late events (whole, so they can be reprocessed)
    to <name>.late — once per batch id, each read only when ``record`` counted some."""
    if config.log_url is None or side_outputs_written(batches, batch_id):
        return
    # through Arrow: its pandas keeps microseconds (toPandas' nanoseconds end in 2262)
    dlq = None
    if record.malformed:
        dlq = (
            df.filter("_error IS NOT NULL")
            .drop(KEPT, UNMATCHED)
            .limit(SIDE_LIMIT)
            .toArrow()
            .to_pandas()
        )
    late_rows = late().limit(SIDE_LIMIT).toArrow().to_pandas() if record.late else None
    side_outputs(config, batch_id, batches, dlq, late_rows)


def start(
    spark: Any,
    spec: Aggregation,
    source: Any,
    *,
    checkpoint: str | Path,
    output: str | Path | None = None,
    sinks: Sequence[Any] = (),
    state: StateConfig | None = None,
    log_url: str | None = None,
    sql: str | None = None,
    topic: str | None = None,
    trigger: dict[str, Any] | None = None,
    term: int | None = None,
    from_savepoint: tuple[str | Path, str] | None = None,
) -> Any:
    """Start the streaming aggregation; returns its query.

    ``source`` is a :class:`~riverbed.stream.doors.Source`: ``Topic("clicks")`` (a
    riverbed topic, the log-native path: the state tasks read the topic themselves and
    riverbed runs the trigger loop, a :class:`riverbed.stream.loop.DirectQuery`),
    ``Kafka(bootstrap=…, topic=…, schema=…)`` (:mod:`riverbed.stream.kafkasource`) or
    ``Frame(df)`` (any streaming DataFrame with the aggregation's columns and
    optionally ``_error``, aggregated through Spark: a Spark ``StreamingQuery``). The
    older spellings mean the same: a dict of a topic's options, ``{"kafka": {...}}``,
    a DataFrame. All take Spark's ``trigger`` keywords.

    ``sinks`` lists where results go (:mod:`riverbed.stream.doors`): one
    ``ResultTable`` (or ``output=``: the Parquet result table every aggregation has),
    and any ``SqlTable(url)`` and ``ResultsTopic(name)`` (``sql=`` and ``topic=`` say
    the same). ``term`` (the driver's election term, see :mod:`riverbed.stream.fencing`)
    fences every write. ``from_savepoint``: (the checkpoint of the aggregation that took
    it, its name) — start from that savepoint (:mod:`riverbed.stream.savepoints`: a
    fork on a new checkpoint, a rollback on the aggregation's own).
    """
    table, extra = split_sinks(sinks, output, sql, topic)
    built = _build(
        spark, spec, source, location(checkpoint), location(table), tuple(extra), state,
        log_url, term, from_savepoint, trigger,
    )  # fmt: skip
    if isinstance(built, Pipeline):  # riverbed's own trigger loop (stream/loop.py)
        return _launch(spark, built, parse_trigger(trigger))
    return built


def _launch(spark: Any, pipeline: Pipeline, trigger: Trigger) -> Any:
    """Start the loop that runs ``pipeline`` (a thread of this driver): its query."""
    from riverbed.stream.nativeconfig import DirectConfig

    if not isinstance(pipeline.head, DirectConfig):  # a join's rows, and after them
        from riverbed.stream.joinedagg import JoinedQuery

        return JoinedQuery(spark, pipeline.head, pipeline.after, trigger)
    if pipeline.after:  # aggregations chained after a topic's
        from riverbed.stream.chained import ChainedQuery

        return ChainedQuery(spark, pipeline.head, pipeline.after, trigger)
    from riverbed.stream.loop import DirectQuery

    return DirectQuery(spark, pipeline.head, trigger)


def _build(
    spark: Any,
    spec: Aggregation,
    source: Any,
    checkpoint: str | Path,
    output: str | Path,
    extra: tuple[Any, ...],
    state: StateConfig | None,
    log_url: str | None,
    term: int | None,
    from_savepoint: tuple[str | Path, str] | None,
    trigger: dict[str, Any] | None,
    fenced_by: str | None = None,
) -> Pipeline | Any:
    """:func:`start` up to the query: the log-native path's :class:`Pipeline` (what
    riverbed's own loop runs), or the DataFrame path's query, started. ``fenced_by``:
    the checkpoint whose term fences this aggregation when not its own (the upstream
    of a chain, run by the downstream's driver: stream/chained.py)."""
    opened = as_source(source).open(
        spark, spec, str(checkpoint), log_url, lambda: load_config().log_url
    )
    options, log_url = opened.options, opened.log_url
    if opened.frame is not None and fenced_by is not None:
        raise StreamValueError(
            f"aggregation {spec.name!r} is chained before another, in its driver: it reads "
            "a riverbed topic, a Kafka topic its tasks read, or a join's rows — not a "
            "DataFrame (write its rows to a topic with ResultsTopic, and read that)"
        )
    if opened.frame is not None and not is_connect(spark):
        s3a.configure_for(spark, checkpoint)  # Spark writes its own logs there
    if state is None:
        state = default_state(checkpoint)
    # what every write at start checks (EngineConfig.fence, before there is one)
    fence = functools.partial(check_term, fenced_by or str(checkpoint), term, spec.name)
    joined = upstream = None
    if opened.joined is not None:  # a join's rows, in this driver (stream/joinedagg.py)
        from riverbed.stream import joinedagg

        if from_savepoint is not None:
            raise StreamValueError(
                f"aggregation {spec.name!r} reads a join's rows: a savepoint holds the "
                "aggregation's state and not the join's, so it cannot start from one"
            )
        source_join = opened.joined
        joined = joinedagg.open_joined(
            source_join.join, spec.name, checkpoint, state, log_url, term,
            source_join.checkpoint, source_join.output, source_join.max_records,
            fenced_by=fenced_by,
        )  # fmt: skip
    if opened.chained is not None:  # another aggregation's rows (stream/chained.py)
        from riverbed.stream import chained

        if from_savepoint is not None:
            raise StreamValueError(
                f"aggregation {spec.name!r} reads another aggregation's rows: a savepoint "
                "holds this aggregation's state and not its upstream's, so it cannot "
                "start from one"
            )

        def build_upstream(up: Aggregation, up_source: Any, cp: Any, out: Any, st: Any) -> Any:
            return _build(
                spark, up, up_source, cp, out, (), st, log_url, term, None, trigger,
                fenced_by or str(checkpoint),
            )  # fmt: skip

        upstream = chained.upstream(opened.chained, spec, checkpoint, state, build_upstream)
    if from_savepoint is not None:  # one restore batch first (savepoints.py)
        _restore(checkpoint, output, state, spec, options, from_savepoint, fence)
    # the spec against what the checkpoint ran with: refused as `stream plan` says
    spec = specrecord.layout(checkpoint, spec)  # (panes, or an older riverbed's windows)
    shape, decided = specrecord.start(checkpoint, spec, options)
    for name, metric in spec.metrics.items():  # user-defined metrics travel to the tasks
        if isinstance(metric, Custom):
            metric.check_shippable(name)
    # metrics backfilled after retention deleted events they never counted: results
    # say so per window (`<metric>_since`)
    spec = replace(spec, since=backfill.since(checkpoint, spec, decided.backfilled, options))
    if decided.backfilled:  # the backfill moves the state (to the new count too), below
        generation = rescale.current(checkpoint, spec.state_partitions)
    else:
        generation = _generation(spark, checkpoint, spec, state, fence)
    # the lookup tables' columns (read now, or the last batch's snapshots while a table
    # is away): what the spec is compiled against
    schemas = lookups.at_start(spec.lookups, str(checkpoint), log_url)
    if options is None:  # the types of the values results carry, from the DataFrame's
        from pyspark.sql.pandas.types import to_arrow_schema

        from riverbed.stream.derive import column_types
        from riverbed.stream.keys import resolved

        if joined is not None:  # (or the join's rows')
            arrow = joined.output_schema
        elif upstream is not None:  # (or the upstream aggregation's result rows)
            arrow = upstream.output_schema
        else:
            arrow = to_arrow_schema(opened.frame.schema, timezone="UTC")
        spec = resolved(spec, column_types(spec, arrow, schemas))
    config = EngineConfig(
        spec,
        state,
        str(checkpoint),
        str(output),
        log_url,
        extra,
        term=term,
        lookup_schemas=schemas,
        shape=shape,
        state_namespace=generation.namespace(spec.name),
        fenced_by=fenced_by,
    )
    for sink in extra:
        sink.start(config)
    if joined is not None:
        return _joined(config, joined)
    if upstream is not None:
        return upstream.then(config)
    if options is not None:  # riverbed's own trigger loop (stream/loop.py)
        from riverbed.stream.nativeconfig import prepare

        direct = prepare(config, options)
        if decided.backfilled:
            moved = backfill.run(spark, direct, decided, shape, generation, fence)
            direct = replace(
                direct, engine=replace(direct.engine, state_namespace=moved.namespace(spec.name))
            )
            generation = moved
        pending = backfill.pending(checkpoint, generation)
        if pending is not None:  # the first batch after a backfill writes its rows
            direct = replace(direct, engine=replace(direct.engine, backfill_rows=pending))
        return Pipeline(direct)
    frame = opened.frame
    if spec.derives:  # lookups, a where or columns that cannot be: refused now
        from pyspark.sql.pandas.types import to_arrow_schema

        compile_for(spec, input_types(to_arrow_schema(frame.schema, timezone="UTC")), schemas)
    clear_unfinished_start(spark_location(checkpoint))
    writer = (
        frame.writeStream.foreachBatch(foreach_batch(config))
        .option("checkpointLocation", s3a.to_s3a(spark_location(checkpoint)))
        .queryName(spec.name)
    )
    return start_query(writer.trigger(**(trigger or {"processingTime": "1 second"})), spec.name)


def _joined(config: EngineConfig, joined: Any) -> Pipeline:
    """An aggregation over a join's rows, in this driver (stream/joinedagg.py): its
    columns checked against the join's rows."""
    from riverbed.stream.nativeconfig import DirectConfig, check_reads

    check_reads(config, joined.output_schema, f"the rows of join {joined.join.name!r}")
    direct = DirectConfig(
        config, {"join": joined.join.name}, None, co_located=False,
        driver_records=joined.driver_records,
    )  # fmt: skip
    return Pipeline(joined, (direct,))


def read_results(output: str | Path, spec: Aggregation | None = None) -> pd.DataFrame:
    """The current result table: per (window, key), the row of the latest batch, less
    the sessions merged away (``output``: a directory, or a bucket's ``s3://bucket/prefix/output/<name>``)."""
    table = read_table(location(output))
    if table is None:
        return pd.DataFrame()
    frame = table.to_pandas()
    if frame.empty:
        return frame
    sessions = DELETED in frame.columns  # only a session window's table has tombstones
    frame = current(_utc(frame)).drop(columns=[DELETED], errors="ignore")  # all false now
    frame = frame.sort_values(["window_start", "key"]).reset_index(drop=True)
    frame.attrs["sessions"] = sessions  # (riverbed query shows their window_end)
    return frame


def read_live(
    spec: Aggregation,
    state: StateConfig,
    batch_id: int | None = None,
    checkpoint: str | Path | None = None,
) -> pd.DataFrame:
    """Results answered from the state store instead of the result table: every window
    the state still holds (open ones, and closed ones within ``keep_closed``), as of
    the end of ``batch_id`` (default: the newest committed batch), per partition.

    Reads go through durable storage into a private directory: a running query is
    never blocked, and what it has not committed is never seen.
    """
    from riverbed.state import StateProvider
    from riverbed.state.query import read_state
    from riverbed.stream.results import empty_rows
    from riverbed.stream.rows import rows_from_state

    provider = StateProvider(state)
    if checkpoint is not None:
        spec = specrecord.layout(checkpoint, spec)
    elif spec.pane_ms:  # (the open windows are those its batch's watermark left open)
        raise StreamValueError(
            f"aggregation {spec.name!r} holds a hopping window's panes: reading them as "
            "windows needs its checkpoint (read_live(..., checkpoint=...))"
        )
    version = None if batch_id is None else batch_id + 1
    namespace = spec.name  # the generation holding that version (rescale.py)
    if checkpoint is not None:
        gens = rescale.generations(checkpoint, spec.state_partitions)
        namespace = rescale.for_version(gens, version).namespace(spec.name)
    if not provider.partitions(namespace):
        raise StreamValueError(f"aggregation {spec.name!r} has no state in {state.durable} yet")
    frames = []
    records = None if checkpoint is None else open_batches(checkpoint)
    for batch in read_state(provider, namespace, version):
        values = dict(
            zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True)
        )
        batch_id = batch.column("version")[0].as_py() - 1
        record = None if records is None else records.get(batch_id)
        watermark = None if record is None else record.watermark_ms
        frames.append(rows_from_state(spec, values, batch_id, watermark))
    if not frames:
        return empty_rows(spec)
    frame = pd.concat(frames, ignore_index=True).drop(columns=[DELETED], errors="ignore")
    return frame.sort_values(["window_start", "key"]).reset_index(drop=True)


def reset(checkpoint: str | Path, output: str | Path) -> None:
    """Forget a query: its checkpoint (offsets, state) and its output."""
    for place in (checkpoint, output):
        store = checkpoint_store(place)
        store.delete_many(i.key for i in store.list())
        store.sweep_partial("", older_than=0)  # and what interrupted writes left


__all__ = [
    "START_ATTEMPTS",
    "read_live",
    "read_results",
    "reset",
    "start",
    "start_phase",
    "transient_start_failure",
]
