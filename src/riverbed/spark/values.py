"""How a record's value becomes the source's columns — and when it is malformed.

The one owner of the rules (docs/stream.md, "What riverbed does with bad input"): a
value must decode to an object whose fields fit the schema's types — an integer (or an
integral number) in range for a long or an int, a finite number for a double, a boolean
for a boolean, an ISO-8601 time (naive: UTC) or epoch milliseconds in years 1-9999 for
a timestamp; a string field takes any JSON value, a non-string as its JSON text; a
missing or null field is null; of a field given twice the last counts. Anything else —
a null value (a Kafka tombstone), bytes that are not the serde's, JSON that is not an
object, a field of the wrong type — makes the record *malformed*: its fields are null
and ``_error`` says why, so the stream counts it and sends it to the dead-letter topic
instead of failing.

Two ways to decode, with the same answers: all of a batch's JSON values in one pyarrow
call (:func:`json_values`, ~10x faster), else record by record
(:func:`values_one_by_one`), which is also where every malformed record is explained.
"""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    TimestampType,
)

__all__ = [
    "FAST_TYPES",
    "coerce",
    "json_values",
    "newline_joined",
    "typed_values",
    "values_one_by_one",
]

FAST_TYPES = (LongType, IntegerType, DoubleType, StringType, BooleanType, TimestampType)
_RANGES = {"long": (-(2**63), 2**63 - 1), "int": (-(2**31), 2**31 - 1)}
_SHOWN = 60  # characters of a bad value an error repeats (a 10 MB string is not echoed)


def json_values(
    values: pa.BinaryArray, value_fields: list[StructField], schema: pa.Schema
) -> dict[str, pa.Array] | None:
    """Parse JSON values with pyarrow in one call (~10x the per-record path).

    Returns ``None`` when anything is off (a malformed value, a type mismatch, a value
    spanning lines); the caller then takes the per-record path, which reports each
    problem in ``_error``. Only batches whose every value starts with ``{`` are given to
    pyarrow: its reader (26.0) crashes the process (SIGSEGV) on a first value ``null``,
    and takes a later ``null`` for a row of nulls.
    """
    import pyarrow.json as pj

    if not _objects_only(values):
        return None
    value_schema = pa.schema([schema.field(f.name) for f in value_fields])
    try:
        table = pj.read_json(
            io.BytesIO(newline_joined(values)),
            # one thread: Spark already runs a task per core; Arrow's own pool would
            # oversubscribe them
            read_options=pj.ReadOptions(use_threads=False, block_size=16 << 20),
            parse_options=pj.ParseOptions(
                explicit_schema=value_schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, UnicodeError):
        return None  # (pyarrow's message about bytes that are not UTF-8 is not UTF-8 either)
    if table.num_rows != len(values):
        return None
    columns = {f.name: table.column(f.name).combine_chunks() for f in value_fields}
    for column in columns.values():
        # pyarrow reads NaN, Infinity and numbers past a double's range (as inf), which
        # are not JSON, and keeps bytes that are not UTF-8 in strings (which fail
        # whatever reads them next): the per-record path says which record has them
        if pa.types.is_floating(column.type) and pc.any(pc.invert(pc.is_finite(column))).as_py():
            return None
        if pa.types.is_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                return None
    return columns


def _objects_only(values: pa.BinaryArray) -> bool:
    """Whether every value is present and starts with ``{`` (read from the Arrow
    buffers: no Python object per value)."""
    n = len(values)
    if n == 0 or values.null_count:
        return n == 0
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=values.offset * 4)
    if data_buf is None or (np.diff(offsets) == 0).any():
        return False
    data = np.frombuffer(data_buf, dtype=np.uint8)
    return bool((data[offsets[:-1]] == ord("{")).all())


def newline_joined(values: pa.BinaryArray) -> bytes:
    """The values' bytes with a newline between each two, straight from the Arrow
    buffers (no Python object per value)."""
    n = len(values)
    if n == 0:
        return b""
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=values.offset * 4)
    if data_buf is None:
        return b"\n" * (n - 1)
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return np.insert(data, offsets[1:-1] - offsets[0], ord("\n")).tobytes()


