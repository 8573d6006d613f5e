"""Which events of two streams pair up, batch by batch, with each side's events buffered
in a state partition until no partner can arrive (the pure core of a stream-stream
:class:`~riverbed.stream.joins.Join`; its I/O: :mod:`riverbed.stream.streamjoin`).

A pair (left *l*, right *r*) with the same key matches when

* **window**: both times fall in the same tumbling window of ``window_ms``;
* **interval**: ``lower_ms <= r.time - l.time <= upper_ms`` — and, with ``until`` (a
  time column of the left events, say an auction's ``expires``), ``r.time <= l.until``
  (no partner when it is NULL). ``upper_ms`` still bounds how long a left event is
  kept, so a left event is kept as without ``until``: its unmatched row comes when the
  watermark passes ``l.time + upper``.

Each batch *b* has a watermark *W* (recorded in its plan, never decreasing). An event is
**late** when it can no longer be paired exactly — its window is closed (``end <= W``;
window joins) or its time is before *W* (interval joins) — and is set aside, not joined.
Every other event is paired with the buffered events of the other side and with the
other side's events of the same batch, then buffered itself until the watermark reaches
the last time a partner could still come (:meth:`Rule.expires`): the end of its window;
``l.time + upper + 1`` for a left event (every later right event has time >= W);
``r.time - lower + 1`` for a right one. So every pair of on-time events is found exactly
once — by the batch of whichever came second, the other being still buffered — and the
state holds only what the watermark has not passed. With ``how="left"``, a left event
that was never paired is emitted once, with nulls, when it is dropped: no right event
that arrives afterwards is on time and could match it.

**State.** A batch's buffered events of a side in a state partition are one immutable
Arrow segment (:mod:`riverbed.state.keys`), keyed by the latest expiry among them: the
watermark drops whole segments, with one range delete. An event whose expiry the
watermark passed may stay in its segment a while: it cannot pair with anything on time
any more (an on-time right event has time >= W; see :meth:`Rule.expires`), and the
unmatched left events due are those with ``W_prev < expiry <= W`` (``W_prev`` stored
with the state), so each is emitted once. A left segment's paired rows are recorded per
batch beside it (a segment is never rewritten). Pairing is Arrow's hash join of the
batch's events with the other side's live segments, then the rule's time filter: no
per-event Python.

The result over any sequence of batches is the batch join of the on-time events
(``tests/stream/test_pairing.py`` checks it against pandas with Hypothesis).
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.arrowbytes import ipc_bytes, read_ipc_bytes
from riverbed.state.keys import (
    JOIN_EXPIRY,
    JOIN_MATCHED,
    JOIN_ROWS,
    JOIN_SEGMENTS,
    JOIN_WATERMARK,
    join_matched_key,
    join_matched_until,
    join_segment_data_key,
    join_segment_key,
    join_segments_until,
    split_join_segment_key,
)
from riverbed.state.store import prefix_end

LEFT, RIGHT = b"L", b"R"
# the columns every side's frame carries besides its own (its values: l.<name> / r.<name>)
KEY, TS, PART, OFF = "_key", "_ts", "_part", "_off"
IDS = [KEY, TS, PART, OFF]
_ID_TYPES = {KEY: pa.string(), TS: pa.int64(), PART: pa.int64(), OFF: pa.int64()}
_MIGRATED, _BATCH = 0, 1  # the n of a segment's key: rewritten from format 1 / a batch's
_W = struct.Struct(">q")
NO_TIME = np.iinfo(np.int64).min  # a left event's missing ``until``: no partner


@dataclass(frozen=True)
class Rule:
    """When a left and a right event's times pair them (see the module doc)."""

    window_ms: int | None = None
    lower_ms: int = 0
    upper_ms: int = 0
    until: str | None = None  # the left events' column bounding their partners' times

    @classmethod
    def of(cls, join: Any, until: str | None = None) -> Rule:
        """The rule of a :class:`~riverbed.stream.joins.Join` (``until``: its ``until``
        column's name as the left events carry it)."""
        lower, upper = join.bounds_ms
        return cls(window_ms=join.window_ms, lower_ms=lower, upper_ms=upper, until=until)

    def matches(
        self, left_ts: np.ndarray, right_ts: np.ndarray, until: np.ndarray | None = None
    ) -> np.ndarray:
        """Which (left, right) times pair; ``until``: the left events' ``until`` values
        in ms (:data:`NO_TIME` for none), for a rule with one."""
        if self.window_ms is not None:
            result: np.ndarray = left_ts // self.window_ms == right_ts // self.window_ms
            return result
        gap = right_ts - left_ts
        inside: np.ndarray = (gap >= self.lower_ms) & (gap <= self.upper_ms)
        if self.until is not None:
            assert until is not None
            inside &= (until != NO_TIME) & (right_ts <= until)
        return inside

    def until_ms(self, events: pa.Table) -> np.ndarray | None:
        """The ``until`` values of a left side's events (ms; :data:`NO_TIME` for none)."""
        if self.until is None:
            return None
        column = events.column(self.until).cast(pa.int64())
        out: np.ndarray = column.fill_null(NO_TIME).to_numpy()
        return out

    def window_start(self, ts: np.ndarray) -> np.ndarray:
        assert self.window_ms is not None
        out: np.ndarray = ts // self.window_ms * self.window_ms
        return out

    def late(self, ts: np.ndarray, watermark_ms: int) -> np.ndarray:
        """Which events of a batch with watermark ``watermark_ms`` are late."""
        if self.window_ms is not None:
            closed: np.ndarray = self.window_start(ts) + self.window_ms <= watermark_ms
            return closed
        before: np.ndarray = ts < watermark_ms
        return before

    def earliest(self, which: str, previous_ms: int) -> int:
        """The least time of side ``which`` ("left"/"right") in any row a batch emits
        when the batch before it ran with watermark ``previous_ms`` (or any later batch:
        the watermark never goes back) — what an aggregation over the join's rows may
        take for its watermark (:mod:`riverbed.stream.joinedagg`).

        A pair is emitted by the batch its second event arrives in, and an unmatched
        left event by the batch whose watermark passes it; either way each event was on
        time when it came and still in state after the batch before. A window join's:
        in the window ``previous_ms`` is in, or a later one. An interval join's left
        event: at least ``previous_ms - upper`` (one still buffered then; one arriving
        later is not before the watermark); a right event: ``lower`` or more after its
        partner, and at least ``previous_ms + lower`` (buffered) or ``previous_ms``."""
        if self.window_ms is not None:
            return previous_ms // self.window_ms * self.window_ms
        left = previous_ms - max(self.upper_ms, 0)
        if which == "left":
            return left
        return max(left + self.lower_ms, previous_ms + min(self.lower_ms, 0))

    def expires(self, side: bytes, ts: np.ndarray) -> np.ndarray:
        """The watermark at which a buffered event of ``side`` is dropped."""
        if self.window_ms is not None:
            return self.window_start(ts) + self.window_ms
        if side == LEFT:
            out: np.ndarray = ts + self.upper_ms + 1
            return out
        out = ts - self.lower_ms + 1
        return out


