"""Which events of two streams pair up, batch by batch, with each side's events buffered
in a state partition until no partner can arrive (the pure core of a stream-stream
:class:`~riverbed.stream.joins.Join`; its I/O: :mod:`riverbed.stream.streamjoin`).

A pair (left *l*, right *r*) with the same key matches when

* **window**: both times fall in the same tumbling window of ``window_ms``;
* **interval**: ``lower_ms <= r.time - l.time <= upper_ms``.

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

The result over any sequence of batches is the batch join of the on-time events
(``tests/stream/test_pairing.py`` checks it against pandas with Hypothesis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pandas as pd

from riverbed.state.keys import (
    join_expiring,
    join_expiry_key,
    join_key_prefix,
    join_row_key,
    join_row_of,
    split_join_row_key,
)

LEFT, RIGHT = b"L", b"R"
# the columns every side's frame carries besides its own (its values: l.<name> / r.<name>)
KEY, TS, PART, OFF = "_key", "_ts", "_part", "_off"
IDS = [KEY, TS, PART, OFF]
_MATCHED = "_m"


@dataclass(frozen=True)
class Rule:
    """When a left and a right event's times pair them (see the module doc)."""

    window_ms: int | None = None
    lower_ms: int = 0
    upper_ms: int = 0

    @classmethod
    def of(cls, join: Any) -> Rule:
        """The rule of a :class:`~riverbed.stream.joins.Join`."""
        lower, upper = join.bounds_ms
        return cls(window_ms=join.window_ms, lower_ms=lower, upper_ms=upper)

    def matches(self, left_ts: np.ndarray, right_ts: np.ndarray) -> np.ndarray:
        if self.window_ms is not None:
            result: np.ndarray = left_ts // self.window_ms == right_ts // self.window_ms
            return result
        gap = right_ts - left_ts
        inside: np.ndarray = (gap >= self.lower_ms) & (gap <= self.upper_ms)
        return inside

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
    """What one batch of one state partition emits: ``pairs`` (the ids of both events —
    ``_key``, ``_ts``/``_part``/``_off`` of each side, prefixed ``l`` / ``r`` — and
    their columns) and, for a left join, the left events dropped ``unmatched``."""

    pairs: pd.DataFrame
    unmatched: pd.DataFrame


