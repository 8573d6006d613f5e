"""The stream's front doors: where an aggregation's events come from (a :class:`Source`)
and where its results go (:class:`Sink`\\ s).

Sources::

    Topic("clicks", log="s3://bucket/log")        # a riverbed topic: the log-native path
    Kafka(bootstrap="broker:9092", topic="clicks", schema="user string, ts timestamp")
    Frame(spark.readStream.format(...).load())    # any streaming DataFrame, through Spark
    Joined(Join(...))                             # a join's rows, joined in the same driver
    Chained(counts, Topic("bids"))                # another aggregation's final rows, likewise

Sinks::

    ResultTable("out/")                 # the Parquet result table (every aggregation has one)
    SqlTable("postgresql://…/db")       # upserted per batch
    Delta("s3://lake/clicks")           # a Delta table: one upserting commit per batch
    Iceberg("sqlite:///catalog.db", "results.clicks")   # an Iceberg table, the same
    ResultsTopic("click-counts")        # appended to a riverbed topic of the log
    ResultsTopic("kafka://broker:9092/click-counts")   # or a Kafka topic, exactly once

``riverbed.stream.start(spark, spec, source, checkpoint=…, sinks=[…])`` takes these; the
older spellings keep working and mean the same (:func:`as_source`: a dict of topic
options, ``{"kafka": {...}}``, a DataFrame; ``output=``, ``sql=``, ``topic=``), and so
do spec files. A new source or sink is one class here with the method its protocol
names — the engine asks nothing else of it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from riverbed.config import inherited
from riverbed.locations import shown, shown_repr
from riverbed.stream.errors import StreamValueError

if TYPE_CHECKING:
    import pandas as pd

    from riverbed.stream.aggregation import Aggregation

__all__ = [
    "Chained",
    "Delta",
    "Frame",
    "Iceberg",
    "Joined",
    "Kafka",
    "Opened",
    "ResultTable",
    "ResultsTopic",
    "Sink",
    "Source",
    "SqlTable",
    "Topic",
    "as_source",
    "split_sinks",
    "table_sink",
]


# -- sources -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """A source as the engine runs it: either the options of the log-native path
    (riverbed's own trigger loop; its state tasks read the partitions themselves) or a
    streaming DataFrame (Spark's ``foreachBatch``), and the log its side topics go to."""

    options: dict[str, str] | None = None
    frame: Any = None
    log_url: str | None = None
    joined: Joined | None = None  # a join's rows (stream/joinedagg.py)
    chained: Chained | None = None  # another aggregation's final rows (stream/chained.py)


@runtime_checkable
class Source(Protocol):
    """Where an aggregation's events come from."""

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        """Check the source against the checkpoint and say how the engine reads it
        (``log_url``: where side topics go, if given; ``default_log()``: the configured
        log, asked only when a source needs one and none was given)."""
        ...


@dataclass(frozen=True)
class Topic:
    """A riverbed topic (``log``: its log's URL, the configured one when ``None``).
    ``options`` are the topic reader's: ``schema``, ``maxRecordsPerBatch``,
    ``startingOffsets``, ``co_locate`` (docs/stream.md)."""

    name: str
    log: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        options = {str(k): str(v) for k, v in self.options.items()}
        options["topic"] = self.name
        log = self.log or log_url or default_log()
        options["log"] = log
        return Opened(options=options, log_url=log_url or log)


@dataclass(frozen=True)
class Kafka:
    """A Kafka topic (docs/kafka.md): its keyword arguments are a spec file's
    ``source = {"kafka": {...}}``. Read by the state tasks themselves when it can be
    (co-located partitions), else by Spark's own Kafka source."""

    options: Mapping[str, Any]

    def __init__(self, **options: Any) -> None:
        object.__setattr__(self, "options", dict(options))

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        from riverbed.stream import kafkasource as kafka
        from riverbed.stream.sparklog import read_ends

        chosen = kafka.parse({"kafka": self.options})
        # where its next batch starts (in a bucket Spark's own failOnDataLoss speaks)
        ends, spark_driven = read_ends(checkpoint)
        kafka.check(chosen, read=ends)
        if kafka.log_native(chosen) and not spark_driven:
            # the state tasks read their Kafka partitions themselves (log-native path)
            log = log_url or default_log()  # side topics: riverbed's log
            return Opened(options=kafka.log_options(chosen), log_url=log)
        frame = kafka.frame(spark, chosen, required=[*spec.key_parts, spec.time])
        return Opened(frame=frame, log_url=log_url)


@dataclass(frozen=True)
class Frame:
    """Any streaming DataFrame with the aggregation's columns (and optionally
    ``_error``: a reason the row is malformed), aggregated through Spark."""

    df: Any

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        return Opened(frame=self.df, log_url=log_url)


@dataclass(frozen=True)
class Joined:
    """The rows of a :class:`~riverbed.stream.joins.Join`, aggregated as the join emits
    them, in the same driver (:mod:`riverbed.stream.joinedagg`): the join's batches and
    the aggregation's run in turn, each exactly once. ``checkpoint`` and ``output``: the
    join's (default: ``join`` and ``join-rows`` inside the aggregation's checkpoint);
    ``max_records``: each side's records per join batch at most."""

    join: Any
    checkpoint: str | Path | None = None
    output: str | Path | None = None
    max_records: int | None = None

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        sides = getattr(self.join, "sides", ())
        if log_url is None and any(side_log is None for _, side_log, _ in sides):
            log_url = default_log()  # the sides' log, and the side topics'
        return Opened(log_url=log_url, joined=self)


@dataclass(frozen=True)
class Chained:
    """The final rows of another aggregation (``aggregation``, with ``output="final"``,
    reading ``source``: a topic's options, ``Topic``, ``Kafka``, ``Joined`` or another
    ``Chained``) as this one's events, that aggregation run in the same driver
    (:mod:`riverbed.stream.chained`): its batch, then this one's over its rows, each
    exactly once. ``checkpoint`` and ``output``: the upstream's checkpoint and result
    table (default: ``upstream`` and ``upstream-results`` inside this one's checkpoint)."""

    aggregation: Any
    source: Any
    checkpoint: str | Path | None = None
    output: str | Path | None = None

    def open(
        self,
        spark: Any,
        spec: Aggregation,
        checkpoint: str,
        log_url: str | None,
        default_log: Callable[[], str],
    ) -> Opened:
        return Opened(log_url=log_url, chained=self)


def _is_dataframe(source: Any) -> bool:
    from pyspark.sql import DataFrame

    return isinstance(source, DataFrame)


def as_source(source: Any) -> Source:
    """A :class:`Source` from what ``start`` was given: a Source, a dict of a riverbed
    topic's options, ``{"kafka": {...}}``, or a streaming DataFrame."""
    # first: a Spark Connect DataFrame answers any attribute with a column, so it passes
    # for a Source (and only a pyspark object can be a DataFrame: no import otherwise)
    if type(source).__module__.startswith("pyspark.") and _is_dataframe(source):
        if source.isStreaming:
            return Frame(source)
        raise StreamValueError(
            "a DataFrame source must be a streaming one (spark.readStream…), not a batch DataFrame"
        )
    if isinstance(source, Source) and not isinstance(source, Mapping):
        return source
    if isinstance(source, Mapping):
        from riverbed.stream import kafkasource as kafka

        if kafka.is_kafka(source):
            raw = source["kafka"]
            if not isinstance(raw, Mapping):
                kafka.parse(source)  # names what a Kafka source takes
            return Kafka(**{str(k): v for k, v in raw.items()})
        options = {str(k): v for k, v in source.items()}
        if "topic" not in options:
            raise StreamValueError(
                f"a topic source names its topic: {{'topic': 'clicks', ...}}, not {dict(source)!r}"
            )
        name = str(options.pop("topic"))
        log = options.pop("log", None)
        return Topic(name, None if log is None else str(log), options)
    if getattr(source, "isStreaming", False):
        return Frame(source)
    raise StreamValueError(
        f"cannot read events from {type(source).__name__}: give a source — Topic('clicks'), "
        "Kafka(bootstrap=..., topic=..., schema=...), Frame(a streaming DataFrame), "
        "Joined(a Join) or Chained(an Aggregation, its source)"
    )


# -- sinks -------------------------------------------------------------------------------


class Running(Protocol):
    """What a sink is told of the running aggregation (an ``EngineConfig`` is one)."""

    @property
    def spec(self) -> Aggregation: ...

    @property
    def log_url(self) -> str | None: ...


@runtime_checkable
class Sink(Protocol):
    """Where an aggregation's results go, besides its result table. Every write is
    idempotent per batch id (a batch re-run after a crash writes it again) and is made
    only by the driver holding the fence (the engine checks it first)."""

    def start(self, config: Running) -> None:
        """Called once when the query starts: check what can be checked now."""
        ...

    def write(self, config: Running, batch_id: int, rows: pd.DataFrame) -> None:
        """Write one batch's result rows."""
        ...


@dataclass(frozen=True)
class ResultTable:
    """The Parquet result table (docs/stream.md, "Results"): every aggregation writes
    one; naming it among the sinks is the same as ``output=``."""

    location: str | Path


@dataclass(frozen=True)
class SqlTable:
    """A SQLite or PostgreSQL database (``sqlite:///path.db``, ``postgresql://…``):
    each batch's rows upserted into the table named like the aggregation."""

    url: str

    def __repr__(self) -> str:
        return shown_repr(self, "url")

    def __post_init__(self) -> None:
        from riverbed.stream.sinks import SqlSink

        SqlSink(self.url)  # an unsupported URL is named when written, not at a batch

    def start(self, config: Running) -> None:
        return None

    def write(self, config: Running, batch_id: int, rows: pd.DataFrame) -> None:
        from riverbed.stream.sinks import SqlSink

        SqlSink(self.url).upsert(config.spec.name, rows)


@dataclass(frozen=True)
class ResultsTopic:
    """A topic results are appended to: a riverbed topic of the aggregation's log, or
    ``kafka://<bootstrap>/<topic>`` (Kafka's transactional producer: exactly once)."""

    name: str

    @property
    def kafka(self) -> bool:
        from riverbed.stream import kafkasource as kafka

        return kafka.is_label(self.name)

    def start(self, config: Running) -> None:
        if self.kafka:
            # at start, not at the first batch: its brokers are checked, the previous
            # driver's producer fenced, and a retention that deletes results named now
            _kafka_sink(self.name, config)

    def write(self, config: Running, batch_id: int, rows: pd.DataFrame) -> None:
        from riverbed.stream.sinks import TopicSink

        if self.kafka:
            _kafka_sink(self.name, config).write(batch_id, rows)
            return
        if config.log_url is None:
            raise StreamValueError("a results topic needs a log: pass log_url")
        sink = TopicSink(config.log_url, self.name, config.spec.state_partitions)
        try:
            sink.write(batch_id, rows)
        finally:
            sink.close()


def table_failpoint(at: str, batch_id: int) -> None:
    """``RIVERBED_FAULT=table_commit:<before|after>:<batch>`` (tests): SIGKILL this
    process right before, or right after, batch ``batch``'s commit to a lakehouse table."""
    if (inherited("RIVERBED_FAULT") or "") == f"table_commit:{at}:{batch_id}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Delta:
    """A Delta Lake table (a path, ``file://`` or ``s3://``): each batch one commit that
    upserts its rows by (window, key) and carries the batch id, so readers see one row
    per window and key and a re-run batch commits nothing (:mod:`riverbed.stream.
    lakehouse`)."""

    location: str | Path

    def start(self, config: Running) -> None:
        from riverbed.stream.lakehouse import DeltaSink

        DeltaSink(self.location).committed(config.spec.name)  # readable, or named now

    def write(self, config: Running, batch_id: int, rows: pd.DataFrame) -> None:
        from riverbed.stream.lakehouse import DeltaSink
        from riverbed.stream.results import output_arrow_schema
        from riverbed.tables import upkeep

        if rows.empty:
            return
        schema = output_arrow_schema(config.spec)
        sink = DeltaSink(self.location)
        table_failpoint("before", batch_id)
        committed = sink.write(config.spec.name, batch_id, rows, schema)
        table_failpoint("after", batch_id)
        if committed and batch_id % 100 == 99:
            # between this batch's commit and the next, in the driver's one writer: a
            # compaction beside a batch's MERGE would make one of them lose the
            # table's concurrency check
            upkeep(f"Delta table {shown(str(self.location))}: compaction", sink.compact)


@dataclass(frozen=True)
class Iceberg:
    """An Apache Iceberg table ``table`` (``namespace.table``) of a SQL catalog
    (``sqlite:///catalog.db`` or ``postgresql://…``), its files in ``warehouse`` (beside
    a SQLite catalog when not given): each batch one catalog commit that upserts its
    rows by (window, key) and records the batch id (:mod:`riverbed.stream.lakehouse`)."""

    catalog: str
    table: str
    warehouse: str | Path | None = None

    def __repr__(self) -> str:
        return shown_repr(self, "catalog")

    def _sink(self) -> Any:
        from riverbed.stream.lakehouse import IcebergSink

        return IcebergSink(self.catalog, self.table, self.warehouse)

    def start(self, config: Running) -> None:
        self._sink().committed(config.spec.name)  # reachable, or named now

    def write(self, config: Running, batch_id: int, rows: pd.DataFrame) -> None:
        from riverbed.stream.results import output_arrow_schema
        from riverbed.tables import upkeep

        if rows.empty:
            return
        sink = self._sink()
        table_failpoint("before", batch_id)
        committed = sink.write(config.spec.name, batch_id, rows, output_arrow_schema(config.spec))
        table_failpoint("after", batch_id)
        if committed and batch_id % 100 == 99:  # as Delta's: by the one writer, after it
            upkeep(f"Iceberg table {self.table}: compaction", sink.compact)


def table_sink(text: str) -> Sink:
    """``--table``'s value as a sink (:func:`riverbed.tables.parse_table`)."""
    from riverbed.tables import TableNameError, parse_table

    try:
        name = parse_table(text)
    except TableNameError as exc:
        raise StreamValueError(str(exc)) from None
    if name.kind == "delta":
        return Delta(name.where)
    return Iceberg(name.where, name.table, name.warehouse)


_KAFKA_SINKS: dict[tuple[str, str], Any] = {}


def _kafka_sink(label: str, config: Running) -> Any:
    """The driver's transactional producer for a Kafka results topic: one per process
    (starting one fences the previous driver's, and costs a round trip)."""
    from riverbed.stream.sinks import KafkaSink

    key = (label, config.spec.name)
    sink = _KAFKA_SINKS.get(key)
    if sink is None:
        sink = KafkaSink(label, config.spec.name, config.spec.state_partitions)
        _KAFKA_SINKS[key] = sink
    return sink


def split_sinks(
    sinks: Sequence[Any],
    output: str | Path | None,
    sql: str | None = None,
    topic: str | None = None,
) -> tuple[str | Path, tuple[Sink, ...]]:
    """The result table's location and the other sinks, from ``start``'s ``sinks``
    and its older keywords (``output``, ``sql``, ``topic``)."""
    tables = [s.location for s in sinks if isinstance(s, ResultTable)]
    if output is not None:
        tables.append(output)
    if len(tables) != 1:
        raise StreamValueError(
            "an aggregation writes one result table: give output=… or one "
            f"ResultTable(…) among the sinks (got {len(tables)})"
        )
    others: list[Sink] = []
    for sink in sinks:
        if isinstance(sink, ResultTable):
            continue
        if not isinstance(sink, Sink):
            raise StreamValueError(
                f"{sink!r} is not a sink: give ResultTable(…), SqlTable(url), "
                "ResultsTopic(name), Delta(location) or Iceberg(catalog, table)"
            )
        others.append(sink)
    if sql is not None:
        others.append(SqlTable(sql))
    if topic is not None:
        others.append(ResultsTopic(topic))
    return tables[0], tuple(others)
