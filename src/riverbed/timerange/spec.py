"""Time-range job specs: a Python file holding ``job = TimeRangeJob(...)``.

::

    # jobs/sensor_metrics.py
    from riverbed.jobs.timerange import Cumulative, ParquetInput, Rolling, Rows, TimeRangeJob

    job = TimeRangeJob(
        input=ParquetInput("data/readings", partition="hour"),
        key="sensor_id",
        time="ts",
        metrics=[
            Rolling("30min", "value", ["mean", "max"]),
            Rows(10, "value", ["mean"]),
            Cumulative("value", ["sum", "count"]),
        ],
        output="out/sensor_metrics",
        chunk="1h",
    )

Every output row is one input row with its metrics, defined over the rows of the same
key (rows whose time is before the run's origin never count):

* ``Rolling(W)``: rows with time in ``(t - W, t]`` — pandas' ``rolling(W, on=time)``;
  rows at the same instant see each other (SQL's RANGE frame). ``min_periods`` (default 1)
  non-null values are needed, else null.
* ``Rows(N)``: the row and the N-1 before it, in the order (time, then every other input
  column) — pandas' ``rolling(N)`` on that order; ``min_periods`` defaults to N.
* ``Cumulative``: every row up to and including time ``t`` since the origin
  (pandas' ``expanding()``).
* ``Custom(fn, lookback=W)``: your own ``fn(DataFrame) -> DataFrame`` that adds columns
  and needs at most ``W`` of history before a row.
* ``Tumbling(T)``: one output row per key and window ``[k·T, (k+1)·T)``, in a second
  dataset (``windows/``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from riverbed import locations, windows
from riverbed.durations import duration_ms
from riverbed.specfiles import NAME, code_version, git_sha, import_file
from riverbed.timerange.errors import SpecError

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "AGGREGATES",
    "Cumulative",
    "Custom",
    "FunctionInput",
    "KafkaInput",
    "LoadedSpec",
    "ParquetInput",
    "Rolling",
    "Rows",
    "TimeRangeSpec",
    "TopicInput",
    "Tumbling",
    "load_spec",
]

Duration = str | int | timedelta
AGGREGATES = ("mean", "sum", "count", "min", "max", "stddev")
CUMULATIVE_AGGREGATES = ("mean", "sum", "count", "min", "max")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _us(value: Duration, what: str) -> int:
    try:
        ms = duration_ms(value)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{what}: {exc}") from None
    if ms <= 0:
        raise SpecError(f"{what}: must be longer than 0, not {value!r}")
    return ms * 1000


def label(us: int) -> str:
    """A duration as a short column-name label: 1800000000 → '30m'."""
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000)):
        if us % size == 0:
            return f"{us // size}{unit}"
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000}s"
    return f"{us // 1000}ms"


def window_dataset(size: str) -> str:
    """The dataset of the tumbling aggregates of one window size (its :func:`label`):
    ``windows_30m``."""
    return f"windows_{size}"


def _aggs(aggs: str | Sequence[str], allowed: Sequence[str], what: str) -> tuple[str, ...]:
    out = (aggs,) if isinstance(aggs, str) else tuple(aggs)
    bad = [a for a in out if a not in allowed]
    if not out or bad:
        raise SpecError(
            f"{what}: unknown aggregate {', '.join(map(repr, bad)) or '(none given)'}; "
            f"choose from {', '.join(allowed)}"
        )
    return out


def _column(name: str, what: str) -> str:
    if not isinstance(name, str) or not _COLUMN.match(name):
        raise SpecError(f"{what}: {name!r} is not a column name")
    return name


@dataclass(frozen=True)
class Rolling:
    """Aggregates of ``column`` over the last ``window`` of time, per key."""

    window: Duration
    column: str
    aggs: str | Sequence[str] = ("mean",)
    min_periods: int = 1

    def __post_init__(self) -> None:
        what = f"Rolling({self.window!r}, {self.column!r})"
        object.__setattr__(self, "aggs", _aggs(self.aggs, AGGREGATES, what))
        _column(self.column, what)
        _us(self.window, what)
        if not isinstance(self.min_periods, int) or self.min_periods < 0:
            raise SpecError(f"{what}: min_periods must be a whole number ≥ 0")

    @property
    def window_us(self) -> int:
        return _us(self.window, "Rolling")

    def names(self) -> list[tuple[str, str]]:
        """(aggregate, output column) pairs."""
        return [(a, f"{self.column}_{a}_{label(self.window_us)}") for a in self.aggs]


@dataclass(frozen=True)
class Rows:
    """Aggregates of ``column`` over the row and the ``n - 1`` rows before it, per key."""

    n: int
    column: str
    aggs: str | Sequence[str] = ("mean",)
    min_periods: int | None = None  # pandas: the window's size

    def __post_init__(self) -> None:
        what = f"Rows({self.n!r}, {self.column!r})"
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise SpecError(f"{what}: n must be a whole number ≥ 1")
        object.__setattr__(self, "aggs", _aggs(self.aggs, AGGREGATES, what))
        _column(self.column, what)
        mp = self.n if self.min_periods is None else self.min_periods
        if not isinstance(mp, int) or mp < 0 or mp > self.n:
            raise SpecError(f"{what}: min_periods must be a whole number between 0 and n")
        object.__setattr__(self, "min_periods", mp)

    def names(self) -> list[tuple[str, str]]:
        return [(a, f"{self.column}_{a}_{self.n}rows") for a in self.aggs]


@dataclass(frozen=True)
class Cumulative:
    """Running aggregates of ``column`` per key, since the run's origin."""

    column: str
    aggs: str | Sequence[str] = ("sum",)

    def __post_init__(self) -> None:
        what = f"Cumulative({self.column!r})"
        object.__setattr__(self, "aggs", _aggs(self.aggs, CUMULATIVE_AGGREGATES, what))
        _column(self.column, what)

    def names(self) -> list[tuple[str, str]]:
        return [(a, f"{self.column}_cum_{a}") for a in self.aggs]