def typed_values(
    values: pa.StructArray, value_fields: list[StructField], schema: pa.Schema
) -> dict[str, pa.Array] | None:
    """A typed topic's columns as the source's schema wants them: no parsing, a cast
    where the types differ (``None`` when a cast fails: the caller then goes record by
    record and reports each problem in ``_error``); a field the topic lacks is null."""
    stored = dict(zip(values.type.names, values.flatten(), strict=True))
    out: dict[str, pa.Array] = {}
    for f in value_fields:
        want = schema.field(f.name).type
        column = stored.get(f.name)
        if column is None:
            out[f.name] = pa.nulls(len(values), want)
            continue
        if column.type != want:
            try:
                column = column.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        out[f.name] = column
    return out


def values_one_by_one(
    values: list[Any],
    keys: list[bytes | None],
    value_fields: list[StructField],
    schema: pa.Schema,
    serde: Any,
) -> dict[str, pa.Array]:
    """Values (serde bytes, or a typed topic's field dicts) one record at a time, with
    the reason each malformed one is in ``_error``."""
    from riverbed.log import SerdeError

    out: dict[str, list[Any]] = {f.name: [] for f in value_fields}
    errors: list[str | None] = []
    for raw, key in zip(values, keys, strict=True):
        error = None
        fields: dict[str, Any] = {}
        try:
            if raw is None:
                raise SerdeError("the value is null" + (" (a tombstone)" if key else ""))
            decoded = raw if isinstance(raw, dict) else serde.deserialize(raw)
            if isinstance(decoded, dict):
                fields = decoded
            elif len(value_fields) == 1 and decoded is not None:
                fields = {value_fields[0].name: decoded}
            else:
                error = f"the value is {_kind(decoded)}, not an object"
        except SerdeError as exc:
            error = str(exc)
        row = []
        for f in value_fields:
            v = fields.get(f.name)
            if v is not None and error is None:
                v, problem = coerce(v, f.dataType)
                if problem:
                    error = f"field {f.name!r}: {problem}"
            row.append(v)
        for f, v in zip(value_fields, row, strict=True):
            out[f.name].append(None if error is not None else v)
        errors.append(error)
    arrays = {name: pa.array(col, schema.field(name).type) for name, col in out.items()}
    arrays["_error"] = pa.array(errors, pa.string())
    return arrays


def _kind(value: Any) -> str:
    return "null" if value is None else f"a JSON {type(value).__name__}"


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."


def coerce(value: Any, data_type: DataType) -> tuple[Any, str | None]:
    """``value`` (decoded JSON, not null) as ``data_type`` wants it, or why it cannot
    be: ``(None, reason)``."""
    if isinstance(data_type, LongType | IntegerType):
        kind = "long" if isinstance(data_type, LongType) else "int"
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"{_show(value)} is not an integer"
        low, high = _RANGES[kind]
        if not low <= value <= high:
            return None, f"{_show(value)} is out of a {kind}'s range"
        return value, None
    if isinstance(data_type, DoubleType):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, f"{_show(value)} is not a number"
        try:
            number = float(value)
        except OverflowError:
            return None, f"{_show(value)} is out of a double's range"
        if not math.isfinite(number):
            return None, f"{_show(value)} is not a finite number"
        return number, None
    if isinstance(data_type, BooleanType):
        if not isinstance(value, bool):
            return None, f"{_show(value)} is not a boolean"
        return value, None
    if isinstance(data_type, StringType):
        return (value if isinstance(value, str) else json.dumps(value)), None
    if isinstance(data_type, TimestampType):
        return _timestamp(value)
    return value, None


def _timestamp(value: Any) -> tuple[Any, str | None]:
    """An ISO-8601 time (naive: UTC) or epoch milliseconds, in years 1-9999."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None, f"{_show(value)} is not a time (ISO-8601 or epoch milliseconds)"
    outside = None, f"{_show(value)} is not a time in years 1-9999 (ISO-8601 or epoch ms)"
    try:
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value)
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)), None
        if not math.isfinite(value):
            return outside
        return datetime.fromtimestamp(value / 1000, tz=UTC), None
    except (ValueError, OverflowError, OSError):
        return outside
