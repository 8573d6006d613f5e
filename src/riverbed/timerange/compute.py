"""One chunk of a time-range job on Spark: read, compute across the edge, carry state on.

A chunk ``[s, e)`` reads its input from ``lo = max(origin, s - lookback)`` — the history its
time windows need — plus the rows **carried** from the chunk before: the last ``N - 1`` rows
per key older than ``lo`` (row windows) and per-key running aggregates (cumulative values).
Every window is then computed over that union exactly as a one-pass query would over the
whole range, and only the rows of ``[s, e)`` are kept. ``[s, e)`` may span several chunks
of the job (a batch: one query for all of them); for a job that carries state the query
also returns what each chunk's carry is derived from (:mod:`.carry`, in Arrow on the
driver, which saves each with its chunk's progress marker).

The same function with ``s = origin`` and one chunk spanning the whole range *is* the
one-pass computation (:func:`one_pass`), the oracle of the tests and the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from riverbed.timerange.carry import CAND, CHUNK, NEXT, T, part_names
from riverbed.timerange.errors import MissingInputError, SpecError
from riverbed.timerange.plan import to_datetime
from riverbed.timerange.spec import (
    FunctionInput,
    KafkaInput,
    ParquetInput,
    TimeRangeSpec,
    TopicInput,
    Tumbling,
    label,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.window import WindowSpec

__all__ = ["ChunkFrames", "compute_chunk", "input_folders", "one_pass", "read_input"]


@dataclass
class ChunkFrames:
    rows: DataFrame | None  # one row per input row of the chunk, with its metrics
    windows: dict[str, DataFrame]  # tumbling aggregates per window size label
    # a job that carries state: the rows with the columns its carries are derived from
    # (riverbed.timerange.carry: T, CHUNK, NEXT, CAND), plus the rows a tail may keep
    carrying: DataFrame | None = None
    columns: list[str] = field(default_factory=list)  # the input's (what a tail keeps)
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        """Drop what was cached for this chunk's several outputs."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def input_folders(inp: ParquetInput, lo: int, hi: int) -> list[Path]:
    """The partition folders covering ``[lo, hi)`` (existing or not)."""
    return [Path(inp.path) / name for name in folder_names(inp, lo, hi)]


def folder_names(inp: ParquetInput, lo: int, hi: int) -> list[str]:
    """The names of the partition folders covering ``[lo, hi)``: ``hour=…``/``date=…``."""
    assert inp.partition is not None
    step = timedelta(hours=1) if inp.partition == "hour" else timedelta(days=1)
    start = to_datetime(lo)
    start = (
        start.replace(minute=0, second=0, microsecond=0)
        if inp.partition == "hour"
        else start.replace(hour=0, minute=0, second=0, microsecond=0)
    )
    end = to_datetime(hi)
    out = []
    at = start
    while at < end:
        value = at.strftime("%Y-%m-%dT%H") if inp.partition == "hour" else at.strftime("%Y-%m-%d")
        out.append(f"{inp.partition}={value}")
        at += step
    return out


def read_input(spark: SparkSession, job: TimeRangeSpec, lo: int, hi: int) -> DataFrame:
    """The input rows with time in ``[lo, hi)``."""
    inp = job.input
    if isinstance(inp, ParquetInput):
        return _where_in(job, _read_parquet(spark, job, inp, lo, hi), lo, hi)
    if isinstance(inp, TopicInput):
        from riverbed.timerange.topic import read_topic

        return _where_in(job, read_topic(spark, job.name, job.time, inp, lo, hi), lo, hi)
    if isinstance(inp, KafkaInput):
        from riverbed.timerange.topic import read_kafka

        return _where_in(job, read_kafka(spark, job.time, inp, lo, hi), lo, hi)
    assert isinstance(inp, FunctionInput)
    return _where_in(job, inp.fn(spark, to_datetime(lo), to_datetime(hi)), lo, hi)


def _read_parquet(
    spark: SparkSession, job: TimeRangeSpec, inp: ParquetInput, lo: int, hi: int
) -> DataFrame:
    from pyspark.errors import AnalysisException

    try:
        return _read_parquet_folders(spark, inp, lo, hi)
    except AnalysisException as exc:
        if "TIMESTAMP(NANOS" in str(exc):
            raise SpecError(
                f"time-range job '{job.name}': {inp.path} stores timestamps in nanoseconds, "
                "which Spark cannot read; write them in microseconds (pandas: "
                "to_parquet(..., coerce_timestamps='us'), pyarrow: coerce_timestamps='us')"
            ) from None
        raise