@dataclass
class Paired:
    """What one batch of one state partition emits (Arrow tables): ``pairs`` (the ids
    of both events — ``_key``, ``_ts``/``_part``/``_off`` of each side, prefixed ``l`` /
    ``r`` — and their columns) and, for a left join, the left events dropped
    ``unmatched`` (the left ids prefixed ``l``, the left columns)."""

    pairs: pa.Table
    unmatched: pa.Table


@dataclass
class _Segment:
    id: bytes  # its index entry's key less the prefix and side
    max_expiry: int
    name: bytes  # where its events are (join_segment_data_key)
    events: pa.Table


class _Decoded:
    """Segments' events decoded in this process, by name (a segment is written once and
    never changed; names are random: one never names another segment's events), least
    recently used first out past :data:`CACHE_BYTES`."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._tables: OrderedDict[bytes, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, name: bytes) -> pa.Table | None:
        with self._lock:
            table = self._tables.get(name)
            if table is not None:
                self._tables.move_to_end(name)
            return table

    def put(self, name: bytes, table: pa.Table) -> None:
        with self._lock:
            if name in self._tables:
                return
            self._tables[name] = table
            self._bytes += table.nbytes
            while self._bytes > self.budget and self._tables:
                _, old = self._tables.popitem(last=False)
                self._bytes -= old.nbytes

    def drop(self, name: bytes) -> None:
        with self._lock:
            table = self._tables.pop(name, None)
            if table is not None:
                self._bytes -= table.nbytes


CACHE_BYTES = 256 * 2**20  # decoded segments a process keeps (the pair tasks' reads)
_CACHE = _Decoded(CACHE_BYTES)


def _decoded(store: Any, name: bytes) -> pa.Table:
    table = _CACHE.get(name)
    if table is None:
        blob = store.get(join_segment_data_key(name))
        if blob is None:
            raise KeyError(f"join state: segment {name.hex()} is indexed but has no events")
        table = read_ipc_bytes(blob)
        _CACHE.put(name, table)
    return table


def step(
    store: Any,
    rule: Rule,
    how: str,
    left: pd.DataFrame | pa.Table,
    right: pd.DataFrame | pa.Table,
    watermark_ms: int,
    columns: tuple[Sequence[str], Sequence[str]],
) -> Paired:
    """Pair one batch's on-time events of a state partition (``left``, ``right``: the
    :data:`IDS` columns and the sides' ``columns``, times in ms, keys as text; Arrow
    tables, or pandas frames :func:`as_events` converts) with
    each other and with the buffered ones in ``store`` (an open state store loaded at
    the batch's version), buffer them, and drop (emitting unmatched left events for
    ``how="left"``) what the watermark passed. The caller commits the store."""
    cols = {LEFT: list(columns[0]), RIGHT: list(columns[1])}
    outer = how == "left"
    batch = int(store.version or 0)
    w = watermark_ms
    blob = store.get(JOIN_WATERMARK)
    w_prev = _W.unpack(blob)[0] if blob is not None else None
    live = {side: _segments(store, side) for side in (LEFT, RIGHT)}
    if next(iter(store.scan(JOIN_ROWS)), None) is not None:  # format 1, rewritten once
        _migrate(store, rule, cols, live, batch)
    new = {LEFT: as_events(left, cols[LEFT]), RIGHT: as_events(right, cols[RIGHT])}
    old = {side: _concat([s.events for s in live[side]], new[side].schema) for side in new}
    # where each buffered left segment starts in old[LEFT]
    starts = np.cumsum([0, *(s.events.num_rows for s in live[LEFT])])

    # every pair with one event of this batch: new left x (old + new right), old left x new right
    right_all = _concat([old[RIGHT], new[RIGHT]], new[RIGHT].schema)
    li, ri = _pairs(rule, new[LEFT], right_all)
    oli, ori = _pairs(rule, old[LEFT], new[RIGHT])
    fresh = _joined(new[LEFT], li, right_all, ri, cols)
    pairs = _concat([fresh, _joined(old[LEFT], oli, new[RIGHT], ori, cols)], None)

    unmatched: list[pa.Table] = []
    paired_now = np.zeros(new[LEFT].num_rows, dtype=bool)
    paired_now[li] = True
    owner = np.searchsorted(starts[1:], oli, side="right")  # each old[LEFT] pair's segment
    if outer and live[LEFT]:  # buffered left events due now and never paired
        for i, segment in enumerate(live[LEFT]):
            expiry = rule.expires(LEFT, _times(segment.events))
            due = expiry <= w if w_prev is None else (expiry > w_prev) & (expiry <= w)
            if not due.any():
                continue
            due[_paired_rows(store, segment)] = False
            due[oli[owner == i] - starts[i]] = False
            if due.any():
                unmatched.append(segment.events.filter(pa.array(due)))

    # buffer this batch's events a partner can still reach
    for side in (LEFT, RIGHT):
        events = new[side]
        if not events.num_rows:
            continue
        expiry = rule.expires(side, _times(events))
        kept = expiry > w
        if side == LEFT and outer:  # dropped at once, never paired: emitted now
            gone = ~kept & ~paired_now
            if gone.any():
                unmatched.append(events.filter(pa.array(gone)))
        if not kept.any():
            continue
        latest = int(expiry[kept].max())
        buffered = events if kept.all() else events.filter(pa.array(kept))
        key = _buffer(store, side, latest, batch, _BATCH, buffered)
        if side == LEFT and outer and paired_now[kept].any():
            rows = np.flatnonzero(paired_now[kept])
            store.put(join_matched_key(key[2:], batch), rows.astype(np.int32).tobytes())
    if outer and len(oli):  # buffered left events paired for the first time by this batch
        for i in np.unique(owner).tolist():
            segment = live[LEFT][i]
            if segment.max_expiry > w:
                rows = np.unique(oli[owner == i] - starts[i]).astype(np.int32)
                store.put(join_matched_key(segment.id, batch), rows.tobytes())
    # drop what the watermark passed, whole segments at a time
    for side in (LEFT, RIGHT):
        passed = [s for s in live[side] if s.max_expiry <= w]
        if passed:
            store.delete_range(*join_segments_until(side, w))
        for segment in passed:
            store.delete(join_segment_data_key(segment.name))
            _CACHE.drop(segment.name)
    if outer and any(s.max_expiry <= w for s in live[LEFT]):
        store.delete_range(*join_matched_until(w))
    store.put(JOIN_WATERMARK, _W.pack(w))

    alone = _concat(unmatched, new[LEFT].schema)
    if not pairs.num_rows:
        pairs = _pair_schema(new[LEFT].schema, new[RIGHT].schema, cols).empty_table()
    left_ids = [("l" + c if c in (TS, PART, OFF) else c) for c in alone.column_names]
    return Paired(pairs=pairs, unmatched=alone.rename_columns(left_ids))


def _segments(store: Any, side: bytes) -> list[_Segment]:
    """``side``'s live segments, oldest expiry first, with their events (this process's
    decoded ones when it has them, else read from the state)."""
    out = []
    for key, name in store.scan(JOIN_SEGMENTS + side):
        max_expiry, segment = split_join_segment_key(key)
        out.append(_Segment(segment, max_expiry, name, _decoded(store, name)))
    return out


def _buffer(
    store: Any, side: bytes, max_expiry: int, batch: int, n: int, events: pa.Table
) -> bytes:
    """A new segment of ``events``: its events under a new name, its index entry; kept
    decoded. Returns its index entry's key."""
    name = os.urandom(16)
    key = join_segment_key(side, max_expiry, batch, n)
    store.put(join_segment_data_key(name), ipc_bytes(events))
    store.put(key, name)
    _CACHE.put(name, events)
    return key


