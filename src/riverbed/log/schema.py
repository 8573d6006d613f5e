"""Typed topics: a topic's schema, and records checked and turned into Arrow columns.

A typed topic carries a schema written the way Spark writes one, ``"user_id long, flag
string, ts timestamp"``. Producers' values (mappings) are checked against it and become
typed Arrow columns, so readers — the Spark source, the stream engine — take the
columns without parsing text. This module is the pure part: parse and print a schema,
turn values into a record batch (or say exactly which record and field does not fit,
and why), and back.

Every field may be null (a missing field is null); a field the schema does not name is
refused, so a typo is not silently dropped. Timestamps are UTC microseconds; they are
given as ``datetime`` (naive means UTC) or ISO-8601 text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any

import pyarrow as pa

from riverbed.log.errors import LogValueError

__all__ = [
    "SchemaError",
    "ValueMismatch",
    "from_batch",
    "parse_schema",
    "schema_ddl",
    "schema_of",
    "to_batch",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")

# Spark's names for the types a topic can carry (the first name of each is printed)
TYPES: dict[str, pa.DataType] = {
    "long": pa.int64(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "smallint": pa.int16(),
    "byte": pa.int8(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "timestamp": TIMESTAMP,
    "date": pa.date32(),
    "binary": pa.binary(),
}
_NAMES = {t: name for name, t in reversed(list(TYPES.items()))}
_FIELD = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+([A-Za-z]+)\s*$")


class SchemaError(LogValueError):
    """A schema that cannot be parsed or used."""


class ValueMismatch(LogValueError):
    """A record that does not fit the topic's schema: which one, which field, and why."""

    def __init__(self, index: int, field: str | None, reason: str) -> None:
        self.index, self.field, self.reason = index, field, reason
        where = f"field '{field}'" if field is not None else "the record"
        super().__init__(f"record {index}: {where} {reason}")


def parse_schema(ddl: str) -> pa.Schema:
    """``"user_id long, flag string, ts timestamp"`` as an Arrow schema."""
    if not ddl.strip():
        raise SchemaError("an empty schema; write it like 'user_id long, flag string'")
    fields: list[pa.Field] = []
    for part in ddl.split(","):
        match = _FIELD.match(part)
        if match is None:
            raise SchemaError(
                f"cannot read {part.strip()!r} in the schema; write each field as "
                "'name type', e.g. 'user_id long, flag string, ts timestamp'"
            )
        name, type_name = match.group(1), match.group(2).lower()
        if type_name not in TYPES:
            raise SchemaError(
                f"field '{name}' has type {match.group(2)!r}, which a topic cannot carry; "
                f"one of: {', '.join(sorted(set(_NAMES.values())))}"
            )
        if any(f.name == name for f in fields):
            raise SchemaError(f"field '{name}' appears twice in the schema")
        fields.append(pa.field(name, TYPES[type_name]))
    return pa.schema(fields)


@lru_cache(maxsize=256)
def _parsed(ddl: str) -> pa.Schema:
    return parse_schema(ddl)


def schema_of(ddl: str | None) -> pa.Schema | None:
    """A topic's stored schema text, parsed once per process (``None``: untyped)."""
    return None if ddl is None else _parsed(ddl)


def schema_ddl(schema: pa.Schema) -> str:
    """The inverse of :func:`parse_schema` (canonical type names)."""
    try:
        return ", ".join(f"{f.name} {_NAMES[f.type]}" for f in schema)
    except KeyError as exc:
        raise SchemaError(f"a topic cannot carry Arrow type {exc.args[0]}") from None


def _timestamp(value: Any) -> Any:
    """datetime (naive = UTC), ISO text or epoch milliseconds (as the JSON sources read
    a number for a time) → aware UTC datetime; anything else unchanged (Arrow then
    refuses it)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise TypeError("not a time")  # (the callers refuse the value it names)
        try:
            return datetime.fromtimestamp(value / 1000, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise TypeError("not a time in years 1-9999") from None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def _column(values: list[Any], field: pa.Field) -> pa.Array:
    if field.type == TIMESTAMP:
        numbers = any(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        try:  # datetimes, aware or naive (= UTC): Arrow converts them itself, fast
            if not numbers:  # (Arrow would take a number for microseconds)
                return pa.array(values, type=field.type, from_pandas=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            pass
        values = [_timestamp(v) for v in values]  # ISO text, epoch milliseconds
    elif field.type == pa.date32():
        values = [date.fromisoformat(v) if isinstance(v, str) else v for v in values]
    elif pa.types.is_floating(field.type):
        # ints are fine where floats are expected; bools are not numbers here
        if any(isinstance(v, bool) for v in values):
            raise TypeError("a boolean")
    elif pa.types.is_integer(field.type):
        if any(isinstance(v, bool) for v in values):
            raise TypeError("not an integer")
        if any(isinstance(v, float) for v in values):
            # an integral number is an integer (8.0: some JSON writers put every number
            # so), as the JSON sources read it; a fraction, NaN or infinity is not
            if not all(math.isfinite(v) and v.is_integer() for v in values if isinstance(v, float)):
                raise TypeError("not an integer")
            values = [int(v) if isinstance(v, float) else v for v in values]
    return pa.array(values, type=field.type, from_pandas=False)


def _first_bad(values: list[Any], field: pa.Field) -> tuple[int, Any]:
    for i, value in enumerate(values):
        try:
            _column([value], field)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return i, value
    return 0, values[0] if values else None


def to_batch(values: Sequence[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Check ``values`` (mappings) against ``schema`` and build their columns.

    Raises :class:`ValueMismatch` for the first record that does not fit."""
    names = set(schema.names)
    for i, value in enumerate(values):
        if not isinstance(value, Mapping):
            raise ValueMismatch(
                i, None, f"is a {type(value).__name__}, not a mapping of the schema's fields"
            )
        if not names.issuperset(value):
            extra = sorted(str(k) for k in value if k not in names)[0]
            raise ValueMismatch(i, extra, f"is not in the topic's schema ({schema_ddl(schema)})")
    arrays = []
    for field in schema:
        column = [v.get(field.name) for v in values]
        try:
            arrays.append(_column(column, field))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            i, bad = _first_bad(column, field)
            raise ValueMismatch(
                i, field.name, f"is {bad!r}, which is not a {_NAMES[field.type]}"
            ) from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def from_batch(batch: pa.RecordBatch | pa.Table) -> list[dict[str, Any]]:
    """The records of a batch as dicts (timestamps as aware UTC datetimes)."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    return rows
