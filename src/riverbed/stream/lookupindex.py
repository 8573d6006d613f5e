"""A lookup table's key, hashed once per snapshot (:func:`key_index`), and the join of
events with a table by it (:func:`join_with`: what :func:`riverbed.stream.lookups.join`
does for a whole snapshot and :mod:`riverbed.stream.lookupparts` for each part)."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.stream.joins import Lookup


class KeyIndex:
    """A table's key, hashed once per snapshot where that pays (a task joins every piece
    of every batch with it; ``pc.index_in`` hashes the table again each time: 104 ms a
    50,000-event piece against a million integer keys, here 11): integers as 64-bit in
    a pandas index; text keys of small tables by ``index_in`` (Arrow hashes 100,000
    strings faster than pandas probes 50,000 Python ones), of big ones by a pandas
    index (benchmarks/lookups.py)."""

    SMALL_TEXT = 250_000  # text keys up to this many: index_in

    def __init__(self, keys: pa.Array) -> None:
        self.integral = pa.types.is_integer(keys.type)
        self.keys = keys
        self.index: pd.Index | None = None
        self.unique = True
        if self.integral:
            self.index = pd.Index(keys.cast(pa.int64()).to_numpy())
        elif len(keys) > self.SMALL_TEXT:
            self.index = pd.Index(keys.to_numpy(zero_copy_only=False))
        if self.index is not None:
            # built now, before any task thread probes it: pandas fills an index's hash
            # table on its first use, and threads that first use it together see it
            # half-filled ("Reindexing only valid with uniquely valued Index objects":
            # 163 of 200 tries with 4 threads; once in a fresh-clone suite run)
            self.unique = bool(self.index.is_unique)  # (asking fills the table)

    def positions(self, values: pa.Array) -> pa.Array:
        """Each value's row in the table (NULL: none, or a NULL value)."""
        if self.index is None:
            keys = self.keys if self.keys.type == values.type else self.keys.cast(values.type)
            return pc.index_in(values, value_set=keys).cast(pa.int64())
        valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
        if self.integral:
            probe = pc.fill_null(values.cast(pa.int64()), 0).to_numpy()
        else:
            probe = values.to_numpy(zero_copy_only=False)
        rows = self.index.get_indexer(probe)
        hit = (rows >= 0) & valid
        return pa.array(np.where(hit, rows, 0), pa.int64(), mask=~hit)


_INDEXES: dict[tuple[int, str], tuple[pa.Table, KeyIndex]] = {}
_INDEXES_LOCK = threading.Lock()


def key_index(table: pa.Table, key: str) -> KeyIndex:
    """The key index of ``table`` (kept for the few snapshots a process joins with; the
    table is held beside it, so its id is not reused meanwhile)."""
    with _INDEXES_LOCK:
        held = _INDEXES.get((id(table), key))
        if held is not None:
            return held[1]
    keys = table.column(key).combine_chunks()
    index = KeyIndex(keys)
    with _INDEXES_LOCK:
        if len(_INDEXES) >= 16:
            _INDEXES.pop(next(iter(_INDEXES)))
        _INDEXES[(id(table), key)] = (table, index)
    return index


def key_values(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A key column as one plain array (chunks combined, a dictionary decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def join_with(
    events: pa.Table, lookup: Lookup, table: pa.Table, index: KeyIndex | None = None
) -> tuple[pa.Table, pa.Array]:
    """``events`` with ``table``'s columns appended (row for row: the events' order and
    number are kept), and whether each event found a row (``index``: the table key's,
    when the caller holds it — else the process's kept one, :func:`key_index`)."""
    key = lookup.table_column
    values = key_values(events.column(lookup.event_column))
    at = (index or key_index(table, key)).positions(values)
    found = pc.is_valid(at)
    for name in table.column_names:
        if name == key:
            continue
        events = events.append_column(name, table.column(name).take(at))
    return events, found


__all__ = ["KeyIndex", "join_with", "key_index", "key_values"]
