"""``spark.readStream.format("riverbed")``: riverbed topics as a Spark source.

Options: ``topic`` (required), ``log`` (URL, default ``RIVERBED_LOG`` /
``RIVERBED_HOME/log``), ``schema`` (DDL of the value fields, e.g.
``"user_id long, flag string"``; default: inferred from the first records),
``startingOffsets`` (``earliest`` | ``latest``), ``maxRecordsPerBatch``. Batch reads
also take ``ranges`` (JSON ``[[partition, start, end], ...]``: read just those offsets)
and ``fromMs`` / ``toMs`` (keep records whose timestamp is in ``[fromMs, toMs)``; the
others are dropped before their values are decoded).

Columns: the value fields, then ``key`` (string), ``timestamp`` (event time),
``partition``, ``offset``, and ``_error`` — null for good records; for a record whose
value cannot be decoded or does not fit the schema, the reason (its fields are null),
so a query can route it to a dead-letter topic instead of failing.

Offsets are ``{"<partition>": next offset}``; partitions added to the topic appear in
the next batch. Readers are cloudpickled to executors: they keep only plain
options and open the log inside :meth:`read`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from riverbed.log.records import Columns
from riverbed.spark import SourceOptionError
from riverbed.spark.offsets import batch_ends, begin_offsets, capped, source_limits
from riverbed.spark.values import FAST_TYPES, json_values, typed_values, values_one_by_one
from riverbed.storage import storage_environment

META_FIELDS = [
    StructField("key", StringType()),
    StructField("timestamp", TimestampType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("_error", StringType()),
]
META_NAMES = {f.name for f in META_FIELDS}


def _log_url(options: dict[str, str]) -> str:
    if options.get("log"):
        return options["log"]
    from riverbed.config import load_config

    return load_config().log_url


def open_log(options: dict[str, str]) -> Any:
    """The source's log; for a Kafka cluster (``kafka://``), with the source's
    ``kafka.*`` options as the Kafka client's settings (as Spark's Kafka source takes
    them)."""
    import riverbed.log

    url = _log_url(options)
    if url.startswith("kafka://"):
        from riverbed.spark.kafkaread import client_settings

        return riverbed.log.open(url, kafka=client_settings(options))
    return riverbed.log.open(url)


def reach() -> dict[str, str]:
    """What a Python worker needs to reach the log as the driver does
    (:func:`riverbed.log.reach_environment`; secrets: never in options, which plans
    show)."""
    from riverbed.log import reach_environment

    return reach_environment()


def _infer_type(value: Any) -> DataType:
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    return StringType()


META_DDL = "key string, timestamp timestamp, partition int, offset bigint, _error string"


def _ddl_names(ddl: str) -> list[str]:
    """Top-level field names of a DDL string ("a long, b struct<x: int>" -> [a, b])."""
    names, depth, current = [], 0, ""
    for ch in ddl + ",":
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            if current.strip():
                names.append(current.strip().split()[0].strip("`"))
            current = ""
        else:
            current += ch
    return names


def value_schema(options: dict[str, str]) -> StructType | str:
    """The value fields: the ``schema`` option (a DDL string, parsed by Spark), else a
    typed topic's own schema, else inferred from up to 100 records."""
    if options.get("schema"):
        clash = [n for n in _ddl_names(options["schema"]) if n in META_NAMES]
        if clash:
            raise SourceOptionError(f"value field(s) {clash} clash with the source's own columns")
        return options["schema"]
    log = open_log(options)
    topic = options["topic"]
    typed: str | None = log.topic(topic).schema
    if typed is not None:
        log.close()
        clash = [n for n in _ddl_names(typed) if n in META_NAMES]
        if clash:
            raise SourceOptionError(
                f"topic '{topic}' has field(s) {clash}, which clash with the source's own "
                f"columns ({', '.join(sorted(META_NAMES))}); give the source a schema "
                "option without them"
            )
        return typed
    fields: dict[str, DataType] = {}
    for p in range(log.topic(topic).partitions):
        first = log.storage.offsets(topic, p)[0]  # malformed values tell nothing of fields
        for record in log.read(topic, p, first, 100, malformed="skip"):
            if isinstance(record.value, dict):
                for name, v in record.value.items():
                    if name not in fields and v is not None and name not in META_NAMES:
                        fields[name] = _infer_type(v)
    log.close()
    if not fields:
        return StructType([StructField("value", StringType())])
    return StructType([StructField(n, t) for n, t in fields.items()])


