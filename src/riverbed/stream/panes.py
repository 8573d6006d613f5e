"""Hopping and sliding windows held as panes (Flink's slices): state keeps one value
per (hop-long pane, key) — an event is in one pane, where it would be in ``size / hop``
windows — and a window's value is the merge of its panes' values, in pane order, made
when the window is emitted or read. The pane starting at ``p`` is in the windows
starting at ``p - (n - 1) * hop`` … ``p`` (``n = size / hop``); the last of them closes
at ``p + size``, so a pane expires exactly when the window that starts with it does,
and a pane's state key is a window's (:func:`riverbed.state.keys.window_key`).

Which layout an aggregation's state has is :attr:`Aggregation.pane_ms`, resolved at
start from its checkpoint (:func:`riverbed.stream.specrecord.layout`).

Pure: no I/O. :mod:`riverbed.stream.engine` reads the panes it needs from state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from riverbed.state.keys import split_window_keys_ms, window_keys
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.grouping import by_window_and_key, run_firsts
from riverbed.stream.metrics import Count, Max, Min

Merge = Callable[[list[dict[str, Any]], dict[str, Any] | None], dict[str, Any]]

__all__ = ["Windows", "holding", "panes_of", "window_columns", "windows"]


def _sizes(spec: Aggregation) -> tuple[int, int]:
    hop = spec.pane_ms
    assert hop, f"{spec.name}: state holds windows, not panes"
    return spec.window.size_ms, hop  # type: ignore[union-attr]


@dataclass(frozen=True)
class Windows:
    """Windows as columns, sorted by start, then key: what :func:`windows` makes in
    numpy, ready for result rows (riverbed.stream.rows) without a value per window."""

    starts: np.ndarray  # int64, epoch ms
    keys: list[bytes]
    values: dict[str, list[Any]]  # per metric, each window's value

    def __len__(self) -> int:
        return len(self.keys)

    def as_dict(self) -> dict[bytes, dict[str, Any]]:
        """Each window's value under its state key."""
        names = window_keys(self.starts.tolist(), self.keys)
        columns = list(self.values.items())
        return {k: {n: column[i] for n, column in columns} for i, k in enumerate(names)}


def windows(
    spec: Aggregation,
    panes: Mapping[bytes, dict[str, Any]],
    merge: Merge,
    keep: Callable[[np.ndarray], np.ndarray],
) -> dict[bytes, dict[str, Any]]:
    """The windows the given panes (state key → value) make, under their state keys:
    those whose start ``keep(starts)`` (a boolean mask) admits. A window's value is the
    merge of its panes' values in pane order; the caller passes every pane of each
    window it keeps (a missing one is a pane with no events)."""
    made = window_columns(spec, panes, merge, keep)
    return made.as_dict() if isinstance(made, Windows) else made


def window_columns(
    spec: Aggregation,
    panes: Mapping[bytes, dict[str, Any]],
    merge: Merge,
    keep: Callable[[np.ndarray], np.ndarray],
) -> dict[bytes, dict[str, Any]] | Windows:
    """:func:`windows`, as :class:`Windows` when numpy made them (every metric a
    ``Count``, or a ``Min`` or ``Max`` of numbers)."""
    if not panes:
        return {}
    size, hop = _sizes(spec)
    given = sorted(panes)  # (by pane start, then key: each window's panes in order)
    starts, key_bytes = split_window_keys_ms(given)
    values = [panes[k] for k in given]
    window_starts, rows = [], []
    for i in range(size // hop):
        start = starts - i * hop
        kept = np.flatnonzero(keep(start) & (start >= 0))
        window_starts.append(start[kept])
        rows.append(kept)
    at, row = np.concatenate(window_starts), np.concatenate(rows)
    if not len(at):
        return {}
    fast = _reduced(spec, values, at, row, key_bytes)
    if fast is not None:
        return fast
    order = np.argsort(row, kind="stable")  # pane order within each window
    at, row = at[order], row[order]
    names = window_keys(at.tolist(), [key_bytes[i] for i in row.tolist()])
    found: dict[bytes, list[dict[str, Any]]] = {}
    for k, r in zip(names, row.tolist(), strict=True):
        if k in found:
            found[k].append(values[r])
        else:
            found[k] = [values[r]]
    return {k: merge(parts, None) for k, parts in sorted(found.items())}


def _reduced(
    spec: Aggregation,
    values: list[dict[str, Any]],
    at: np.ndarray,
    row: np.ndarray,
    key_bytes: list[bytes],
) -> Windows | None:
    """:func:`windows` in numpy, when every metric is a ``Count``, or a ``Min``/``Max``
    whose panes all hold numbers: window ``at[i]`` holds pane ``row[i]``. None for
    other specs."""
    reduce: dict[str, Any] = {}
    for name, metric in spec.metrics.items():
        if isinstance(metric, Count):
            reduce[name] = np.add
        elif isinstance(metric, Min | Max):
            reduce[name] = np.fmin if isinstance(metric, Min) else np.fmax  # (NaN: none)
        else:
            return None
    columns = {}
    for name in reduce:
        column = np.array([v[name] for v in values])
        if column.dtype.kind not in "iuf":  # (a None: no event of a pane counted)
            return None
        columns[name] = column
    # (codes in the keys' byte order: windows sorted by start, then code, are sorted as
    # their state keys are)
    codes, _ = pd.factorize(np.array(key_bytes, dtype=object), sort=True)
    order = by_window_and_key(at, codes[row], int(codes.max()) + 1)
    at, row = at[order], row[order]
    firsts = run_firsts(at, codes[row])
    merged = {name: reduce[name].reduceat(columns[name][row], firsts).tolist() for name in reduce}
    return Windows(at[firsts], [key_bytes[i] for i in row[firsts].tolist()], merged)


def holding(spec: Aggregation, changed: Iterable[bytes], open_from: int) -> set[bytes]:
    """The open windows (start ``>= open_from``; state keys) that hold one of the
    ``changed`` panes (state keys): what an ``update`` batch emits."""
    size, hop = _sizes(spec)
    changed = list(changed)
    if not changed:
        return set()
    starts, key_bytes = split_window_keys_ms(changed)
    out: set[bytes] = set()
    for i in range(size // hop):
        start = starts - i * hop
        kept = np.flatnonzero(start >= open_from)
        out.update(window_keys(start[kept].tolist(), [key_bytes[j] for j in kept.tolist()]))
    return out


def panes_of(spec: Aggregation, wanted: Iterable[bytes]) -> list[bytes]:
    """Every pane (state key) of the given windows (state keys), sorted."""
    size, hop = _sizes(spec)
    wanted = list(wanted)
    if not wanted:
        return []
    starts, key_bytes = split_window_keys_ms(wanted)
    out: set[bytes] = set()
    for i in range(size // hop):
        out.update(window_keys((starts + i * hop).tolist(), key_bytes))
    return sorted(out)