def _read_parquet_folders(spark: SparkSession, inp: ParquetInput, lo: int, hi: int) -> DataFrame:
    """A ParquetInput in a directory or at ``s3://bucket/prefix``: riverbed's storage
    says which folders hold files (one listing), Spark reads them (a bucket through
    Hadoop's ``s3a://``)."""
    from riverbed.locations import location
    from riverbed.spark import s3a
    from riverbed.storage import shared_store

    store = shared_store(location(inp.path))
    where = store.locate("").rstrip("/")  # a directory's absolute path, or the URL
    folders = set(store.entries())
    if not folders:
        raise MissingInputError(
            f"input {where} does not exist or holds no files; write the dataset there or "
            "fix ParquetInput's path (for a bucket, check AWS_ENDPOINT_URL and its name too)"
        )
    s3a.configure_for(spark, where)
    base = s3a.to_s3a(where)
    if inp.partition is None:
        return spark.read.parquet(base)
    names = folder_names(inp, lo, hi)
    return _read_partitions(spark, inp, base, names, folders & set(names))


def _read_partitions(
    spark: SparkSession, inp: ParquetInput, base: str, names: list[str], present: set[str]
) -> DataFrame:
    """The partition folders ``names`` under ``base`` of which ``present`` exist; a
    missing one is an error unless the input allows it."""
    from pyspark.sql import functions as F

    missing = [name for name in names if name not in present]
    if missing and not inp.allow_missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise MissingInputError(
            f"input partition {base}/{missing[0]}{more} does not exist; write it, or set "
            "ParquetInput(..., allow_missing=True) if no data there is expected"
        )
    if present:
        folders = [f"{base}/{name}" for name in names if name in present]
        df = spark.read.option("basePath", base).parquet(*folders)
    else:
        df = spark.read.parquet(base).where(F.lit(False))
    return df.drop(inp.partition) if inp.partition in df.columns else df


def _where_in(job: TimeRangeSpec, df: DataFrame, lo: int, hi: int) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    missing_cols = [c for c in (*job.keys, job.time) if c not in df.columns]
    if missing_cols:
        raise SpecError(
            f"time-range job '{job.name}': the input has no column {missing_cols[0]!r} "
            f"(it has {', '.join(df.columns)}); fix key= / time= in the spec"
        )
    ttype = df.schema[job.time].dataType
    if not isinstance(ttype, TimestampType | TimestampNTZType):
        raise SpecError(
            f"time-range job '{job.name}': time column {job.time!r} is {ttype.simpleString()}, "
            "not a timestamp; cast it in the input function"
        )
    lo_dt, hi_dt = to_datetime(lo), to_datetime(hi)
    return df.where((F.col(job.time) >= F.lit(lo_dt)) & (F.col(job.time) < F.lit(hi_dt)))


def _agg(name: str, col: Column) -> Column:
    from pyspark.sql import functions as F

    return {
        "mean": F.avg,
        "sum": F.sum,
        "count": F.count,
        "min": F.min,
        "max": F.max,
        "stddev": F.stddev_samp,
    }[name](col)


def _windowed(df: DataFrame, agg: str, column: str, w: WindowSpec, min_periods: int) -> Column:
    """``agg`` of ``column`` over ``w`` with pandas' ``min_periods``: a count needs that many
    rows in the window, every other aggregate that many non-null values (else null); a
    sum over no values is 0 when ``min_periods`` is 0."""
    from pyspark.sql import functions as F

    value = _agg(agg, F.col(column)).over(w)
    if agg == "count":
        return F.when(F.count(F.lit(1)).over(w) >= min_periods, value)
    if agg == "sum" and min_periods == 0:
        value = F.coalesce(value, F.lit(0).cast(value_type(df, column)))
    return F.when(F.count(column).over(w) >= min_periods, value)


def _tiebreak(job: TimeRangeSpec, columns: list[str]) -> list[str]:
    return sorted(c for c in columns if c not in job.keys and c != job.time)


