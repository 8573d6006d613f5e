"""A lookup table in parts, placed as the state places keys, joined a part at a time.

A table too big to hold whole in every task (issue 52: "partitioned like the state
instead of broadcast") is split into ``n`` parts by the state's placement rule — a
key's part is the state partition :func:`riverbed.stream.rescale.partition_of` gives
its text, the rule an aggregation's keys, a rescale and a keyed topic's producer follow
— so a task whose events are one partition's keys needs that partition's parts only,
and a task holds the parts its events need up to a budget, not the whole table.

Stored in the checkpoint beside the whole snapshots (:mod:`riverbed.stream.lookups`):
a snapshot in parts has the id ``<content hash>.p<n>`` (its plan says how it is held)
and its objects ``riverbed/lookups/<id>/<p>.arrow`` and ``…/schema.arrow``; a task
reads a part when an event needs it and keeps the newest it read (and their key
indexes) up to :data:`KEPT_BYTES` (:class:`Parts`). A table is held in parts when its
``Lookup(parts=n)`` says so, or, without, when it is over :data:`WHOLE_BYTES` in
memory: then in the fewest multiple of the state partitions with parts of that size at
most on average.

:func:`join_parts` gives exactly what :func:`riverbed.stream.lookups.join` gives with
the whole table (the events' order and number kept; ``tests/stream/test_lookup_parts.py``
holds the two equal over random tables and events).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.arrowbytes import ipc_bytes, read_ipc_bytes
from riverbed.stream.joins import Lookup
from riverbed.stream.lookupindex import KeyIndex, join_with, key_values
from riverbed.stream.rescale import partition_of

if TYPE_CHECKING:
    from riverbed.storage import ObjectStore

WHOLE_BYTES = 64 * 1024 * 1024  # a table bigger in memory is held in parts (by default)
KEPT_BYTES = 2 * WHOLE_BYTES  # the parts of one snapshot a process keeps read, at most
_KEY = b"riverbed.key"  # the key column's name, in a snapshot's schema.arrow


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
    events: pa.Table,
    lookup: Lookup,
    n: int,
    part: Callable[[int], pa.Table | tuple[pa.Table, KeyIndex]],
    schema: pa.Schema,
) -> tuple[pa.Table, pa.Array]:
    """:func:`riverbed.stream.lookups.join` of ``events`` with a table in ``n`` parts
    (``part(p)``: part ``p`` — or it and its key's index — asked for once, only for
    parts some event's key is in; ``schema``: the table's), row for row in the events'
    order."""
    parts = parts_of(events.column(lookup.event_column), n)
    pieces: list[tuple[np.ndarray, pa.Table, pa.Array]] = []
    for p in np.unique(parts):
        rows = np.flatnonzero(parts == p)
        got = schema.empty_table() if p < 0 else part(int(p))  # (NULL keys: no row)
        table, index = got if isinstance(got, tuple) else (got, None)
        joined, found = join_with(events.take(pa.array(rows)), lookup, table, index)
        pieces.append((rows, joined, found))
    if not pieces:  # no events
        return join_with(events, lookup, schema.empty_table())
    if len(pieces) == 1:
        return pieces[0][1], pieces[0][2]
    rows = np.concatenate([r for r, _, _ in pieces])
    back = pa.array(np.argsort(rows, kind="stable"))  # where each event's row went
    joined = pa.concat_tables([t for _, t, _ in pieces], promote_options="permissive")
    found = pa.concat_arrays([f for _, _, f in pieces])
    return joined.take(back), found.take(back)


def part_count(lookup: Lookup, table: pa.Table, partitions: int) -> int:
    """How many parts a snapshot of ``table`` is held in: the lookup's ``parts``, else
    1 (whole) up to :data:`WHOLE_BYTES`, else the fewest multiple of ``partitions``
    whose parts hold that much at most on average."""
    if lookup.parts is not None:
        return lookup.parts
    size = int(table.nbytes)
    if size <= WHOLE_BYTES:
        return 1
    each = max(1, partitions)
    return each * math.ceil(size / (WHOLE_BYTES * each))


def parted(snapshot_id: str) -> int:
    """How many parts the snapshot ``snapshot_id`` is held in (0: whole)."""
    _, dot, n = snapshot_id.rpartition(".p")
    return int(n) if dot and n.isdigit() else 0


def store_parts(store: ObjectStore, prefix: str, table: pa.Table, key: str, n: int) -> str:
    """``table`` written in ``n`` parts under ``prefix`` (each object once per content,
    as a whole snapshot); its id (``<hash of the parts>.p<n>``)."""
    encoded = [ipc_bytes(part) for part in split(table, key, n)]
    digest = hashlib.sha256(str(n).encode())
    for data in encoded:
        digest.update(hashlib.sha256(data).digest())
    snapshot_id = f"{digest.hexdigest()[:32]}.p{n}"
    for at, data in enumerate(encoded):
        store.put_if_absent(f"{prefix}{snapshot_id}/{at}.arrow", data)
    # the table's columns, its key named (what a task needs before any part)
    keyed = table.schema.with_metadata({**(table.schema.metadata or {}), _KEY: key.encode()})
    store.put_if_absent(f"{prefix}{snapshot_id}/schema.arrow", ipc_bytes(keyed.empty_table()))
    return snapshot_id


class Parts:
    """A snapshot held in parts, as a task joins with it: its ``n``, its ``schema``,
    and :meth:`part` — read from the store when first asked for, the newest read kept
    up to :data:`KEPT_BYTES` in memory (always the one just read): a task's events of
    one state partition need ``n`` / partitions of them."""

    def __init__(self, store: ObjectStore, prefix: str, snapshot_id: str) -> None:
        self.n = parted(snapshot_id)
        self._store, self._at = store, f"{prefix}{snapshot_id}/"
        keyed = read_ipc_bytes(store.get(f"{self._at}schema.arrow")).schema
        meta = dict(keyed.metadata or {})
        self.key = meta.pop(_KEY).decode()
        self.schema = keyed.with_metadata(meta or None)
        self._kept: OrderedDict[int, tuple[pa.Table, KeyIndex]] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0  # parts read from the store (what a test can watch)

    def part(self, p: int) -> pa.Table:
        """Part ``p``'s rows."""
        return self._held(p)[0]

    def _held(self, p: int) -> tuple[pa.Table, KeyIndex]:
        """Part ``p`` and its key's index (built once, let go with it: not the process's
        cache of whole tables' indexes, which would keep every part)."""
        with self._lock:
            held = self._kept.get(p)
            if held is not None:
                self._kept.move_to_end(p)
                return held
        table = read_ipc_bytes(self._store.get(f"{self._at}{p}.arrow"))
        held = (table, KeyIndex(key_values(table.column(self.key))))
        with self._lock:
            self.reads += 1
            self._kept[p] = held
            size = sum(t.nbytes for t, _ in self._kept.values())
            while len(self._kept) > 1 and size > KEPT_BYTES:
                size -= self._kept.popitem(last=False)[1][0].nbytes
        return held

    def join(self, events: pa.Table, lookup: Lookup) -> tuple[pa.Table, pa.Array]:
        """:func:`join_parts` of ``events`` with this snapshot."""
        return join_parts(events, lookup, self.n, self._held, self.schema)


__all__ = [
    "KEPT_BYTES",
    "WHOLE_BYTES",
    "Parts",
    "join_parts",
    "part_count",
    "parted",
    "parts_of",
    "split",
    "store_parts",
]