@dataclass(frozen=True)
class Custom:
    """Your own Spark function ``fn(df) -> df`` adding columns to the rows of a chunk.

    ``fn`` sees the chunk's rows and ``lookback`` of history before them (the rows it
    may need); riverbed keeps only the chunk's rows of what it returns. The function must
    not look further back than ``lookback`` — that is what makes chunks equal one pass.
    """

    fn: Callable[[DataFrame], DataFrame]
    lookback: Duration

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SpecError("Custom(fn, lookback=...): fn must be a function df -> df")
        _us(self.lookback, "Custom lookback")

    @property
    def lookback_us(self) -> int:
        return _us(self.lookback, "Custom lookback")


@dataclass(frozen=True)
class Tumbling(windows.Tumbling):
    """Aggregates of ``column`` per key and fixed window ``[k·size, (k+1)·size)``: the
    stream's window (:class:`riverbed.windows.Tumbling`, the one size rule and window
    arithmetic both engines use) with what to aggregate in it."""

    column: str
    aggs: str | Sequence[str] = ("mean",)

    def __post_init__(self) -> None:
        what = f"Tumbling({self.size!r}, {self.column!r})"
        object.__setattr__(self, "aggs", _aggs(self.aggs, AGGREGATES, what))
        _column(self.column, what)
        _us(self.size, what)
        super().__post_init__()

    @property
    def size_us(self) -> int:
        return self.size_ms * 1000

    def names(self) -> list[tuple[str, str]]:
        return [(a, f"{self.column}_{a}_{label(self.size_us)}") for a in self.aggs]


Metric = Rolling | Rows | Cumulative | Custom


@dataclass(frozen=True)
class ParquetInput:
    """A Parquet dataset, optionally partitioned by time into ``hour=`` or ``date=`` folders,
    in a directory or a bucket (``s3://bucket/prefix``, read through Spark's ``s3a://``).

    With ``partition="hour"`` the folders are ``hour=2026-01-01T05`` and with ``"date"``
    ``date=2026-01-01`` (UTC). riverbed reads only the folders a chunk needs; a folder
    that is missing is a :class:`MissingInputError` unless ``allow_missing=True``.
    """

    path: str
    partition: Literal["hour", "date"] | None = None
    allow_missing: bool = False

    def __post_init__(self) -> None:
        scheme = urlsplit(str(self.path)).scheme
        if scheme not in ("", "file", "s3"):
            raise SpecError(
                f"ParquetInput: path {self.path!r} must be a directory (a path or "
                "file:///path) or a bucket (s3://bucket/prefix)"
            )
        if self.partition not in (None, "hour", "date"):
            raise SpecError(
                f"ParquetInput: partition must be 'hour', 'date' or None, not {self.partition!r}"
            )


