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
    JOIN_ROWS,
    join_expiring,
    join_expiry_key,
    join_rows_key,
    split_join_expiry_key,
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
    watermark passed. The caller commits the store.

    Each (side, key) holds one list of events (``[time, partition, offset, matched,
    *columns]``), so the keys a batch pairs are one multi-get per side."""
    cols = {LEFT: list(columns[0]), RIGHT: list(columns[1])}
    outer = how == "left"
    new_keys = {LEFT: set(left[KEY].tolist()), RIGHT: set(right[KEY].tolist())}
    held: dict[tuple[bytes, str], list[list[Any]]] = {}
    _fetch(store, held, sorted(new_keys[LEFT] | new_keys[RIGHT]))
    old_right = _frame(held, RIGHT, new_keys[LEFT], cols[RIGHT])
    old_left = _frame(held, LEFT, new_keys[RIGHT], cols[LEFT])
    fresh = _pairs(rule, left, _concat([old_right, right[IDS + cols[RIGHT]]]))
    late_found = _pairs(rule, old_left, right)
    pairs = _concat([fresh, late_found])
    changed: set[tuple[bytes, str]] = set()
    unmatched: list[pd.DataFrame] = []
    matched_new = np.zeros(len(left), dtype=bool)
    if outer:
        if len(fresh):
            seen = set(zip(fresh["l" + PART].tolist(), fresh["l" + OFF].tolist(), strict=True))
            matched_new = np.fromiter(
                (ids in seen for ids in zip(left[PART].tolist(), left[OFF].tolist(), strict=True)),
                dtype=bool,
                count=len(left),
            )
        if len(late_found):  # buffered left events paired for the first time
            seen = set(
                zip(late_found["l" + PART].tolist(), late_found["l" + OFF].tolist(), strict=True)
            )
            for key in new_keys[RIGHT]:
                for event in held.get((LEFT, key), ()):
                    if not event[3] and (event[1], event[2]) in seen:
                        event[3] = True
                        changed.add((LEFT, key))
    for side, frame in ((LEFT, left), (RIGHT, right)):
        if not len(frame):
            continue
        ts = frame[TS].to_numpy(dtype=np.int64)
        expires = rule.expires(side, ts)
        kept = expires > watermark_ms
        values = list(zip(*(_values(frame[c]) for c in cols[side]), strict=True)) or [()] * len(
            frame
        )
        flags = matched_new.tolist() if side == LEFT else [False] * len(frame)
        rows = zip(
            frame[KEY].tolist(),
            ts.tolist(),
            frame[PART].tolist(),
            frame[OFF].tolist(),
            expires.tolist(),
            kept.tolist(),
            flags,
            values,
            strict=True,
        )
        for key, t, part, off, expiry, keep, flag, vals in rows:
            if keep:
                held.setdefault((side, key), []).append([t, part, off, flag, *vals])
                changed.add((side, key))
                store.put(join_expiry_key(side, expiry, t, part, off, key.encode()), b"")
        if side == LEFT and outer:  # dropped at once, never paired: emitted now
            gone = ~kept & ~matched_new
            if gone.any():
                unmatched.append(frame.loc[gone, IDS + cols[LEFT]])
    for side in (LEFT, RIGHT):
        lo, hi = join_expiring(side, watermark_ms)
        dropped: dict[str, set[tuple[int, int]]] = {}
        for entry, _ in store.scan(start=lo, end=hi):
            _, part, off, key = split_join_expiry_key(entry)
            dropped.setdefault(key.decode(), set()).add((part, off))
        if not dropped:
            continue
        _fetch(store, held, sorted(k for k in dropped if (side, k) not in held), (side,))
        alone = []
        for key, ids in dropped.items():
            events = held.get((side, key), [])
            if outer and side == LEFT:
                alone += [[key, *e[:3], *e[4:]] for e in events if (e[1], e[2]) in ids and not e[3]]
            held[side, key] = [e for e in events if (e[1], e[2]) not in ids]
            changed.add((side, key))
        if alone:
            unmatched.append(pd.DataFrame(alone, columns=IDS + cols[LEFT]))
        store.delete_range(lo, hi)
    for side, key in changed:
        where = join_rows_key(side, key.encode())
        if held[side, key]:
            store.put(where, msgpack.packb(held[side, key], use_bin_type=True))
        else:
            store.delete(where)
    alone_frame = _concat(unmatched) if unmatched else pd.DataFrame(columns=IDS + cols[LEFT])
    return Paired(pairs=pairs, unmatched=alone_frame.rename(columns=_left_ids))


def _fetch(
    store: Any,
    held: dict[tuple[bytes, str], list[list[Any]]],
    keys: list[str],
    sides: tuple[bytes, ...] = (b"L", b"R"),
) -> None:
    """The buffered events of ``keys`` on ``sides``, into ``held`` (one multi-get a side)."""
    for side in sides:
        blobs = store.get_many([join_rows_key(side, k.encode()) for k in keys])
        for key, blob in zip(keys, blobs, strict=True):
            if blob is not None:
                held[side, key] = msgpack.unpackb(blob, raw=False)


def _frame(
    held: dict[tuple[bytes, str], list[list[Any]]], side: bytes, keys: set[str], cols: list[str]
) -> pd.DataFrame:
    """The buffered events of ``side`` with one of ``keys``, as a frame (with their
    matched flags)."""
    rows = [[key, *e[:3], *e[4:], e[3]] for key in keys for e in held.get((side, key), ())]
    frame = pd.DataFrame(rows, columns=IDS + cols + [_MATCHED])
    for c in (TS, PART, OFF):
        frame[c] = frame[c].astype(np.int64)
    return frame


def _values(column: pd.Series) -> list[Any]:
    """A column's values as Python's (a null as None)."""
    if column.dtype == object or isinstance(column.dtype, pd.api.extensions.ExtensionDtype):
        return [_plain(v) for v in column.tolist()]
    plain: list[Any] = column.tolist()
    return plain


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


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def buffered_count(store: Any) -> dict[str, int]:
    """How many events each side holds in a state partition (``stream status``)."""
    out = {"left": 0, "right": 0}
    for k, v in store.scan(JOIN_ROWS):
        out["left" if k[1:2] == LEFT else "right"] += len(msgpack.unpackb(v, raw=False))
    return out


__all__ = ["IDS", "LEFT", "RIGHT", "Paired", "Rule", "buffered_count", "step"]