def step(
    store: Any,
    rule: Rule,
    how: str,
    left: pd.DataFrame,
    right: pd.DataFrame,
    watermark_ms: int,
    columns: tuple[Sequence[str], Sequence[str]],
) -> Paired:
    """Pair one batch's on-time events of a state partition (``left``, ``right``: the
    :data:`IDS` columns and the sides' ``columns``, times in ms, keys as text) with
    each other and with the buffered ones in ``store`` (an open state store), buffer
    them, and drop (emitting unmatched left events for ``how="left"``) what the
    watermark passed. The caller commits the store."""
    lcols, rcols = list(columns[0]), list(columns[1])
    outer = how == "left"
    old_right = _buffered(store, RIGHT, left[KEY].unique(), rcols)
    old_left = _buffered(store, LEFT, right[KEY].unique(), lcols)
    fresh = _pairs(rule, left, _concat([old_right, right[IDS + rcols]]))
    late_found = _pairs(rule, old_left, right)
    pairs = _concat([fresh, late_found])
    unmatched: list[pd.DataFrame] = []
    matched_new = np.zeros(len(left), dtype=bool)
    if outer:
        if len(fresh):
            seen = set(zip(fresh["l" + PART], fresh["l" + OFF], strict=True))
            matched_new = np.fromiter(
                ((p, o) in seen for p, o in zip(left[PART], left[OFF], strict=True)),
                dtype=bool,
                count=len(left),
            )
        if len(late_found):  # buffered left events paired for the first time
            first = old_left[~old_left[_MATCHED].astype(bool)]
            seen = set(zip(late_found["l" + PART], late_found["l" + OFF], strict=True))
            for row in first.itertuples(index=False):
                got = dict(zip(first.columns, row, strict=True))
                if (got[PART], got[OFF]) in seen:
                    _put(store, LEFT, got, lcols, True, None)
    for side, frame, cols in ((LEFT, left, lcols), (RIGHT, right, rcols)):
        if not len(frame):
            continue
        expires = rule.expires(side, frame[TS].to_numpy(dtype=np.int64))
        kept = expires > watermark_ms
        for at, row in enumerate(frame.itertuples(index=False)):
            got = dict(zip(frame.columns, row, strict=True))
            if kept[at]:
                matched = bool(matched_new[at]) if side == LEFT else False
                _put(store, side, got, cols, matched, int(expires[at]))
        if side == LEFT and outer:  # dropped at once, never paired: emitted now
            gone = ~kept & ~matched_new
            if gone.any():
                unmatched.append(frame.loc[gone, IDS + lcols])
    for side, cols in ((LEFT, lcols), (RIGHT, rcols)):
        lo, hi = join_expiring(side, watermark_ms)
        entries = [k for k, _ in store.scan(start=lo, end=hi)]
        if not entries:
            continue
        rows = [join_row_of(k) for k in entries]
        if side == LEFT and outer:
            values = store.get_many(rows)
            alone = [
                _decoded(k, v, cols)
                for k, v in zip(rows, values, strict=True)
                if v is not None and not msgpack.unpackb(v, raw=False).get("m")
            ]
            if alone:
                unmatched.append(pd.DataFrame(alone, columns=IDS + cols + [_MATCHED])[IDS + cols])
        for k in rows:
            store.delete(k)
        store.delete_range(lo, hi)
    alone_frame = (
        pd.concat(unmatched, ignore_index=True) if unmatched else pd.DataFrame(columns=IDS + lcols)
    )
    return Paired(pairs=pairs, unmatched=alone_frame.rename(columns=_left_ids))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Frames one under the other (the empty ones left out: their columns' types
    would not decide the result's)."""
    full = [f for f in frames if len(f)]
    if not full:
        return frames[0]
    return full[0] if len(full) == 1 else pd.concat(full, ignore_index=True)


def _left_ids(name: str) -> str:
    return "l" + name if name in (TS, PART, OFF) else name


def _pairs(rule: Rule, left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """Every matching (left, right) pair of two frames with the same key."""
    lf = left.drop(columns=[_MATCHED], errors="ignore").rename(
        columns={TS: "l" + TS, PART: "l" + PART, OFF: "l" + OFF}
    )
    rf = right.drop(columns=[_MATCHED], errors="ignore").rename(
        columns={TS: "r" + TS, PART: "r" + PART, OFF: "r" + OFF}
    )
    if not len(lf) or not len(rf):
        return pd.DataFrame(columns=list(dict.fromkeys([*lf.columns, *rf.columns])))
    both = lf.merge(rf, on=KEY, how="inner")
    keep = rule.matches(
        both["l" + TS].to_numpy(dtype=np.int64), both["r" + TS].to_numpy(dtype=np.int64)
    )
    return both.loc[keep].reset_index(drop=True)


def _put(
    store: Any,
    side: bytes,
    row: dict[str, Any],
    cols: list[str],
    matched: bool,
    expires: int | None,
) -> None:
    """Buffer one event (``expires``: its index entry's time; None: it has one already)."""
    key = join_row_key(side, str(row[KEY]).encode(), int(row[TS]), int(row[PART]), int(row[OFF]))
    value: dict[str, Any] = {"v": [_plain(row[c]) for c in cols]}
    if matched:
        value["m"] = True
    store.put(key, msgpack.packb(value, use_bin_type=True))
    if expires is not None:
        store.put(join_expiry_key(expires, key), b"")


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def _decoded(row_key: bytes, value: bytes, cols: list[str]) -> list[Any]:
    _, key, ts, part, off = split_join_row_key(row_key)
    got = msgpack.unpackb(value, raw=False)
    return [key.decode(), ts, part, off, *got["v"], bool(got.get("m"))]


def _buffered(store: Any, side: bytes, keys: Any, cols: list[str]) -> pd.DataFrame:
    """The buffered events of ``side`` with one of ``keys``."""
    rows = [
        _decoded(k, v, cols)
        for key in sorted(str(k) for k in keys)
        for k, v in store.scan(join_key_prefix(side, key.encode()))
    ]
    frame = pd.DataFrame(rows, columns=IDS + cols + [_MATCHED])
    for c in (TS, PART, OFF):
        frame[c] = frame[c].astype(np.int64)
    return frame


def buffered_count(store: Any) -> dict[str, int]:
    """How many events each side holds in a state partition (``stream status``)."""
    from riverbed.state.keys import JOIN_ROWS

    out = {"left": 0, "right": 0}
    for k, _ in store.scan(JOIN_ROWS):
        out["left" if k[1:2] == LEFT else "right"] += 1
    return out


__all__ = ["IDS", "LEFT", "RIGHT", "Paired", "Rule", "buffered_count", "step"]