@dataclass(frozen=True)
class TopicInput:
    """A riverbed topic, read by event time.

    Columns: the value fields (``schema``, a Spark DDL string such as
    ``"sensor_id string, value double"``; default: inferred from the first records),
    ``key`` (the record key) and ``timestamp`` (the record's event time). With
    ``time="timestamp"`` a chunk reads only the records whose event time can fall in
    it (see :mod:`riverbed.timerange.topic`); with a time column from the value,
    every chunk scans the whole topic. ``log`` is the log's URL (default
    ``RIVERBED_LOG``). A record that does not fit the schema stops the run with an
    error naming its partition and offset.
    """

    topic: str
    log: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise SpecError(f"TopicInput: topic must be a topic name, not {self.topic!r}")
        if self.schema is not None and (not isinstance(self.schema, str) or not self.schema):
            raise SpecError(
                "TopicInput: schema must be a Spark DDL string "
                "like 'sensor_id string, value double'"
            )


@dataclass(frozen=True)
class FunctionInput:
    """Any ``fn(spark, start, end) -> DataFrame`` returning the rows of ``[start, end)``."""

    fn: Callable[[SparkSession, datetime, datetime], DataFrame]


@dataclass(frozen=True)
class KafkaInput:
    """A Kafka topic of JSON values, read by Spark's own Kafka connector.

    Columns: the value fields (``schema``, a Spark DDL string such as
    ``"sensor_id string, value double"``), ``key`` (the record key, as a string) and
    ``timestamp`` (the record's Kafka timestamp). With ``time="timestamp"`` a chunk
    ``[lo, hi)`` starts reading at each partition's first offset at or after ``lo``
    (Kafka's own time index) and stops at the partition's end — or, given ``lateness``
    (how late a record can arrive after newer ones, e.g. ``"10m"``), at the first
    offset at or after ``hi + lateness``. With a time column from the value, every
    chunk reads the whole topic. ``options`` go to Spark's reader as they are (security
    settings: ``{"kafka.security.protocol": "SASL_SSL", ...}``).
    """

    bootstrap: str
    topic: str
    schema: str
    lateness: Duration | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from riverbed.errors import InvalidValueError
        from riverbed.spark.kafkaread import check_topic

        if not isinstance(self.bootstrap, str) or not all(
            a.strip().rpartition(":")[2].isdigit() for a in self.bootstrap.split(",")
        ):
            raise SpecError(
                f"KafkaInput: bootstrap must be host:port[,host:port...], not {self.bootstrap!r}"
            )
        try:
            check_topic(self.topic, "KafkaInput")
        except InvalidValueError as exc:
            raise SpecError(str(exc)) from None
        if not isinstance(self.schema, str) or not self.schema.strip():
            raise SpecError(
                "KafkaInput: schema must be a Spark DDL string of the JSON value's fields, "
                "like 'sensor_id string, value double'"
            )
        if self.lateness is not None:
            _us(self.lateness, "KafkaInput: lateness")
        owned = {"subscribe", "subscribepattern", "assign", "kafka.bootstrap.servers"}
        clash = sorted(
            k for k in self.options if k.lower() in owned | {"startingoffsets", "endingoffsets"}
        )
        if clash:
            raise SpecError(
                f"KafkaInput: riverbed sets {', '.join(clash)} itself (from bootstrap, topic "
                "and each chunk's range); leave them out of options"
            )

    @property
    def lateness_ms(self) -> int | None:
        return None if self.lateness is None else _us(self.lateness, "KafkaInput") // 1000


Input = ParquetInput | TopicInput | KafkaInput | FunctionInput


