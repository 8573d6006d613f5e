"""partials_of groups events per (window, key) with numpy; the same partials as a plain
pandas groupby over the exploded events, for any events, window and watermark, keys as
strings or as a category."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.state.keys import split_window_key_ms, window_key
from riverbed.stream import (
    Aggregation,
    Count,
    Distinct,
    Hopping,
    Max,
    Min,
    Session,
    Sliding,
    Sum,
    Tumbling,
    panes,
)
from riverbed.stream.engine import partials_of
from riverbed.stream.metrics import values_merger, where_column
from riverbed.stream.sessions import END

HOUR = 3_600_000


def reference(spec: Aggregation, pdf: pd.DataFrame, watermark: int) -> dict[Any, Any]:
    """The plain way: explode events into their open windows, group with pandas."""
    ts = pdf["ts"].to_numpy()
    parts = []
    for starts in spec.window.starts(ts):
        keep = starts + spec.window.size_ms > watermark
        parts.append(
            pd.DataFrame(
                {
                    "w": starts[keep],
                    "k": pdf["flag"].to_numpy()[keep],
                    "u": pdf["user_id"].to_numpy()[keep],
                    "a": pdf["amount"].to_numpy()[keep],
                }
            )
        )
    exploded = pd.concat(parts, ignore_index=True)
    out = {}
    for (w, k), g in exploded.groupby(["w", "k"]):
        out[(int(w), str(k))] = (len(g), set(g["u"].tolist()), float(g["a"].sum()))
    return out


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.integers(0, 40),
            st.sampled_from("abcd"),
            st.integers(0, 6 * HOUR - 1),
            st.integers(-5, 5),
        ),
        min_size=1,
        max_size=80,
    ),
    hopping=st.booleans(),
    watermark=st.integers(0, 5 * HOUR),
    category=st.booleans(),
    layout=st.sampled_from(["panes", "windows"]),
)
def test_partials_equal_a_pandas_groupby(
    events: list[tuple[int, str, int, int]],
    hopping: bool,
    watermark: int,
    category: bool,
    layout: str,
) -> None:
    """Keys as strings or as a category (how the log-native path hands them over, with
    categories no event of the frame uses). A hopping window's partials per pane (state
    holds panes: riverbed.stream.panes), merged into the open windows, are the same."""
    window = Hopping("1h", "30m") if hopping else Tumbling("1h")
    spec = Aggregation(
        name="p",
        key="flag",
        time="ts",
        window=window,
        watermark="10m",
        metrics={"events": Count(), "users": Distinct("user_id"), "amount": Sum("amount")},
        state_partitions=2,
        state_layout=layout,  # type: ignore[arg-type]
    )
    pdf = pd.DataFrame(events, columns=["user_id", "flag", "ts", "amount"])
    pdf["amount"] = pdf["amount"].astype(float)
    if category:
        pdf["flag"] = pd.Categorical(pdf["flag"], categories=["z", *sorted(set(pdf["flag"]))])
    got = partials_of(spec, pdf, watermark, pdf["ts"].to_numpy(dtype=np.int64))
    assert len({(w, k) for w, k, _ in got}) == len(got), "a (window, key) came out twice"
    want = reference(spec, pdf, watermark)
    if spec.pane_ms:
        assert all(w % spec.pane_ms == 0 for w, _, _ in got)
        made = panes.windows(
            spec,
            {window_key(w, k.encode()): p for w, k, p in got},
            values_merger(spec),
            lambda starts: starts + HOUR > watermark,
        )
        got = [(*split_window_key_ms(k), v) for k, v in made.items()]
        got = [(w, k.decode(), v) for w, k, v in got]
        # (a window starting before the epoch has no state key: validity.py refuses
        # events that would open one; only the windows layout's partials show them)
        want = {wk: v for wk, v in want.items() if wk[0] >= 0}
    assert {(w, k) for w, k, _ in got} == set(want)
    users = spec.metrics["users"]
    for w, k, partial in got:
        n, ids, amount = want[(w, k)]
        assert partial["events"] == n
        assert users.result(partial["users"])[""] == len(ids)
        assert spec.metrics["amount"].result(partial["amount"])[""] == amount


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-(2**60), 2**60)), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.sampled_from(["int", "float"]),
    st.booleans(),
)
def test_counts_minima_and_maxima_of_all_groups_at_once_equal_group_by_group(
    cells: list[tuple[int | None, bool]], cuts: list[int], kind: str, filtered: bool
) -> None:
    """The vectorized partials (every group in one numpy call) are the values each
    metric's own ``partial`` gives group by group: NULLs skipped, a filtered metric's
    uncounted rows left out, None where a group has no number."""
    import numpy as np

    from riverbed.stream.grouping import _as_partials, _reduced
    from riverbed.stream.metrics import Count, Max, Min

    if kind == "int":  # an integer column has no NULLs in numpy
        column = np.array([v or 0 for v, _ in cells], dtype=np.int64)
    else:
        column = np.array([np.nan if v is None else float(v) for v, _ in cells])
    counts = np.array([c for _, c in cells]) if filtered else None
    rows = np.arange(len(cells))[::-1].copy()  # groups of rows in any order
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    firsts = np.asarray(bounds[:-1])
    for metric in (Count(), Min("v"), Max("v")):
        got = _as_partials(metric, _reduced(metric, column, counts, rows, firsts, np.diff(bounds)))
        want = []
        for a, b in itertools.pairwise(bounds):
            picked = rows[a:b]
            mine = picked if counts is None else picked[counts[picked]]
            want.append(metric.partial(column[mine], len(mine)))
        assert got == want, metric


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 30)), max_size=60),
    st.integers(0, 40),
    st.booleans(),
)
def test_rows_sorted_by_window_and_key_in_one_argsort_keep_lexsorts_order(
    rows: list[tuple[int, int]], extra_codes: int, narrow: bool
) -> None:
    """The combined-key argsort gives exactly ``np.lexsort``'s (stable) order — a
    group's rows stay in event order, which a float sum's result depends on — and a
    span too wide to combine falls back to lexsort."""
    from riverbed.stream.grouping import by_window_and_key

    starts = np.array([s % 10_000 if narrow else s for s, _ in rows], dtype=np.int64)
    codes = np.array([c for _, c in rows], dtype=np.int64)
    n_codes = (int(codes.max()) + 1 if len(codes) else 0) + extra_codes
    got = by_window_and_key(starts, codes, n_codes)
    assert got.tolist() == np.lexsort((codes, starts)).tolist()


def test_results_column_by_column_equal_each_values_result() -> None:
    """``result_columns`` (what result rows are built from) gives, per metric, what the
    metric's ``result`` gives value by value — the fast paths included."""
    from riverbed.stream import Max, Mean, Min, TopK
    from riverbed.stream.metrics import result_columns

    partials = {
        Count(): [3, 0, 7],
        Sum("a"): [1.5, -2.0, 0.0],
        Min("a"): [None, 1.0, -3.5],
        Max("a"): [2.0, None, 9.0],
        Mean("a"): [[3.0, 2], [0.0, 0], [-1.0, 4]],
        Distinct("u"): [Distinct("u").partial(np.array(v), len(v)) for v in ([1, 2], [], [5])],
        TopK("u", 2): [TopK("u", 2).partial(np.array(v), len(v)) for v in ([1, 1, 2], [3])],
    }
    for metric, values in partials.items():
        want: dict[str, list[Any]] = {}
        for value in values:
            for suffix, result in metric.result(value).items():
                want.setdefault(suffix, []).append(result)
        assert result_columns(metric, values) == want, metric


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**40), 2**40), st.integers(0, 3 * HOUR)), min_size=1, max_size=60
    ),
    st.booleans(),
)
def test_integer_keys_give_the_partials_of_their_text(
    events: list[tuple[int, int]], hopping: bool
) -> None:
    """An integer key column is grouped by its values and named by their text: the
    same partials as the same keys given as strings."""
    spec = Aggregation(
        name="p", key="k", time="ts", window=Hopping("1h", "30m") if hopping else Tumbling("1h"),
        watermark="10m", metrics={"n": Count(), "s": Sum("a")},
    )  # fmt: skip
    ints = pd.DataFrame(
        {"k": [k for k, _ in events], "ts": [t for _, t in events], "a": [1.0] * len(events)}
    )
    texts = ints.assign(k=ints["k"].astype(str))
    ts = ints["ts"].to_numpy(dtype=np.int64)
    assert partials_of(spec, ints, 0, ts) == partials_of(spec, texts, 0, ts)
    # pandas' nullable integers, a NA among them, name their keys as their text too
    nullable = ints.assign(k=ints["k"].astype("Int64"))
    nullable.loc[0, "k"] = pd.NA
    assert partials_of(spec, nullable, 0, ts) == partials_of(
        spec, nullable.assign(k=nullable["k"].astype(str)), 0, ts
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(0, 2**32 - 1)), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.sampled_from(["int", "float", "negative", "fraction"]),
    st.booleans(),
)
def test_exact_distinct_partials_of_all_groups_at_once_hold_each_groups_ids(
    cells: list[tuple[int | None, bool]], cuts: list[int], kind: str, filtered: bool
) -> None:
    """``Distinct.group_partials`` (every group's ids cut from one array) gives, once
    merged as state keeps it, what ``partial`` gives group by group: NULLs skipped (an
    integer column with NULLs is float), a filtered metric's uncounted rows left out.
    Ids that are negative, or numbers that are not whole, are left to the per-group
    way (None)."""
    from riverbed.state.sketches import ExactIds

    if kind == "int":
        column = np.array([v or 0 for v, _ in cells], dtype=np.int64)
    elif kind == "negative":
        column = np.array([-(v or 0) - 1 for v, _ in cells], dtype=np.int64)
    elif kind == "float":
        column = np.array([np.nan if v is None else float(v) for v, _ in cells])
    else:
        column = np.array([np.nan if v is None else v + 0.5 for v, _ in cells])
    counts = np.array([c for _, c in cells]) if filtered else None
    rows = np.arange(len(cells))[::-1].copy()  # groups of rows in any order
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    metric = Distinct("v")
    got = metric.group_partials(column, rows, bounds, counts)
    kept = column[rows] if counts is None else column[rows][counts[rows]]
    kept = kept[~np.isnan(kept)] if kept.dtype.kind == "f" else kept
    if kind in ("negative", "fraction") and len(kept):
        assert got is None
        return
    assert got is not None and len(got) == len(bounds) - 1
    for partial, (a, b) in zip(got, itertools.pairwise(bounds), strict=True):
        picked = rows[a:b]
        mine = picked if counts is None else picked[counts[picked]]
        want = metric.partial(column[mine], len(mine))
        stored = metric.merge_all([partial])
        assert stored[0] == want[0] == 0  # a bitmap, not the partial's ids
        assert ExactIds.from_bytes(stored).ids() == ExactIds.from_bytes(want).ids()
        assert metric.result(stored) == metric.result(want)


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.integers(-2 * HOUR, 6 * HOUR - 1),
            st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
            st.booleans(),
        ),
        min_size=1,
        max_size=80,
    ),
    hop=st.sampled_from([HOUR // 4, HOUR // 2, HOUR]),
    sliding=st.booleans(),
    watermark=st.integers(-HOUR, 5 * HOUR),
    integers=st.booleans(),
)
def test_hopping_windows_by_panes_give_the_per_window_partials(
    events: list[tuple[str, int, float | None, bool]],
    hop: int,
    sliding: bool,
    watermark: int,
    integers: bool,
) -> None:
    """Counts (plain and filtered), minima and maxima (NULLs, filtered values, integers
    or floats) of hopping and sliding windows, grouped per pane first
    (``_pane_partials``), equal what the per-window way gives: the same spec with one
    more metric that panes cannot take (a Sum) runs that way."""
    window = Sliding("2h", hop) if sliding else Hopping("2h", hop)
    metrics: dict[str, Any] = {
        "n": Count(),
        "big": Count(where="big"),
        "lo": Min("x"),
        "hi": Max("x"),
        "hi_big": Max("x", where="big"),
    }
    spec = Aggregation(name="p", key="k", time="ts", window=window, watermark="0s", metrics=metrics)
    per_window = dataclasses.replace(spec, metrics={**metrics, "sum": Sum("x")})
    pdf = pd.DataFrame(events, columns=["k", "ts", "x", "big"])
    pdf["x"] = pdf["x"].astype(np.float64)  # a NULL: NaN, as Arrow's floats arrive
    if integers:
        pdf["x"] = pdf["x"].fillna(0).round().astype(np.int64)
    pdf[where_column("big")] = pdf["big"].to_numpy()
    pdf[where_column("hi_big")] = pdf["big"].to_numpy()
    ts = pdf["ts"].to_numpy(dtype=np.int64)
    got = partials_of(spec, pdf, watermark, ts)
    want = [
        (w, k, {m: p[m] for m in metrics})
        for w, k, p in partials_of(per_window, pdf, watermark, ts)
    ]
    assert got == want


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 10 * HOUR), st.integers(-5, 5)),
        min_size=1,
        max_size=60,
    ),
    gap_min=st.integers(1, 120),
    watermark=st.integers(0, 11 * HOUR),
)
def test_session_partials_equal_each_keys_runs_of_events(
    events: list[tuple[str, int, int]], gap_min: int, watermark: int
) -> None:
    """A session's partials — its first event's time, its key, its count and sum, and
    its end (last event + gap) — are each key's runs of events not before the
    watermark, cut where the next event is more than the gap after the last; a frame
    whose every event is before the watermark gives none (it raised IndexError)."""
    gap = gap_min * 60_000
    spec = Aggregation(
        name="s", key="k", time="ts", window=Session(f"{gap_min}m"), watermark="1h",
        metrics={"n": Count(), "total": Sum("x")},
    )  # fmt: skip
    pdf = pd.DataFrame(
        {
            "k": [k for k, _, _ in events],
            "ts": pd.to_datetime([t for _, t, _ in events], unit="ms", utc=True),
            "x": [x for _, _, x in events],
        }
    )
    want = []
    for key in sorted({k for k, t, _ in events if t >= watermark}):
        times = sorted((t, x) for k, t, x in events if k == key and t >= watermark)
        run = [times[0]]
        for t, x in times[1:]:
            if t - run[-1][0] > gap:
                want.append((run[0][0], key, len(run), sum(v for _, v in run), run[-1][0] + gap))
                run = []
            run.append((t, x))
        want.append((run[0][0], key, len(run), sum(v for _, v in run), run[-1][0] + gap))
    partials = partials_of(spec, pdf, watermark)
    got = [(start, key, p["n"], p["total"], p[END]) for start, key, p in partials]
    assert sorted(got) == sorted(want)
    # Python's ints (msgpack packs them; numpy's it would refuse)
    assert all(isinstance(start, int) and isinstance(p[END], int) for start, _, p in partials)