def reader_schema(options: dict[str, str]) -> StructType:
    """What a topic's reader yields: its value fields (:func:`value_schema`; options'
    keys in lower case) and the source's metadata columns. On the driver, with a Spark
    session: a DDL string is parsed here, as executors cannot parse DDL (a list of
    primitive fields without Spark, :mod:`riverbed.spark.ddl`; any other by Spark,
    started now if it was deferred)."""
    from riverbed.spark.ddl import simple_schema
    from riverbed.spark.lazy import start_deferred

    values = value_schema(options)
    parsed: DataType | None = values if isinstance(values, StructType) else None
    if isinstance(values, str):
        parsed = simple_schema(values)
        if parsed is None:
            start_deferred()
            parsed = StructType.fromDDL(values)
    if not isinstance(parsed, StructType):
        raise SourceOptionError(f"schema {options.get('schema')!r} must be a list of fields")
    return StructType(list(parsed.fields) + META_FIELDS)


@dataclass(frozen=True)
class LogSlice(InputPartition):
    """Records [start, end) of one log partition."""

    partition: int
    start: int
    end: int


CHUNK = 50_000  # records per Arrow batch


def read_slice(
    options: dict[str, str], schema: StructType, part: LogSlice, log: Any = None
) -> Iterator[Any]:
    """Yield Arrow record batches of ``schema`` for one slice (runs on executors).
    ``log``: an open log to read through (a task reading many slices opens it once);
    by default the options' log is opened and closed here."""
    own = log is None
    if own:
        log = open_log(options)
    lo, hi = options.get("fromms"), options.get("toms")
    try:
        topic = options["topic"]
        serde = log.serde(log.topic(topic).serde)
        for start in range(part.start, part.end, CHUNK):
            columns = log.storage.read_columns(
                topic, part.partition, start, min(start + CHUNK, part.end)
            )
            if lo is not None or hi is not None:
                columns = _in_time(columns, lo, hi)
            if len(columns):
                yield to_arrow(columns, part.partition, schema, serde)
    finally:
        if own:
            log.close()


def _in_time(columns: Columns, lo: str | None, hi: str | None) -> Columns:
    ts = columns.timestamps_ms
    keep = np.ones(len(ts), dtype=bool)
    if lo is not None:
        keep &= ts >= int(lo)
    if hi is not None:
        keep &= ts < int(hi)
    if keep.all():
        return columns
    index = pa.array(np.flatnonzero(keep))
    return Columns(
        columns.start,
        ts[keep],
        columns.keys.take(index),
        columns.values.take(index),
        picked=columns.offsets[keep],
    )