def _paired_rows(store: Any, segment: _Segment) -> np.ndarray:
    """The rows of a left segment some earlier batch paired."""
    prefix = JOIN_MATCHED + segment.id
    found = [np.frombuffer(v, dtype=np.int32) for _, v in store.scan(prefix)]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int32)


def as_events(events: pd.DataFrame | pa.Table, cols: Sequence[str]) -> pa.Table:
    """A side's events as :func:`step` keeps them: an Arrow table of the :data:`IDS`
    (typed) and ``cols`` (as they come)."""
    if isinstance(events, pa.Table):
        arrays = [events.column(c).cast(_ID_TYPES[c]) for c in IDS]
        arrays += [events.column(c) for c in cols]
    else:
        arrays = [pa.array(events[c].to_numpy(dtype=object) if c == KEY else events[c],
                           _ID_TYPES[c], from_pandas=True) for c in IDS]  # fmt: skip
        arrays += [pa.array(events[c], from_pandas=True) for c in cols]
    return pa.Table.from_arrays(arrays, names=IDS + list(cols))


def no_events(cols: Sequence[str]) -> pa.Table:
    """A side's events when a batch has none."""
    fields = [pa.field(c, _ID_TYPES[c]) for c in IDS] + [pa.field(c, pa.null()) for c in cols]
    return pa.schema(fields).empty_table()


