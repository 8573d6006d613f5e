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
import math
from datetime import datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.stream.aggregation import Aggregation
from riverbed.stream.metrics import VALUE_METRICS

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
    """Each row's key: its parts' values as compact JSON text; NULL if a part is.

    Vectorized: each part is dictionary-encoded, the rows' tuples of codes made unique
    (few, in a batch), and only those are written as JSON — then taken back per row
    (232 ms a 50,000-row batch one row at a time; a few ms so)."""
    n = table.num_rows
    if n == 0:
        return pa.array([], pa.string())
    null = np.zeros(n, dtype=bool)
    codes, dictionaries = [], []
    for name in parts:
        column = table.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        null |= np.asarray(pc.is_null(encoded.indices).to_numpy(zero_copy_only=False), bool)
        codes.append(pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False))
        dictionaries.append(encoded.dictionary)
    sizes = [max(len(d), 1) for d in dictionaries]
    if math.prod(sizes) < 2**62:  # one int64 a row: a 1-D unique, ~5x the 2-D one
        combined = np.zeros(n, dtype=np.int64)
        for code, size in zip(codes, sizes, strict=True):
            combined = combined * size + code.astype(np.int64)
        uniques, inverse = np.unique(combined, return_inverse=True)
        strides = [math.prod(sizes[k + 1 :]) for k in range(len(sizes))]
        unique_codes = [
            (uniques // stride) % size for stride, size in zip(strides, sizes, strict=True)
        ]
    else:
        stacked, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
        unique_codes = [stacked[:, k] for k in range(len(sizes))]
    texts = _texts(dictionaries, unique_codes)
    keys = texts.take(pa.array(inverse.reshape(-1)))
    return pc.if_else(pa.array(null), pa.scalar(None, pa.string()), keys)


# what JSON escapes in a string (ensure_ascii=False): the quote, the backslash, controls
_ESCAPED = r'["\\\x00-\x1f]'


def _texts(dictionaries: list[pa.Array], codes: list[np.ndarray]) -> pa.Array:
    """The JSON text of each tuple of codes (``codes[k][i]``: part ``k`` of tuple ``i``,
    an index into ``dictionaries[k]``): by Arrow's string kernels when every part is an
    integer, a boolean or a string JSON writes as it is (Nexmark q4's (auction,
    category): the per-tuple ``json.dumps`` was 5 % of its aggregation), else a tuple at
    a time."""
    pieces = []
    for dictionary, at in zip(dictionaries, codes, strict=True):
        kind = dictionary.type
        if not len(dictionary):
            break
        values = dictionary.take(pa.array(at))
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            pieces.append(values.cast(pa.string()))  # (as JSON writes them)
        elif (
            pa.types.is_string(kind)
            and not pc.any(pc.match_substring_regex(values, _ESCAPED)).as_py()
        ):
            pieces.append(pc.binary_join_element_wise('"', values, '"', ""))
        else:
            break
    else:
        return pc.binary_join_element_wise("[", pc.binary_join_element_wise(*pieces, ","), "]", "")
    plain = [d.to_pylist() or [None] for d in dictionaries]  # (only nulls)
    return pa.array(
        [_text(tuple(d[int(i)] for d, i in zip(plain, combo, strict=True)))
         for combo in zip(*codes, strict=True)],
        pa.string(),
    )  # fmt: skip


def _text(values: tuple[Any, ...]) -> str:
    return json.dumps([_plain(v) for v in values], separators=(",", ":"), ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def decode(keys: list[str], spec: Aggregation) -> dict[str, list[Any]]:
    """The parts of encoded keys, as columns typed by ``spec.column_types``."""
    values = [json.loads(k) for k in keys]
    out: dict[str, list[Any]] = {}
    for i, name in enumerate(spec.key_parts):
        kind = spec.column_types.get(name, "string")
        column = [v[i] for v in values]
        if kind == "timestamp":
            out[name] = [pd.Timestamp(v).tz_convert("UTC") for v in column]
        elif kind == "string":
            out[name] = [v if isinstance(v, str) else json.dumps(v) for v in column]
        else:
            out[name] = column
    return out


def resolved(spec: Aggregation, types: dict[str, Any]) -> Aggregation:
    """``spec`` with the types of the columns its results carry values of — a composite
    key's parts, the columns First/Last/ArgMax/ArgMin return — (``types``: a column's
    Spark SQL type, riverbed.stream.expressions.SqlType, for the source's fields and the
    derived columns), so the result table types each as its column."""
    names = list(spec.key_parts) if spec.composite else []
    names += [c for m in spec.metrics.values() if isinstance(m, VALUE_METRICS) for c in m.columns]
    if not names:
        return spec
    found = {}
    for name in names:
        t = types.get(name)
        found[name] = _RESULT_TYPES.get(getattr(t, "name", ""), "string")
    if found == dict(spec.column_types):
        return spec
    return dataclasses.replace(spec, column_types=found)
