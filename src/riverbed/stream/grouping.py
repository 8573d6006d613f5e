"""A batch's events grouped per (window, key) with numpy, and each group's metric
partials computed for all groups at once: what :func:`riverbed.stream.engine.
partials_of` builds its partials from (the engine keeps the cutting into windows and
sessions; this module, the grouping and the vectorized metrics)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from riverbed.stream.aggregation import Aggregation
from riverbed.stream.metrics import VALUE_METRICS, Count, Distinct, Max, Min, where_column

__all__ = [
    "Partial",
    "as_array",
    "by_window_and_key",
    "group_partials",
    "pane_partials",
    "run_firsts",
    "tagged",
]

Partial = tuple[int, str, dict[str, Any]]  # (window start ms, key, {metric: partial})


def pane_partials(
    spec: Aggregation,
    pdf: pd.DataFrame,
    ts: np.ndarray,
    codes: np.ndarray,
    names: np.ndarray,
    watermark_ms: int,
) -> list[Partial] | None:
    """``engine.partials_of`` of hopping and sliding windows through their panes
    (Flink's slices): events grouped per (hop-long pane, key) first — one row an event,
    not one per window it is in (q5: five) — then each pane group added to every open
    window that holds it. Exactly the per-window partials, for metrics that combine by a
    vectorized reduction: ``Count``, ``Min``/``Max`` of numbers (a float sum's order
    would change); None for any other spec."""
    window = spec.window
    size, hop = window.size_ms, window.hop_ms  # type: ignore[union-attr]
    columns: dict[str, np.ndarray] = {}  # only what the pane path reads, and only if it can
    for name, metric in spec.metrics.items():
        column = getattr(metric, "column", None)
        if isinstance(metric, Min | Max) and isinstance(column, str):
            if column not in columns:
                columns[column] = as_array(pdf[column])
            if columns[column].dtype.kind not in "iuf":
                return None
        elif not isinstance(metric, Count):
            return None
        if metric.where is not None:
            columns[where_column(name)] = as_array(pdf[where_column(name)])
    panes = (ts // hop) * hop  # = a pane's latest window's start (windows._hop_starts)
    alive = np.flatnonzero(panes + size > watermark_ms)  # in an open window at all
    if not len(alive):
        return []
    order = alive[by_window_and_key(panes[alive], codes[alive], len(names))]
    pane_of, code_of = panes[order], codes[order]
    firsts = run_firsts(pane_of, code_of)
    sizes = np.diff(np.append(firsts, len(order)))
    per_pane: dict[str, np.ndarray] = {}  # each metric's value per pane group
    for name, metric in spec.metrics.items():
        counts = _counted(columns[where_column(name)]) if metric.where is not None else None
        reduced = _reduced(metric, _column_of(metric, columns), counts, order, firsts, sizes)
        assert reduced is not None  # (checked above: a Count, or a Min or Max of numbers)
        per_pane[name] = reduced
    group_pane, group_code = pane_of[firsts], code_of[firsts]
    starts, groups = [], []  # one entry per (pane group, open window holding it)
    for i in range(size // hop):
        start = group_pane - i * hop
        open_ = np.flatnonzero(start + size > watermark_ms)
        starts.append(start[open_])
        groups.append(open_)
    starts_all, groups_all = np.concatenate(starts), np.concatenate(groups)
    key_codes = group_code[groups_all]
    order = by_window_and_key(starts_all, key_codes, len(names))
    starts_all, key_codes, groups_all = starts_all[order], key_codes[order], groups_all[order]
    firsts = run_firsts(starts_all, key_codes)
    out: list[dict[str, Any]] = [{} for _ in range(len(firsts))]
    for name, metric in spec.metrics.items():
        reduce = (
            np.add if isinstance(metric, Count) else np.fmin if isinstance(metric, Min) else np.fmax
        )
        merged = _as_partials(metric, reduce.reduceat(per_pane[name][groups_all], firsts))
        assert merged is not None
        for partials, value in zip(out, merged, strict=True):
            partials[name] = value
    return tagged(starts_all[firsts], key_codes[firsts], names, out)


def run_firsts(starts: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Where each run of rows with one (window start, key code) begins, the rows sorted
    by both (:func:`by_window_and_key`; at least one row): int64 row indices, 0 first."""
    cuts = np.flatnonzero((np.diff(starts) != 0) | (np.diff(codes) != 0)) + 1
    return np.concatenate([[0], cuts]).astype(np.int64)


def tagged(
    starts: np.ndarray, codes: np.ndarray, names: np.ndarray, values: list[dict[str, Any]]
) -> list[Partial]:
    """Each group's partials with its window (or session) start and its key as text
    (``names[code]``): the :data:`Partial` tuples, Python's ints and strings."""
    keys = names[codes].astype(str).tolist()
    return list(zip(starts.tolist(), keys, values, strict=True))


def by_window_and_key(starts: np.ndarray, codes: np.ndarray, n_codes: int) -> np.ndarray:
    """The order that sorts rows by window start, then key code: one argsort of a
    combined int64 (a two-key lexsort costs ~2x as much) while it cannot overflow."""
    if not len(starts):
        return np.arange(0)
    low = int(starts.min())
    span = int(starts.max()) - low + 1
    if span * max(n_codes, 1) >= 2**62:
        return np.lexsort((codes, starts))
    combined = (starts - low) * max(n_codes, 1) + codes
    return np.argsort(combined, kind="stable")


def as_array(column: pd.Series) -> np.ndarray:
    """A column as numpy's: a time zone's times as UTC datetime64 (pandas gives an
    object array of Timestamps, one Python object per event: 0.77 s of 2.1 for 914,000
    joined rows of Nexmark q9)."""
    if isinstance(column.dtype, pd.DatetimeTZDtype):
        column = column.dt.tz_convert("UTC").dt.tz_localize(None)
    out: np.ndarray = column.to_numpy()
    return out


def group_partials(
    spec: Aggregation, pdf: pd.DataFrame, ts: np.ndarray, rows: np.ndarray, bounds: list[int]
) -> list[dict[str, Any]]:
    """Every group's metric partials: group ``i`` is ``rows[bounds[i]:bounds[i + 1]]``
    (rows of ``pdf``). Counts, and the minimum and maximum of numbers, are computed for
    all groups at once (:func:`_reduced`), as are the metrics that pick one event
    (First/Last/ArgMax/ArgMin: ``group_partials``) and exact distinct counts of integer
    ids (``Distinct.group_partials``: each group's ids, cut from one array); the other
    metrics group by group."""
    columns = {c: as_array(pdf[c]) for c in spec.reads()[2:]}
    # a picked row may return the key or the time too (ArgMax([...], by=...)): only then
    # are they turned into arrays here (the key of the log-native path is categorical)
    returned = {c for m in spec.metrics.values() if isinstance(m, VALUE_METRICS) for c in m.columns}
    if spec.time in returned:
        columns[spec.time] = ts.astype("datetime64[ms]")
    if spec.key_column in returned and spec.key_column not in columns:
        columns[spec.key_column] = pdf[spec.key_column].to_numpy()
    firsts = np.asarray(bounds[:-1], dtype=np.int64)
    out: list[dict[str, Any]] = [{} for _ in range(len(firsts))]  # (not numpy scalars)
    for name, metric in spec.metrics.items():
        column = _column_of(metric, columns)
        # a metric's own where: the events it counts (NULL: not counted)
        counts = _counted(columns[where_column(name)]) if metric.where is not None else None
        reduced = _reduced(metric, column, counts, rows, firsts, np.diff(bounds))
        vector = _as_partials(metric, reduced)
        if vector is None and isinstance(metric, Distinct) and column is not None:
            vector = metric.group_partials(column, rows, bounds, counts)
        if vector is not None:
            for partials, value in zip(out, vector, strict=True):
                partials[name] = value
            continue
        if isinstance(metric, VALUE_METRICS):  # one event of each group: all at once
            # what First/Last (the event time) and ArgMax/ArgMin (a column) compare by
            by = ts if metric.by is None else columns[metric.by]
            chosen = metric.group_partials(column, by, rows, bounds, counts)
            for partials, value in zip(out, chosen, strict=True):
                partials[name] = value
            continue
        for partials, (a, b) in zip(out, itertools.pairwise(bounds), strict=True):
            picked = rows[a:b]
            mine = picked if counts is None else picked[counts[picked]]
            values = column[mine] if column is not None else None
            partials[name] = metric.partial(values, len(mine))
    return out


def _column_of(metric: Any, columns: dict[str, np.ndarray]) -> Any:
    """What a metric reads: its column's values; a row's columns (a list) for a metric
    that picks several; None for Count."""
    column = getattr(metric, "column", None)
    if column is None:
        return None
    if isinstance(column, tuple):
        return [columns[c] for c in column]
    return columns[column]


def _as_partials(metric: Any, found: np.ndarray | None) -> list[Any] | None:
    """:func:`_reduced`'s arrays as the partials ``partial`` gives group by group (a
    count as an int; a min of the group's non-NaN numbers as a float, None when there
    is none); None when the metric is not reduced that way."""
    if found is None:
        return None
    if isinstance(metric, Count):
        return found.tolist()  # type: ignore[no-any-return]
    return [None if v != v else v for v in found.tolist()]  # NaN: none counted


def _reduced(
    metric: Any,
    column: np.ndarray | None,
    counts: np.ndarray | None,
    rows: np.ndarray,
    firsts: np.ndarray,
    sizes: np.ndarray,
) -> np.ndarray | None:
    """Each group's ``Count`` (int64), or ``Min``/``Max`` of numbers (float64, NaN where
    no event of the group counted), reduced in one numpy call; None for other metrics.
    Group ``i`` is ``rows[firsts[i]:firsts[i] + sizes[i]]``."""
    if isinstance(metric, Count):
        if counts is None:
            return sizes
        return np.add.reduceat(counts[rows].astype(np.int64), firsts)
    if not isinstance(metric, Min | Max) or column is None or column.dtype.kind not in "iuf":
        return None
    values = column[rows].astype(np.float64)  # float(min(x)) == min(float(x)): monotonic
    if counts is not None:
        values[~counts[rows]] = np.nan
    reduce = np.fmin if isinstance(metric, Min) else np.fmax  # NaN (null) only if all are
    return reduce.reduceat(values, firsts)


def _counted(condition: np.ndarray) -> np.ndarray:
    """A metric's where column as booleans: true counts; false and NULL do not."""
    if condition.dtype == bool:
        return condition
    return np.array([v is True for v in condition], dtype=bool)