def _times(events: pa.Table) -> np.ndarray:
    times: np.ndarray = events.column(TS).to_numpy()
    return times


def _concat(tables: list[pa.Table], schema: pa.Schema | None) -> pa.Table:
    """Tables one under the other (a column all nulls in one takes the others' type)."""
    full = [t for t in tables if t.num_rows]
    if not full:
        return schema.empty_table() if schema is not None else tables[0]
    if len(full) == 1:
        return full[0]
    return pa.concat_tables(full, promote_options="permissive")


def _pairs(rule: Rule, left: pa.Table, right: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The row numbers of every matching (left, right) pair of two tables, same key."""
    none = np.zeros(0, dtype=np.int64)
    if not left.num_rows or not right.num_rows:
        return none, none
    a = pa.table({KEY: left.column(KEY), "_l": pa.array(np.arange(left.num_rows))})
    b = pa.table({KEY: right.column(KEY), "_r": pa.array(np.arange(right.num_rows))})
    both = a.join(b, keys=KEY, join_type="inner")
    if not both.num_rows:
        return none, none
    li, ri = both.column("_l").to_numpy(), both.column("_r").to_numpy()
    until = rule.until_ms(left)
    keep = rule.matches(_times(left)[li], _times(right)[ri], None if until is None else until[li])
    return li[keep], ri[keep]


def _joined(
    left: pa.Table, li: np.ndarray, right: pa.Table, ri: np.ndarray, cols: dict[bytes, list[str]]
) -> pa.Table:
    """The pairs' rows: the key, each side's ids (prefixed) and columns."""
    lt, rt = left.take(pa.array(li)), right.take(pa.array(ri))
    arrays = [lt.column(KEY)]
    names = [KEY]
    for prefix, t, side in (("l", lt, LEFT), ("r", rt, RIGHT)):
        arrays += [t.column(c) for c in (TS, PART, OFF)]
        names += [prefix + c for c in (TS, PART, OFF)]
        arrays += [t.column(c) for c in cols[side]]
        names += cols[side]
    return pa.Table.from_arrays(arrays, names=names)


def _pair_schema(left: pa.Schema, right: pa.Schema, cols: dict[bytes, list[str]]) -> pa.Schema:
    fields = [left.field(KEY)]
    for prefix, schema, side in (("l", left, LEFT), ("r", right, RIGHT)):
        fields += [schema.field(c).with_name(prefix + c) for c in (TS, PART, OFF)]
        fields += [schema.field(c) for c in cols[side]]
    return pa.schema(fields)


def _migrate(
    store: Any, rule: Rule, cols: dict[bytes, list[str]], live: dict[bytes, list[_Segment]],
    batch: int,
) -> None:  # fmt: skip
    """Rewrite a partition's join state of format 1 (a msgpack list of events per side
    and key, an index entry per event) as one segment a side, in this batch's version:
    a crash before the commit leaves format 1, read again by the re-run."""
    rows: dict[bytes, list[list[Any]]] = {LEFT: [], RIGHT: []}
    for key, value in store.scan(JOIN_ROWS):
        side, user_key = key[1:2], key[2:].decode()
        rows[side] += [[user_key, *e] for e in msgpack.unpackb(value, raw=False)]
    for side, events in rows.items():
        if not events:
            continue
        frame = pd.DataFrame(events, columns=[*IDS, "\x00matched", *cols[side]])
        table = as_events(frame, cols[side])
        latest = int(rule.expires(side, _times(table)).max())
        key = _buffer(store, side, latest, batch, _MIGRATED, table)
        matched = np.flatnonzero(frame["\x00matched"].to_numpy(dtype=bool))
        if side == LEFT and len(matched):
            store.put(join_matched_key(key[2:], batch), matched.astype(np.int32).tobytes())
        segment = _Segment(key[2:], latest, store.get(key), table)
        live[side] = sorted([*live[side], segment], key=lambda s: s.id)
    for prefix in (JOIN_ROWS, JOIN_EXPIRY):
        store.delete_range(prefix, prefix_end(prefix) or prefix + b"\xff")


def buffered_count(store: Any, rule: Rule) -> dict[str, int]:
    """How many events each side holds in a state partition that a partner can still
    reach (``stream status``): the watermark has not passed them. (Its segments may
    hold a few more, those it passed, until it passes their last.)"""
    blob = store.get(JOIN_WATERMARK)
    w = _W.unpack(blob)[0] if blob is not None else None
    out = {}
    for side, name in ((LEFT, "left"), (RIGHT, "right")):
        out[name] = sum(
            int((rule.expires(side, _times(s.events)) > w).sum()) if w is not None
            else s.events.num_rows
            for s in _segments(store, side)
        )  # fmt: skip
    return out


__all__ = [
    "IDS",
    "LEFT",
    "RIGHT",
    "Paired",
    "Rule",
    "as_events",
    "buffered_count",
    "no_events",
    "step",
]