def to_arrow(columns: Columns, partition: int, schema: StructType, serde: Any) -> pa.RecordBatch:
    """Decode stored records into an Arrow batch of ``schema`` (value fields + metadata);
    the rules of what is malformed are :mod:`riverbed.spark.values`'."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    value_fields = [f for f in schema.fields if f.name not in META_NAMES]
    values = None
    if pa.types.is_struct(columns.values.type):  # a typed topic: its columns, as stored
        values = typed_values(columns.values, value_fields, arrow_schema)
    elif serde.name == "json" and all(isinstance(f.dataType, FAST_TYPES) for f in value_fields):
        values = json_values(columns.values, value_fields, arrow_schema)
    if values is None:  # record by record (a typed topic's values come as dicts)
        values = values_one_by_one(
            columns.values.to_pylist(),
            columns.keys.to_pylist(),
            value_fields,
            arrow_schema,
            serde,
        )
    n = len(columns)
    arrays = dict(values)
    try:
        arrays["key"] = columns.keys.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: decode leniently
        arrays["key"] = pa.array(
            [
                k.decode("utf-8", "replace") if k is not None else None
                for k in columns.keys.to_pylist()
            ],
            pa.string(),
        )
    ts_us = columns.timestamps_ms * 1000
    arrays["timestamp"] = pa.array(ts_us).cast(arrow_schema.field("timestamp").type)
    arrays["partition"] = pa.array(np.full(n, partition, dtype=np.int32))
    arrays["offset"] = pa.array(columns.offsets)
    if "_error" not in arrays:
        arrays["_error"] = pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays([arrays[n] for n in arrow_schema.names], schema=arrow_schema)


class RiverbedDataSource(DataSource):
    """Register with ``spark.dataSource.register(RiverbedDataSource)``
    (:func:`riverbed.stream.register` does it)."""

    @classmethod
    def name(cls) -> str:
        return "riverbed"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        if not options.get("topic"):
            raise SourceOptionError('the riverbed source needs .option("topic", NAME)')
        # Spark passes options through a case-insensitive map: keys may arrive lowercased.
        self.options: dict[str, str] = {k.lower(): v for k, v in options.items()}

    def schema(self) -> StructType | str:
        values = value_schema(self.options)
        if isinstance(values, str):
            return f"{values}, {META_DDL}"  # Spark's JVM parses DDL; workers cannot
        return StructType(values.fields + META_FIELDS)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.options, schema)


class BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[LogSlice]:
        if self.options.get("ranges"):
            ranges = self.options["ranges"]
            try:
                given = [LogSlice(int(p), int(s), int(e)) for p, s, e in json.loads(ranges)]
            except (ValueError, TypeError) as exc:
                raise SourceOptionError(
                    f"ranges must be JSON [[partition, start, end], ...], not {ranges!r}"
                ) from exc
            return [s for s in given if s.end > s.start] or [LogSlice(0, 0, 0)]
        log = open_log(self.options)
        topic = self.options["topic"]
        slices = [
            LogSlice(p, *log.storage.offsets(topic, p)) for p in range(log.topic(topic).partitions)
        ]
        log.close()
        return [s for s in slices if s.end > s.start] or [LogSlice(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LogSlice)
        return read_slice(self.options, self.schema, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._target: dict[str, int] | None = None
        self.max_records, self.starting = source_limits(options)

    def _ends(self) -> dict[str, tuple[int, int]]:
        log = open_log(self.options)
        try:
            return {str(o.partition): (o.start, o.end) for o in log.offsets(self.options["topic"])}
        finally:
            log.close()

    def initialOffset(self) -> dict[str, int]:
        return begin_offsets(self._ends(), None, self.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: se[1] for p, se in self._ends().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self._ends()
        begin = begin_offsets(ends, start, self.starting)
        # The limit classes Spark passes may come from pyspark.zip, not our import: test by
        # shape, not isinstance.
        max_rows = getattr(limit, "max_rows", None)
        if self._target is not None and self.max_records and max_rows is None:
            # Trigger.AvailableNow: Spark passes ReadAllAvailable, but like Kafka's
            # maxOffsetsPerTrigger the bound still splits the backlog into batches.
            max_rows = self.max_records
        return batch_ends(begin, capped(ends, self._target), max_rows and int(max_rows))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        slices = [LogSlice(int(p), int(start.get(p, 0)), int(e)) for p, e in end.items()]
        return [s for s in slices if s.end > s.start]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LogSlice)
        return read_slice(self.options, self.schema, partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # offsets live in Spark's checkpoint; the log keeps data by retention

    def stop(self) -> None:
        pass


def register(spark: Any) -> None:
    """Make ``format("riverbed")`` available on this session. The Python workers that
    plan and read it get this process's way to a log in a bucket (:func:`reach`): Spark
    hands a data source's workers the context's environment as it is at registration,
    and they may have started before these were set. Over Spark Connect there is no
    context to hand them: the workers run on the server, with its environment (set the
    log's and bucket's settings where it runs, as on a cluster's executors)."""
    from riverbed.spark import is_connect

    if is_connect(spark):
        spark.dataSource.register(RiverbedDataSource)
        return
    environment = spark.sparkContext.environment
    now = reach()
    for name in [n for n in environment if n not in now and _reaching(n)]:
        del environment[name]  # unset since the last registration
    environment.update(now)
    spark.dataSource.register(RiverbedDataSource)


def _reaching(name: str) -> bool:
    """Whether ``name`` is one of the variables :func:`reach` hands on."""
    return name in ("RIVERBED_CONTROL", "RIVERBED_LOG_TOKEN") or bool(
        storage_environment({name: ""})
    )


__all__ = ["LogSlice", "RiverbedDataSource", "register"]
