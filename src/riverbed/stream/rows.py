"""Emitted windows and sessions as result rows, column by column: what a state
partition's merge (:mod:`riverbed.stream.engine`) returns for its batch, and what
``read_live`` answers from a partition's state (:func:`rows_from_state`)."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pandas as pd

from riverbed.state.keys import (
    SESSIONS,
    is_closed_window_key,
    split_window_keys_ms,
    window_key_of_closed,
)
from riverbed.stream import keys, panes
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.errors import StreamValueError
from riverbed.stream.metrics import Count, result_columns, values_merger
from riverbed.stream.results import (
    empty_rows,
    output_arrow_schema,
    since_values,
    with_listed_times,
)
from riverbed.windows import Session

SessionRow = tuple[str, int, int, dict[str, Any]]  # (key, start ms, end ms, partials)


def utc_us(ms: np.ndarray) -> pd.DatetimeIndex:
    """Epoch milliseconds as UTC microseconds: years 1-9999 (pandas' nanoseconds end in
    2262; validity.py admits windows of the whole calendar)."""
    # (not pd.to_datetime: it builds a cache of the distinct values first, ~10x slower)
    us = ms.astype("datetime64[ms]").astype("datetime64[us]")
    return pd.DatetimeIndex(us).tz_localize("UTC")


def window_rows(
    spec: Aggregation, emitted: dict[bytes, dict[str, Any]] | panes.Windows, batch_id: int
) -> pd.DataFrame:
    """The emitted windows as output rows (built column by column): values under their
    state keys, or windows as columns already (riverbed.stream.panes)."""
    if not emitted:  # typed empty columns (empty lists would all be float64)
        return empty_rows(spec)
    names = output_arrow_schema(spec).names
    columns: dict[str, Any] = {name: [] for name in names}
    if isinstance(emitted, panes.Windows):
        start_ms, key_bytes, per_metric = emitted.starts, emitted.keys, emitted.values
    else:
        ordered = sorted(emitted)
        start_ms, key_bytes = split_window_keys_ms(ordered)
        values = [emitted[k] for k in ordered]
        per_metric = {name: [v[name] for v in values] for name in spec.metrics}
    columns["key"] = [k.decode() for k in key_bytes]
    for name, metric in spec.metrics.items():
        for suffix, results in result_columns(metric, per_metric[name]).items():
            columns[name + suffix] = results
    with_listed_times(spec, columns)
    if spec.composite:  # each part under its own name, typed (keys.py)
        columns.update(keys.decode(columns["key"], spec))
    columns["window_start"] = utc_us(start_ms)
    columns.update(since_values(spec, start_ms))  # a metric backfilled past retention
    assert not isinstance(spec.window, Session)
    columns["window_end"] = utc_us(start_ms + spec.window.size_ms)
    _typed(spec, columns, len(key_bytes), batch_id, counts_null=False)
    return pd.DataFrame(columns, columns=names)


def _typed(
    spec: Aggregation, columns: dict[str, Any], rows: int, batch_id: int, counts_null: bool
) -> None:
    """The columns whose type is known as typed arrays — counts (unless a tombstone row
    leaves one NULL), the key, the batch id: pandas infers a list's type value by value,
    half of building 25,000 rows."""
    if not counts_null:
        for name, metric in spec.metrics.items():
            if isinstance(metric, Count):
                columns[name] = np.asarray(columns[name], dtype=np.int64)
    if not spec.composite:  # (keys.decode typed a composite key's parts already)
        columns["key"] = np.asarray(columns["key"], dtype=object)
    columns["batch_id"] = np.full(rows, batch_id, dtype=np.int64)


def session_rows(
    spec: Aggregation, emitted: list[SessionRow], removed: list[tuple[str, int]], batch_id: int
) -> pd.DataFrame:
    """Sessions as output rows, and a tombstone row (``deleted``, no end or metrics)
    for each removed (key, start)."""
    if not emitted and not removed:
        return empty_rows(spec)
    names = output_arrow_schema(spec).names
    columns: dict[str, Any] = {name: [] for name in names}
    ordered = sorted(emitted, key=lambda s: (s[1], s[0]))
    columns["key"] = [key for key, _, _, _ in ordered]
    columns["window_start"] = [start for _, start, _, _ in ordered]
    columns["window_end"] = [end for _, _, end, _ in ordered]
    for name, metric in spec.metrics.items():
        for suffix, results in result_columns(metric, [v[name] for *_, v in ordered]).items():
            columns[name + suffix] = results
    for key, start in sorted(removed, key=lambda r: (r[1], r[0])):
        columns["key"].append(key)
        columns["window_start"].append(start)
        columns["window_end"].append(None)
        for name, metric in spec.metrics.items():
            for suffix, _ in metric.outputs(spec.column_types):
                columns[name + suffix].append(None)
    columns["deleted"] = [False] * len(emitted) + [True] * len(removed)
    with_listed_times(spec, columns)
    if spec.composite:  # each part under its own name, typed (keys.py)
        columns.update(keys.decode(columns["key"], spec))
    columns["window_start"] = utc_us(np.array(columns["window_start"], dtype=np.int64))
    ends = np.array([0 if e is None else e for e in columns["window_end"]], dtype=np.int64)
    columns["window_end"] = pd.Series(utc_us(ends)).where(~np.array(columns["deleted"]))
    _typed(spec, columns, len(emitted) + len(removed), batch_id, counts_null=bool(removed))
    return pd.DataFrame(columns, columns=names)


def rows_from_state(
    spec: Aggregation, values: dict[bytes, bytes], batch_id: int, watermark_ms: int | None = None
) -> pd.DataFrame:
    """The windows a state partition holds (its key/value pairs, as stored) as output
    rows: what ``read_live`` answers. Panes (riverbed.stream.panes) need the
    ``watermark_ms`` of the batch that wrote ``values``: the windows it left open."""
    if spec.sessions:
        held = [
            (k[len(SESSIONS) :].decode(), s[0], s[1], s[2])
            for k, v in values.items()
            if k.startswith(SESSIONS)
            for s in msgpack.unpackb(v, raw=False)
        ]
        return session_rows(spec, held, [], batch_id)
    stored = {k: msgpack.unpackb(v, raw=False) for k, v in values.items()}
    if spec.pane_ms:
        stored = _pane_windows(spec, stored, watermark_ms)
    return window_rows(spec, stored, batch_id)


def _pane_windows(
    spec: Aggregation, stored: dict[bytes, Any], watermark_ms: int | None
) -> dict[bytes, Any]:
    """The windows of a partition that holds panes (riverbed.stream.panes), as of a
    batch that ran at ``watermark_ms``: the open ones from their panes, the closed ones
    ``keep_closed`` keeps as they were emitted (riverbed.state.keys)."""
    if watermark_ms is None:
        raise StreamValueError(f"{spec.name}: the windows of panes need the batch's watermark")
    size = spec.window.size_ms  # type: ignore[union-attr]
    open_from = watermark_ms - size + 1
    held = {k: v for k, v in stored.items() if not is_closed_window_key(k)}
    out = panes.windows(spec, held, values_merger(spec), lambda s: s >= open_from)
    # (the engine drops them at keep_closed: each one here is kept)
    out.update((window_key_of_closed(k), v) for k, v in stored.items() if is_closed_window_key(k))
    return out
