"""A lookup table in parts, placed as the state places keys, joined a part at a time.

A table too big to hold whole in every task (issue 52: "partitioned like the state
instead of broadcast") is split into ``n`` parts by the state's placement rule — a
key's part is the state partition :func:`riverbed.stream.rescale.partition_of` gives
its text, the rule an aggregation's keys and a rescale follow — so a task whose events
are one partition's keys needs one part, and any task holds one part at a time. Pure:
splitting a table and joining events with a table given part by part; where the parts
are stored and how a task loads them is the caller's.

:func:`join_parts` gives exactly what :func:`riverbed.stream.lookups.join` gives with
the whole table (the events' order and number kept; ``tests/stream/test_lookup_parts.py``
holds the two equal over random tables and events).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.stream.joins import Lookup
from riverbed.stream.lookups import join
from riverbed.stream.rescale import partition_of


def key_values(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A key column as one plain array (chunks combined, a dictionary decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def parts_of(values: pa.Array | pa.ChunkedArray, n: int) -> np.ndarray:
    """Each value's part (0 ≤ part < ``n``): the state partition of its text, computed
    once per distinct value — so an event's ``int32`` key and a table's ``int64`` key of
    the same number fall in the same part; -1 for NULL (it matches nothing)."""
    values = key_values(values)
    distinct = pc.unique(values).drop_null()
    places = pa.array([partition_of(str(v).encode(), n) for v in distinct.to_pylist()], pa.int32())
    at = pc.index_in(values, value_set=distinct)
    out: np.ndarray = pc.fill_null(pc.take(places, at), -1).to_numpy(zero_copy_only=False)
    return out.astype(np.int32, copy=False)


def split(table: pa.Table, key: str, n: int) -> list[pa.Table]:
    """``table``'s rows in ``n`` parts by their key's part (rows with a NULL key, which
    no event matches, in none)."""
    parts = parts_of(table.column(key), n)
    return [table.filter(pa.array(parts == p)) for p in range(n)]


def join_parts(
    events: pa.Table, lookup: Lookup, n: int, part: Callable[[int], pa.Table], schema: pa.Schema
) -> tuple[pa.Table, pa.Array]:
    """:func:`riverbed.stream.lookups.join` of ``events`` with a table in ``n`` parts
    (``part(p)``: part ``p``, asked for once, only for parts some event's key is in;
    ``schema``: the table's), row for row in the events' order."""
    parts = parts_of(events.column(lookup.event_column), n)
    pieces: list[tuple[np.ndarray, pa.Table, pa.Array]] = []
    for p in np.unique(parts):
        rows = np.flatnonzero(parts == p)
        table = schema.empty_table() if p < 0 else part(int(p))  # (NULL keys: no row)
        joined, found = join(events.take(pa.array(rows)), lookup, table)
        pieces.append((rows, joined, found))
    if not pieces:  # no events
        return join(events, lookup, schema.empty_table())
    if len(pieces) == 1:
        return pieces[0][1], pieces[0][2]
    rows = np.concatenate([r for r, _, _ in pieces])
    back = pa.array(np.argsort(rows, kind="stable"))  # where each event's row went
    joined = pa.concat_tables([t for _, t, _ in pieces], promote_options="permissive")
    found = pa.concat_arrays([f for _, _, f in pieces])
    return joined.take(back), found.take(back)


__all__ = ["join_parts", "key_values", "parts_of", "split"]
