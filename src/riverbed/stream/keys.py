"""Composite keys: ``key=["channel", "auction_mod"]``.

The engine groups, partitions and stores state by one string per event. For a composite
key that string is the parts' values as a compact JSON array (``["web",3]``) — one text
for state keys, state partitions (its CRC-32), the result table's ``key`` column (so a
reader's "newest batch per window and key" still holds), SQL upserts and Kafka record
keys. The result table also carries each part under its own name, typed as the source
column it came from (:func:`resolved` records those types in the spec at start, from the
schema the source or its derived columns have; a part whose type is not known is text).

A part that is NULL leaves the key NULL: the event is malformed ("no key"), as an event
without a single key is.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.stream.aggregation import Aggregation

__all__ = ["decode", "encode", "resolved"]

# result types of a key part (Spark DDL names) by the Spark SQL type of its column
_RESULT_TYPES = {
    "int": "long",
    "bigint": "long",
    "double": "double",
    "string": "string",
    "boolean": "boolean",
    "timestamp": "timestamp",
}


def encode(table: pa.Table, parts: tuple[str, ...]) -> pa.Array:
    """Each row's key: its parts' values as compact JSON text; NULL if a part is."""
    columns = []
    for name in parts:
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        columns.append(column.to_pylist())
    texts = [
        None if any(v is None for v in values) else _text(values)
        for values in zip(*columns, strict=True)
    ]
    return pa.array(texts, pa.string())


def _text(values: tuple[Any, ...]) -> str:
    return json.dumps([_plain(v) for v in values], separators=(",", ":"), ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def decode(keys: list[str], spec: Aggregation) -> dict[str, list[Any]]:
    """The parts of encoded keys, as columns typed by ``spec.key_types``."""
    values = [json.loads(k) for k in keys]
    out: dict[str, list[Any]] = {}
    for i, name in enumerate(spec.key_parts):
        kind = spec.key_types.get(name, "string")
        column = [v[i] for v in values]
        if kind == "timestamp":
            out[name] = [pd.Timestamp(v).tz_convert("UTC") for v in column]
        elif kind == "string":
            out[name] = [v if isinstance(v, str) else json.dumps(v) for v in column]
        else:
            out[name] = column
    return out


def resolved(spec: Aggregation, types: dict[str, Any]) -> Aggregation:
    """``spec`` with its composite key's part types (``types``: a column's Spark SQL
    type, riverbed.stream.expressions.SqlType, for the source's fields and the derived
    columns), so the result table types each part as its column."""
    if not spec.composite:
        return spec
    found = {}
    for name in spec.key_parts:
        t = types.get(name)
        found[name] = _RESULT_TYPES.get(getattr(t, "name", ""), "string")
    if found == dict(spec.key_types):
        return spec
    return dataclasses.replace(spec, key_types=found)
