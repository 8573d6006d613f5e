"""Which decoded events an aggregation cannot count: the engine's rules of *malformed*.

A source decides whether a record's value fits the schema (for riverbed and Kafka
topics: :mod:`riverbed.spark.values`); this module decides, for an event that did, whether
the aggregation can count it (docs/stream.md, "What riverbed does with bad input"):

* its key and its time are present;
* every window it falls in lies between 1970 and the end of year 9999: state keys
  start with the window's start as unsigned milliseconds since the epoch (so byte order
  is time order, and expiry one range delete: riverbed.state.keys), and a result's
  ``window_end`` must be a date Python, Parquet readers and Kafka can hold;
* the numbers its metrics read are finite: a NaN or an infinity would stay in the
  window's sum, mean, min or max for good, since state merges and never recomputes.

One function per engine path, with the same answers: :func:`arrow_reasons` for the
log-native tasks (Arrow batches), :func:`spark_reason` for the DataFrame path (a Spark
column). Either gives null for an event it can count, else why not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from riverbed.windows import span

if TYPE_CHECKING:
    from riverbed.stream.aggregation import Aggregation

__all__ = ["FIRST_MS", "LAST_MS", "arrow_reasons", "spark_reason"]

FIRST_MS = 0  # 1970-01-01T00:00:00Z: the earliest window start (state keys are unsigned)
LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the latest window end


def arrow_reasons(spec: Aggregation, batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """For each event of ``batch`` (decoded: the spec's columns, typed), null when the
    aggregation can count it, else why not."""
    why = pa.nulls(batch.num_rows, pa.string())
    key, time = batch.column(spec.key_column), batch.column(spec.time)
    why = _first(why, pc.or_(pc.is_null(key), pc.is_null(time)), _absent(spec))
    per_ms = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}[getattr(time.type, "unit", "ms")]
    raw = pc.fill_null(pc.cast(time, pa.int64()), 0).to_numpy(zero_copy_only=False)
    if getattr(time.type, "unit", "ms") == "s":
        raw = raw * 1000
    first, last = span(spec.window, raw // per_ms)  # numpy floors: times before 1970 too
    outside = (first < FIRST_MS) | (last > LAST_MS)
    if outside.any():
        why = _first(why, pa.array(outside), f"{spec.time} has a window outside 1970 to 9999")
    for name in spec.reads()[2:]:
        column = batch.column(name)
        if pa.types.is_floating(column.type):
            bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
            why = _first(why, bad, f"{name} is not a finite number")
    return why


def _absent(spec: Aggregation) -> str:
    """Why an event without its key (any part of it) or time cannot be counted."""
    return f"no {' or '.join(spec.key_parts)} or no {spec.time} in the record"


def _first(why: pa.Array, bad: Any, reason: str) -> pa.Array:
    """``reason`` where ``bad`` and no reason was given before."""
    return pc.if_else(pc.and_(bad, pc.is_null(why)), pa.scalar(reason, pa.string()), why)


def spark_reason(spec: Aggregation, schema: Any) -> Any:
    """:func:`arrow_reasons` as a Spark column over the DataFrame path's events
    (``schema``: their DataFrame's, for which columns hold floating-point numbers)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    time = F.col(spec.time)
    first, last = span(spec.window, F.unix_millis(time), F.floor)
    reason = F.when(F.col(spec.key_column).isNull() | time.isNull(), F.lit(_absent(spec))).when(
        (first < F.lit(FIRST_MS)) | (last > F.lit(LAST_MS)),
        F.lit(f"{spec.time} has a window outside 1970 to 9999"),
    )
    floating = {f.name for f in schema.fields if isinstance(f.dataType, DoubleType | FloatType)}
    for name in spec.reads()[2:]:
        if name not in floating:
            continue
        column = F.col(name)
        reason = reason.when(
            F.isnan(column) | (F.abs(column) == F.lit(float("inf"))),
            F.lit(f"{name} is not a finite number"),
        )
    return reason
