"""Reading a riverbed topic by event time, for :class:`TopicInput`.

A topic is ordered by offset, not by time: producers stamp records with their event
time, and late records land after newer ones. To read the records of ``[lo, hi)``
without scanning the whole topic for every chunk, the driver keeps a *time index*: per
partition, the smallest and largest timestamp of each run of :data:`SPAN` records.
A chunk reads only the runs whose ``[min, max]`` meets ``[lo, hi)`` — exact for any
amount of disorder (a run is skipped only when none of its records can be in range) —
and the Spark reader drops the records outside ``[lo, hi)`` before decoding them.

The index is built once per process and extended as the topic grows: each read first
indexes the records appended since the last one (and forgets what retention removed).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from riverbed.timerange.errors import MissingInputError, SpecError
from riverbed.timerange.spec import KafkaInput, TopicInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SPAN", "PartitionIndex", "TimeIndex", "read_kafka", "read_topic", "runs_meeting"]

SPAN = 50_000  # records per indexed run
META = ("partition", "offset", "_error")  # reader columns a time-range job does not keep


@dataclass
class PartitionIndex:
    """Runs ``[starts[i], ends[i])`` of one partition with their timestamp span."""

    span: int = field(default_factory=lambda: SPAN)  # records per run
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    mins: list[int] = field(default_factory=list)
    maxs: list[int] = field(default_factory=list)

    def add(self, start: int, timestamps_ms: np.ndarray) -> None:
        """Index records ``[start, start + len(timestamps_ms))``; the last run, if short,
        is grown first."""
        at = 0
        if self.ends and self.ends[-1] - self.starts[-1] < self.span and self.ends[-1] == start:
            take = min(len(timestamps_ms), self.span - (self.ends[-1] - self.starts[-1]))
            if take:
                part = timestamps_ms[:take]
                self.ends[-1] += take
                self.mins[-1] = min(self.mins[-1], int(part.min()))
                self.maxs[-1] = max(self.maxs[-1], int(part.max()))
            at = take
        while at < len(timestamps_ms):
            part = timestamps_ms[at : at + self.span]
            self.starts.append(start + at)
            self.ends.append(start + at + len(part))
            self.mins.append(int(part.min()))
            self.maxs.append(int(part.max()))
            at += len(part)

    def forget_before(self, first: int) -> None:
        """Drop runs retention removed (a run cut in two keeps its span: still safe)."""
        while self.starts and self.ends[0] <= first:
            for column in (self.starts, self.ends, self.mins, self.maxs):
                column.pop(0)
        if self.starts and self.starts[0] < first:
            self.starts[0] = first

    @property
    def end(self) -> int:
        return self.ends[-1] if self.ends else 0


def runs_meeting(index: PartitionIndex, lo_ms: int, hi_ms: int) -> list[tuple[int, int]]:
    """Offset ranges holding every record with a timestamp in ``[lo_ms, hi_ms)``:
    the runs whose span meets it, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for s, e, mn, mx in zip(index.starts, index.ends, index.mins, index.maxs, strict=True):
        if mx < lo_ms or mn >= hi_ms:
            continue
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class TimeIndex:
    """The time index of one topic (see the module docs)."""

    def __init__(self, url: str, topic: str) -> None:
        self.url, self.topic = url, topic
        self.partitions: dict[int, PartitionIndex] = {}
        self.schema: str | None = None  # the value fields, inferred once
        self._lock = threading.Lock()

    def refresh(self) -> None:
        import riverbed.log

        log = riverbed.log.open(self.url)
        try:
            try:
                config = log.topic(self.topic)
            except riverbed.log.TopicNotFoundError:
                raise MissingInputError(
                    f"topic '{self.topic}' does not exist in {self.url}; create it "
                    f"(riverbed topic create {self.topic}) or fix TopicInput's topic/log"
                ) from None
            for p in range(config.partitions):
                first, end = log.storage.offsets(self.topic, p)
                index = self.partitions.setdefault(p, PartitionIndex())
                index.forget_before(first)
                at = max(first, index.end)
                while at < end:
                    stop = min(end, at + SPAN)
                    columns = log.storage.read_columns(self.topic, p, at, stop)
                    if len(columns) == 0:
                        break
                    index.add(at, columns.timestamps_ms)
                    at += len(columns)
        finally:
            log.close()

    def ranges(self, lo_ms: int, hi_ms: int) -> list[tuple[int, int, int]]:
        """``(partition, start, end)`` offset ranges covering ``[lo_ms, hi_ms)``."""
        with self._lock:
            self.refresh()
            return [
                (p, s, e)
                for p, index in sorted(self.partitions.items())
                for s, e in runs_meeting(index, lo_ms, hi_ms)
            ]