@dataclass(frozen=True)
class TimeRangeSpec:
    """The spec of a time-range job: what every module of the package reads. Users
    write :class:`riverbed.jobs.timerange.TimeRangeJob`, this spec plus ``as_job``."""

    input: Input | Callable[..., Any]
    key: str | Sequence[str]
    time: str
    metrics: Sequence[Metric] = ()
    tumbling: Sequence[Tumbling] = ()
    output: str = ""
    chunk: Duration = "1h"
    name: str = ""
    description: str = ""
    tables: Mapping[str, str] = field(default_factory=dict)
    keys: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        where = f"time-range job '{self.name}'" if self.name else "time-range job"
        inp = self.input
        if not isinstance(inp, ParquetInput | TopicInput | KafkaInput | FunctionInput):
            if not callable(inp):
                raise SpecError(
                    f"{where}: input must be ParquetInput(...), TopicInput(...), "
                    "KafkaInput(...), FunctionInput(fn) "
                    "or a function (spark, start, end) -> DataFrame"
                )
            object.__setattr__(self, "input", FunctionInput(inp))
        keys = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        if not keys:
            raise SpecError(f"{where}: key must name at least one column")
        for k in keys:
            _column(k, f"{where}: key")
        object.__setattr__(self, "keys", keys)
        _column(self.time, f"{where}: time")
        metrics = tuple(self.metrics)
        for m in metrics:
            if not isinstance(m, Rolling | Rows | Cumulative | Custom):
                raise SpecError(
                    f"{where}: metrics take Rolling, Rows, Cumulative or Custom, not {m!r}"
                )
        object.__setattr__(self, "metrics", metrics)
        tumbling = tuple(self.tumbling)
        for t in tumbling:
            if not isinstance(t, Tumbling):
                raise SpecError(f"{where}: tumbling takes Tumbling(...), not {t!r}")
        object.__setattr__(self, "tumbling", tumbling)
        if not metrics and not tumbling:
            raise SpecError(f"{where}: give at least one metric or tumbling aggregate")
        names = [n for m in metrics if not isinstance(m, Custom) for _, n in m.names()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"{where}: metrics produce the same column twice: {dupes}")
        _us(self.chunk, f"{where}: chunk")
        self._check_tables(where)

    def _check_tables(self, where: str) -> None:
        """``tables``: each dataset the job writes → a lakehouse table its chunks are
        partitions of (:mod:`riverbed.tables`), spelled as ``--table`` is."""
        if not isinstance(self.tables, Mapping):
            raise SpecError(
                f"{where}: tables maps a dataset to a table, e.g. {{'rows': 'delta:…'}}"
            )
        if not self.tables:
            return
        from riverbed.tables import PARTITION, TableNameError, parse_table

        columns = [*self.keys, self.time] + [
            n
            for m in (*self.metrics, *self.tumbling)
            if not isinstance(m, Custom)
            for _, n in m.names()
        ]
        if PARTITION in columns:
            raise SpecError(
                f"{where}: a column is named {PARTITION!r}, the partition column of the "
                "tables a job publishes to: rename it"
            )
        known = self.datasets()
        for dataset, text in self.tables.items():
            if dataset not in known:
                raise SpecError(
                    f"{where}: tables names dataset {dataset!r}; the job writes {known}"
                )
            try:
                parse_table(text, f"tables[{dataset!r}]")
            except TableNameError as exc:
                raise SpecError(f"{where}: {exc}") from None
        object.__setattr__(self, "tables", dict(self.tables))

    def datasets(self) -> list[str]:
        """The datasets the job writes, each a folder of the output: ``rows`` (when it
        has metrics) and one per tumbling window size (:func:`window_dataset`)."""
        sizes = sorted({t.size_us for t in self.tumbling})
        return ["rows"] * bool(self.metrics) + [window_dataset(label(s)) for s in sizes]

    @property
    def chunk_us(self) -> int:
        return _us(self.chunk, "chunk")

    @property
    def rolling(self) -> tuple[Rolling, ...]:
        return tuple(m for m in self.metrics if isinstance(m, Rolling))

    @property
    def rows(self) -> tuple[Rows, ...]:
        return tuple(m for m in self.metrics if isinstance(m, Rows))

    @property
    def cumulative(self) -> tuple[Cumulative, ...]:
        return tuple(m for m in self.metrics if isinstance(m, Cumulative))

    @property
    def custom(self) -> tuple[Custom, ...]:
        return tuple(m for m in self.metrics if isinstance(m, Custom))

    @property
    def lookback_us(self) -> int:
        """History of time a chunk must re-read before its start (0: none)."""
        spans = [r.window_us for r in self.rolling] + [c.lookback_us for c in self.custom]
        return max(spans, default=0)

    def read_from(self, origin: int, start: int) -> int:
        """Where a chunk starting at ``start`` reads its input from: its lookback before
        it, never before the job's origin."""
        return max(origin, start - self.lookback_us)

    @property
    def tail_rows(self) -> int:
        """Rows per key a chunk carries to the next for row windows (0: none)."""
        return max((r.n - 1 for r in self.rows), default=0)

    @property
    def tumbling_us(self) -> int:
        """The longest tumbling window (0: none)."""
        return max((t.size_us for t in self.tumbling), default=0)