def compute_chunk(
    spark: SparkSession,
    job: TimeRangeSpec,
    origin: int,
    start: int,
    end: int,
    cumulative: DataFrame | None = None,
    tail: DataFrame | None = None,
) -> ChunkFrames:
    """The frames of chunk ``[start, end)`` (lazy; nothing runs until they are read)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lo = job.read_from(origin, start)
    base = read_input(spark, job, lo, end)
    columns = base.columns
    if tail is not None:
        base = base.unionByName(tail.select(*columns))
    base = base.withColumn(T, F.unix_micros(F.col(job.time)))
    outputs = bool(job.metrics) + len({t.size_us for t in job.tumbling})
    cached = [base.persist()] if outputs > 1 else []
    keys = list(job.keys)
    order = [F.col(T).asc(), *(F.col(c).asc_nulls_first() for c in _tiebreak(job, columns))]
    in_chunk = F.col(T) >= F.lit(start)

    rows: DataFrame | None = None
    if job.metrics:
        # one withColumns per step: each call has Spark analyse the whole plan again
        windowed: dict[str, Column] = {}
        for r in job.rolling:
            w = Window.partitionBy(*keys).orderBy(T).rangeBetween(-(r.window_us - 1), 0)
            for agg, name in r.names():
                windowed[name] = _windowed(base, agg, r.column, w, r.min_periods)
        for rw in job.rows:
            w = Window.partitionBy(*keys).orderBy(*order).rowsBetween(-(rw.n - 1), 0)
            periods = rw.n if rw.min_periods is None else rw.min_periods
            for agg, name in rw.names():
                windowed[name] = _windowed(base, agg, rw.column, w, periods)
        out = base.withColumns(windowed) if windowed else base
        if job.cumulative:
            out = _cumulative_rows(job, out, start, cumulative)
        for c in job.custom:
            out = c.fn(out)
            if T not in out.columns:
                raise SpecError(
                    f"time-range job '{job.name}': a Custom function dropped columns it was "
                    "given; it must only add columns"
                )
        rows = out.where(in_chunk).drop(T)

    windows: dict[str, DataFrame] = {}
    by_size: dict[int, list[Tumbling]] = {}
    for t in job.tumbling:
        by_size.setdefault(t.size_us, []).append(t)
    chunk_rows = base.where(in_chunk)
    for size, specs in sorted(by_size.items()):
        width = f"{size // 1_000_000} seconds" if size % 1_000_000 == 0 else f"{size} microseconds"
        aggs = [_agg(a, F.col(t.column)).alias(n) for t in specs for a, n in t.names()]
        windows[label(size)] = (
            chunk_rows.groupBy(*keys, F.window(job.time, width).alias("_w"))
            .agg(*aggs)
            .select(
                *keys,
                F.col("_w.start").alias("window_start"),
                F.col("_w.end").alias("window_end"),
                *[n for t in specs for _, n in t.names()],
            )
        )

    carrying = None
    if rows is not None and (job.cumulative or job.tail_rows):
        # which chunk of the batch a row is an output row of (-1: none, it was read for
        # the history), computed here rather than in Arrow on the driver
        index = F.when(in_chunk, F.floor((F.col(T) - F.lit(start)) / F.lit(job.chunk_us)))
        helpers = {CHUNK: F.coalesce(index, F.lit(-1)).cast("long")}
        if job.tail_rows:  # the rows that can be among the last before a chunk's next_lo
            w = Window.partitionBy(*keys).orderBy(*order)
            first = job.read_from(origin, min(end, start + job.chunk_us))
            last = job.read_from(origin, end)
            helpers[NEXT] = F.lead(T, job.tail_rows).over(w)
            helpers[CAND] = (F.col(T) < F.lit(last)) & (
                F.col(NEXT).isNull() | (F.col(NEXT) >= F.lit(first))
            )
            carrying = out.withColumns(helpers).where(in_chunk | F.col(CAND))
        else:
            carrying = out.withColumns(helpers).where(in_chunk)
    return ChunkFrames(rows, windows, carrying, columns, cached)


def value_type(df: DataFrame, column: str) -> str:
    dtype = df.schema[column].dataType.simpleString()
    return "double" if dtype in ("float", "double") or dtype.startswith("decimal") else "bigint"


def _cumulative_rows(
    job: TimeRangeSpec, out: DataFrame, start: int, carry: DataFrame | None
) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = list(job.keys)
    w = Window.partitionBy(*keys).orderBy(T).rangeBetween(Window.unboundedPreceding, 0)
    in_chunk = F.col(T) >= F.lit(start)
    columns = sorted({c.column for c in job.cumulative})
    running: dict[str, Column] = {}
    for col in columns:
        v = F.when(in_chunk, F.col(col))
        s, n, lo, hi = part_names(col)
        running |= {
            "_r" + s: F.sum(v).over(w),
            "_r" + n: F.count(v).over(w),
            "_r" + lo: F.min(v).over(w),
            "_r" + hi: F.max(v).over(w),
        }
    out = out.withColumns(running)
    if carry is not None:
        out = out.join(F.broadcast(carry), on=keys, how="left")
    else:
        out = out.withColumns(
            {
                part: F.lit(None).cast(_part_type(out, col, part))
                for col in columns
                for part in part_names(col)
            }
        )
    values: dict[str, Column] = {}
    for col in columns:
        s, n, lo, hi = part_names(col)
        total = F.coalesce(F.col(n), F.lit(0)) + F.coalesce(F.col("_r" + n), F.lit(0))
        summed = F.when(
            total > 0,
            F.when(F.col(s).isNull(), F.col("_r" + s)).otherwise(
                F.col(s) + F.coalesce(F.col("_r" + s), F.lit(0))
            ),
        )
        of = {
            "sum": summed,
            "count": total,
            "mean": F.when(total > 0, summed / total),
            "min": F.least(F.col(lo), F.col("_r" + lo)),
            "max": F.greatest(F.col(hi), F.col("_r" + hi)),
        }
        for c in job.cumulative:
            if c.column == col:
                values |= {name: of[agg] for agg, name in c.names()}
    out = out.withColumns(values)
    drop = [p for col in columns for p in part_names(col)]
    return out.drop(*drop, *["_r" + p for p in drop])


def _part_type(df: DataFrame, column: str, part: str) -> str:
    if part.endswith("__count"):
        return "bigint"
    if part.endswith("__sum"):
        return value_type(df, column)
    return df.schema[column].dataType.simpleString()


def one_pass(spark: SparkSession, job: TimeRangeSpec, start: int, end: int) -> ChunkFrames:
    """The whole range as one chunk: what every chunking must reproduce."""
    return compute_chunk(spark, job, start, start, end)