_INDEXES: dict[tuple[str, str], TimeIndex] = {}
_INDEXES_LOCK = threading.Lock()


def _index(url: str, topic: str) -> TimeIndex:
    with _INDEXES_LOCK:
        return _INDEXES.setdefault((url, topic), TimeIndex(url, topic))


def _log_url(inp: TopicInput) -> str:
    if inp.log:
        return inp.log
    raise SpecError(  # spec.placed() settles it when a spec is loaded
        f"TopicInput({inp.topic!r}) names no log; give log=… or load the spec with "
        "riverbed.timerange.load_spec (which takes RIVERBED_LOG)"
    )


def read_topic(
    spark: SparkSession, job_name: str, time: str, inp: TopicInput, lo_us: int, hi_us: int
) -> DataFrame:
    """The topic's records with event time in ``[lo_us, hi_us)`` (when ``time`` is the
    record timestamp; with another time column, every record: the caller filters)."""
    from pyspark.sql import functions as F

    from riverbed.spark.source import META_DDL, register, value_schema

    url = _log_url(inp)
    index = _index(url, inp.topic)
    lo_ms, hi_ms = lo_us // 1000, -(-hi_us // 1000)  # every ms that holds a µs in range
    by_time = time == "timestamp"
    ranges = index.ranges(lo_ms, hi_ms) if by_time else index.ranges(-(2**62), 2**62)
    options = {"topic": inp.topic, "log": url, "ranges": json.dumps(ranges)}
    if by_time:
        options |= {"fromMs": str(lo_ms), "toMs": str(hi_ms)}
    if inp.schema:
        values = inp.schema
    else:
        if index.schema is None:
            inferred = value_schema({"topic": inp.topic, "log": url})
            index.schema = (
                inferred
                if isinstance(inferred, str)
                else ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in inferred.fields)
            )
        values = index.schema
    register(spark)
    try:
        df = spark.read.format("riverbed").options(**options).schema(f"{values}, {META_DDL}").load()
    except Exception as exc:  # a DDL Spark cannot parse
        if "PARSE_SYNTAX_ERROR" in str(exc) or "ParseException" in type(exc).__name__:
            raise SpecError(
                f"time-range job '{job_name}': TopicInput schema {values!r} is not a Spark DDL "
                "string; write it like 'sensor_id string, value double'"
            ) from None
        raise
    bad = f"time-range job '{job_name}': a record of topic '{inp.topic}' does not fit its schema"
    checked = df.withColumn(
        "_error",
        F.when(
            F.col("_error").isNotNull(),
            F.raise_error(
                F.concat(
                    F.lit(bad + " (partition "),
                    F.col("partition").cast("string"),
                    F.lit(", offset "),
                    F.col("offset").cast("string"),
                    F.lit("): "),
                    F.col("_error"),
                    F.lit("; fix TopicInput(schema=...) or the producer"),
                )
            ),
        ),
    )
    return checked.where(F.col("_error").isNull()).drop(*META)


def read_kafka(spark: SparkSession, time: str, inp: KafkaInput, lo: int, hi: int) -> DataFrame:
    """The records of a Kafka topic that can hold ``[lo, hi)`` (microseconds): by
    Kafka's own time index when ``time`` is the record timestamp (see
    :class:`KafkaInput`), else the whole topic — as the value fields, ``key`` and
    ``timestamp``."""
    from riverbed.spark import kafkaread as kafka

    try:
        if time == "timestamp":
            starts = kafka.offsets_for_time(inp.bootstrap, inp.topic, lo // 1000)
            late = inp.lateness_ms
            stops = (
                kafka.ends(inp.bootstrap, inp.topic)
                if late is None
                else kafka.offsets_for_time(inp.bootstrap, inp.topic, hi // 1000 + late)
            )
        else:
            stops = kafka.ends(inp.bootstrap, inp.topic)
            starts = {p: -2 for p in stops}  # -2: Spark's "earliest" in an offsets map
    except kafka.KafkaReadError as exc:
        raise MissingInputError(f"KafkaInput: {exc}") from None
    df = kafka.read_range(spark, inp.bootstrap, inp.topic, starts, stops, inp.options)
    columns: DataFrame = kafka.json_columns(df, inp.schema)
    return columns