@dataclass(frozen=True)
class LoadedSpec:
    job: TimeRangeSpec
    path: Path
    version: str

    @property
    def name(self) -> str:
        return self.job.name


def output_location(output: str, name: str, checkpoints: str = "") -> str:
    """Where job ``name``'s output goes — the one rule: its spec's ``output`` (a path,
    relative to the working directory like every path a user gives, or a bucket), else
    ``<checkpoints>/output/<name>`` when the checkpoints setting is a bucket, else
    ``output/<name>``."""
    if output:
        where = locations.parse(output, "output")
    elif (bucket := locations.output_in_bucket(checkpoints, name)) is not None:
        where = locations.parse(bucket, "checkpoints")
    else:
        where = Path(locations.OUTPUT) / name
    return str(where.resolve()) if isinstance(where, Path) else where


def placed(
    job: TimeRangeSpec, name: str, checkpoints: str = "", log_url: str = ""
) -> TimeRangeSpec:
    """``job`` named ``name`` with its places settled from riverbed's settings: its output
    where :func:`output_location` says, a topic input's log ``log_url`` unless it names
    one (so nothing below reads the configuration)."""
    job = replace(job, name=name, output=output_location(job.output, name, checkpoints))
    if isinstance(job.input, TopicInput) and not job.input.log and log_url:
        job = replace(job, input=replace(job.input, log=log_url))
    return job


def load_spec(path: str | Path, checkpoints: str = "", log_url: str = "") -> LoadedSpec:
    """Import the spec file at ``path`` (its ``main`` code never runs here); its places
    settled by :func:`placed`."""
    path = Path(path).resolve()
    if path.suffix != ".py":
        raise SpecError(f"{path}: a time-range spec is a Python file (.py)")
    if not path.is_file():
        raise SpecError(f"no spec file {path}; give the path to a .py file with `job = ...`")
    name = path.stem
    if not NAME.match(name):
        raise SpecError(f"{path}: the file's stem must be a Python name (it is the job's name)")
    module = import_file(path, f"riverbed_timerange_{name}", f"spec '{name}'", SpecError)
    job = getattr(module, "job", None)
    # TimeRangeJob(...).as_job(...): a job of the orchestrator, whose main (a
    # riverbed.jobs.timerange.TimeRangeMain) names the spec it runs
    inner = getattr(getattr(job, "main", None), "timerange_spec", None)
    if isinstance(inner, TimeRangeSpec):
        job = inner
    if not isinstance(job, TimeRangeSpec):
        raise SpecError(
            f"{path} defines no `job = TimeRangeJob(...)` (or `TimeRangeJob(...).as_job(...)`); "
            "add one"
        )
    if job.name and job.name != name:
        raise SpecError(
            f"{path}: TimeRangeJob(name={job.name!r}) differs from the file's name '{name}'; "
            "drop name= or rename the file"
        )
    job = placed(job, name, checkpoints, log_url)
    return LoadedSpec(job, path, code_version(path.read_bytes(), git_sha(path.parent)))
