"""Windows and metrics: pure logic, no Spark (Hypothesis)."""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream.aggregation import Aggregation
from riverbed.stream.metrics import Count, Distinct, Max, Mean, Min, Sum
from riverbed.windows import Hopping, Sliding, Tumbling, duration_ms

HOUR = 3_600_000


@given(st.integers(0, 2**41))
def test_tumbling_puts_each_event_in_exactly_its_window(ts: int) -> None:
    starts = Tumbling("1h").starts(np.array([ts]))
    assert len(starts) == 1
    assert starts[0][0] <= ts < starts[0][0] + HOUR and starts[0][0] % HOUR == 0


@given(st.integers(0, 2**41), st.sampled_from([("1h", "15m"), ("2h", "1h"), ("30m", "30m")]))
def test_hopping_windows_all_contain_the_event(ts: int, size_hop: tuple[str, str]) -> None:
    window = Hopping(*size_hop)
    starts = [s[0] for s in window.starts(np.array([ts]))]
    assert len(starts) == window.size_ms // window.hop_ms
    assert all(s <= ts < s + window.size_ms and s % window.hop_ms == 0 for s in starts)
    assert len(set(starts)) == len(starts)


def test_sliding_and_durations() -> None:
    assert len(Sliding("1h", step="10m").starts(np.array([0]))) == 6
    assert duration_ms("1h30m") == 90 * 60_000 and duration_ms(5) == 5
    with pytest.raises(ValueError, match="duration"):
        duration_ms("an hour")
    with pytest.raises(ValueError, match="multiple"):
        Hopping("1h", "7m")


def test_metrics_partial_merge_result_match_numpy() -> None:
    a, b = np.array([1.0, 5.0, 3.0]), np.array([10.0, -2.0])
    both = np.concatenate([a, b])
    for metric, expected in [
        (Count(), len(both)),
        (Sum("x"), both.sum()),
        (Min("x"), both.min()),
        (Max("x"), both.max()),
        (Mean("x"), both.mean()),
    ]:
        merged = metric.merge(metric.partial(a, len(a)), metric.partial(b, len(b)))
        assert metric.result(merged)[""] == pytest.approx(expected)


@given(
    st.lists(
        st.lists(st.one_of(st.just(float("nan")), st.floats(-1e9, 1e9)), max_size=6),
        min_size=1,
        max_size=6,
    )
)
def test_null_values_are_skipped_in_any_merge_order(parts: list[list[float]]) -> None:
    """Partials of batches whose values are all null (NaN) take no part: a window's
    min, max, sum and mean are those of its present values, whatever order batches
    merge in (an all-null batch once gave min NaN, which min() kept or dropped by
    order)."""
    present = [v for part in parts for v in part if v == v]
    for metric, want in [
        (Min("x"), min(present, default=None)),
        (Max("x"), max(present, default=None)),
        (Sum("x"), sum(present)),
        (Mean("x"), sum(present) / len(present) if present else None),
    ]:
        for order in (parts, parts[::-1]):
            merged = None
            for part in order:
                column = np.array(part, dtype=float)
                partial = metric.partial(column, len(column))
                merged = partial if merged is None else metric.merge(merged, partial)
            got = metric.result(merged)[""]
            if want is None:
                assert got is None or got != got, (metric, order)
            else:
                assert got == pytest.approx(want), (metric, order)


@pytest.mark.parametrize("mode", ["exact", "hll", "adaptive"])
def test_distinct_partials_merge(mode: str) -> None:
    metric = Distinct("u", mode=mode, threshold=100)  # type: ignore[arg-type]
    a, b = np.arange(0, 150), np.arange(100, 300)
    result = metric.result(metric.merge(metric.partial(a, 150), metric.partial(b, 200)))
    if mode == "exact":
        assert result == {"": 300, "_is_exact": True, "_error": 0.0}
    else:
        assert abs(result[""] - 300) <= 300 * 0.05 and result["_is_exact"] is False


@pytest.mark.parametrize("mode", ["exact", "hll", "adaptive"])
def test_integer_ids_with_nulls_merge_with_integer_ids(mode: str) -> None:
    """pandas turns an integer column with nulls into float64; its ids are the same ids."""
    metric = Distinct("u", mode=mode, threshold=1000)  # type: ignore[arg-type]
    with_nulls = np.array([1.0, np.nan, 2.0, 3.0])
    merged = metric.merge(metric.partial(np.array([3, 4]), 2), metric.partial(with_nulls, 4))
    assert metric.result(merged)[""] == 4


def test_aggregation_spec_validates_and_pickles() -> None:
    spec = Aggregation(
        name="flags",
        key="flag",
        window=Tumbling("1h"),
        metrics={"users": Distinct("user_id"), "events": Count()},
    )
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.reads() == ["flag", "timestamp", "user_id"]
    with pytest.raises(ValueError, match="metric"):
        Aggregation(name="x", key="k", window=Tumbling("1h"), metrics={})
    with pytest.raises(ValueError, match="output"):
        Aggregation(
            name="x", key="k", window=Tumbling("1h"), metrics={"n": Count()}, output="sometimes"
        )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode"):
        Distinct("u", mode="fuzzy")  # type: ignore[arg-type]


@given(
    st.lists(st.lists(st.integers(-1000, 1000), max_size=80), min_size=1, max_size=6),
    st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]),
)
def test_a_quantile_merged_from_any_batches_is_within_its_rank_bound(
    parts: list[list[int]], q: float
) -> None:
    """KLL partials merged in any order give a value of the data whose rank is within
    the reported normalized rank error of q (0 while every value is held: exact)."""
    from riverbed.stream.metrics import Quantile

    metric = Quantile("x", q, k=64)
    values = sorted(v for part in parts for v in part)
    merged = None
    for part in parts:
        partial = metric.partial(np.array(part, dtype=float), len(part))
        merged = partial if merged is None else metric.merge(merged, partial)
    result = metric.result(merged)
    if not values:
        assert result[""] is None
        return
    got = result[""]
    assert got in values
    below = sum(v < got for v in values) / len(values)
    at_most = sum(v <= got for v in values) / len(values)
    bound = result["_error"]
    assert below - bound <= q <= at_most + bound + 1e-9, (got, q, below, at_most, bound)
    if len(values) <= 64:
        assert bound == 0.0


@given(
    st.lists(st.lists(st.integers(0, 300), max_size=200), min_size=1, max_size=6),
    st.integers(1, 5),
)
def test_top_k_counts_are_exact_under_the_threshold_and_bounded_past_it(
    parts: list[list[int]], k: int
) -> None:
    from collections import Counter

    from riverbed.stream.metrics import TopK

    truth = Counter(v for part in parts for v in part)
    for threshold in (50, 8):  # above every window's distinct values; and below
        metric = TopK("x", k, threshold=max(threshold, k), lg_max_map=7)
        merged = None
        for part in parts:
            partial = metric.partial(np.array(part, dtype=np.int64), len(part))
            merged = partial if merged is None else metric.merge(merged, partial)
        result = metric.result(merged)
        top = result[""]
        if result["_is_exact"]:
            want = sorted(truth.items(), key=lambda vc: (-vc[1], str(vc[0])))[:k]
            assert [(int(t["value"]), t["count"]) for t in top] == [
                (v, c) for v, c in sorted(want, key=lambda vc: (-vc[1], str(vc[0])))
            ]
        else:  # each count within the reported error of the truth
            for t in top:
                assert abs(t["count"] - truth[int(t["value"])]) <= result["_error"]


EVENTS = st.lists(
    st.tuples(st.integers(0, 20), st.one_of(st.none(), st.integers(-5, 5))), max_size=30
)


@given(st.lists(EVENTS, min_size=1, max_size=5))
def test_first_last_argmax_argmin_pick_the_same_event_in_any_merge_order(
    parts: list[list[tuple[int, int | None]]],
) -> None:
    """Each picks one event's value among those whose value is present; ties go to the
    smallest value — so every split into batches and every merge order agrees."""
    from riverbed.stream.metrics import ArgMax, ArgMin, First, Last

    events = [(t, v) for part in parts for t, v in part if v is not None]
    want = {
        "first": min(events, key=lambda e: (e[0], e[1]))[1] if events else None,
        "last": max(events, key=lambda e: (e[0], -e[1]))[1] if events else None,
        "argmax": max(events, key=lambda e: (e[0], -e[1]))[1] if events else None,
        "argmin": min(events, key=lambda e: (e[0], e[1]))[1] if events else None,
    }
    metrics = {"first": First("v"), "last": Last("v"), "argmax": ArgMax("v", by="t"),
               "argmin": ArgMin("v", by="t")}  # fmt: skip
    for name, metric in metrics.items():
        for order in (parts, parts[::-1]):
            merged = None
            for part in order:
                t = np.array([e[0] for e in part], dtype=float)
                v = np.array([np.nan if e[1] is None else e[1] for e in part], dtype=float)
                partial = metric.partial(v, len(part), t)
                merged = partial if merged is None else metric.merge(merged, partial)
            assert metric.result(merged)[""] == want[name], (name, order)


ROWS = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 6)),  # by (NULL: the event is not a candidate)
        st.one_of(st.none(), st.integers(-3, 3)),  # the row's columns (NULLs kept)
        st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=20,
)


@given(st.lists(ROWS, min_size=1, max_size=5))
def test_a_picked_row_is_the_same_in_any_merge_order(
    parts: list[list[tuple[int | None, int | None, str | None]]],
) -> None:
    """ArgMax/ArgMin of several columns pick one event's whole row among those with a
    `by`; ties go to the smallest row, column by column, NULL first — whatever the
    split into batches and the merge order."""
    from riverbed.stream.metrics import ArgMax, ArgMin

    def order(row: tuple[int | None, str | None]) -> tuple[tuple[bool, object], ...]:
        return tuple((v is not None, 0 if v is None else v) for v in row)

    events = [(b, (n, t)) for part in parts for b, n, t in part if b is not None]
    for metric, best in ((ArgMax(["n", "t"], by="b"), max), (ArgMin(["n", "t"], by="b"), min)):
        top = best((b for b, _ in events), default=None)
        want = min((r for b, r in events if b == top), key=order, default=(None, None))
        for split in (parts, parts[::-1]):
            got = _merged_rows(metric, split)
            assert (got["_n"], got["_t"]) == want, (type(metric).__name__, split)


def _merged_rows(metric: Any, split: list[list[tuple[int | None, int | None, str | None]]]) -> Any:
    """The result of ``metric`` over (by, n, t) events, each part a batch's partial,
    merged in the parts' order."""
    merged = None
    for part in split:
        by = np.array([np.nan if b is None else b for b, _, _ in part], dtype=float)
        n = np.array([np.nan if v is None else v for _, v, _ in part], dtype=float)
        t = np.array([v for _, _, v in part], dtype=object)
        partial = metric.partial([n, t], len(part), by)
        merged = partial if merged is None else metric.merge(merged, partial)
    return metric.result(merged)


@given(st.lists(ROWS, min_size=1, max_size=5), st.integers(1, 4))
def test_every_tied_row_is_kept_in_any_merge_order(
    parts: list[list[tuple[int | None, int | None, str | None]]], most: int
) -> None:
    """``ties="all"``: every event whose `by` is the best — their rows the smallest
    first, at most ``max_ties`` of them (the smallest), and how many there were —
    whatever the split into batches and the merge order."""
    from riverbed.stream.metrics import ArgMax, ArgMin, First

    def order(row: tuple[int | None, str | None]) -> tuple[tuple[bool, object], ...]:
        return tuple((v is not None, 0 if v is None else v) for v in row)

    events = [(b, (n, t)) for part in parts for b, n, t in part if b is not None]
    metrics = ((ArgMax(["n", "t"], by="b", ties="all", max_ties=most), max),
               (ArgMin(["n", "t"], by="b", ties="all", max_ties=most), min),
               (First(["n", "t"], ties="all", max_ties=most), min))  # fmt: skip
    for metric, best in metrics:
        top = best((b for b, _ in events), default=None)
        tied = sorted((r for b, r in events if b == top), key=order)
        want = [{"n": n, "t": t} for n, t in tied[:most]]
        for split in (parts, parts[::-1]):
            got = _merged_rows(metric, split)
            assert got[""] == want and got["_ties"] == len(tied), (type(metric).__name__, split)


def test_ties_all_is_refused_with_the_fix_and_types_its_list() -> None:
    from riverbed.stream.errors import StreamValueError
    from riverbed.stream.metrics import ArgMax

    with pytest.raises(StreamValueError, match=r"ties must be 'smallest'.*or 'all'"):
        ArgMax("v", by="b", ties="every")
    with pytest.raises(StreamValueError, match="max_ties must be a whole number"):
        ArgMax("v", by="b", ties="all", max_ties=0)
    types = {"v": "long", "ts": "timestamp"}
    assert ArgMax("v", by="b", ties="all").outputs(types) == [
        ("", "array<long>"), ("_ties", "long")
    ]  # fmt: skip
    assert ArgMax(["v", "ts"], by="b", ties="all").outputs(types)[0] == (
        "", "array<struct<v:long,ts:timestamp>>"
    )  # fmt: skip


MAYBE = st.one_of(st.none(), st.integers(0, 3))


@given(
    st.lists(st.tuples(st.integers(0, 3), MAYBE, MAYBE, MAYBE, st.booleans()), max_size=40),
    st.sampled_from(["First", "Last", "ArgMax", "ArgMin"]),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["smallest", "all"]),
)
def test_picks_of_all_groups_at_once_are_each_groups_own(
    events: list[tuple[int, int | None, int | None, int | None, bool]],
    kind: str,
    row: bool,
    filtered: bool,
    ties: str,
) -> None:
    """``group_partials`` (one sort for every group) gives each group the partial that
    ``partial`` gives it alone — ties, NULLs and a metric's ``where`` included."""
    import riverbed.stream.metrics as m

    events = sorted(events, key=lambda e: e[0])  # grouped: group, by, value, other, counts
    bounds = [0]
    for i in range(1, len(events) + 1):
        if i == len(events) or events[i][0] != events[i - 1][0]:
            bounds.append(i)
    bounds = sorted(set(bounds))
    by = np.array([np.nan if e[1] is None else e[1] for e in events], dtype=float)
    v = np.array([np.nan if e[2] is None else e[2] for e in events], dtype=float)
    w = np.array([None if e[3] is None else f"w{e[3]}" for e in events], dtype=object)
    counts = np.array([e[4] for e in events], dtype=bool) if filtered else None
    cls = getattr(m, kind)
    by_column = {"by": "b"} if kind.startswith("Arg") else {}
    metric = cls(["v", "w"] if row else "v", ties=ties, max_ties=2, **by_column)
    column = [v, w] if row else v
    rows = np.arange(len(events))
    got = metric.group_partials(column, by, rows, bounds, counts)
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        mine = rows[a:b] if counts is None else rows[a:b][counts[a:b]]
        values = [c[mine] for c in column] if row else v[mine]
        assert got[i] == metric.partial(values, len(mine), by[mine]), (i, kind)


def test_session_specs_are_checked_and_late_means_before_the_watermark() -> None:
    from riverbed.stream.errors import StreamValueError
    from riverbed.windows import Session, WindowValueError, late, span

    with pytest.raises(WindowValueError, match="gap must be positive"):
        Session("0s")
    with pytest.raises(StreamValueError, match="window must be Tumbling"):
        Aggregation(name="a", key="k", window="5m", metrics={"n": Count()})  # type: ignore[arg-type]
    with pytest.raises(StreamValueError, match="'deleted' names a column"):
        Aggregation(name="a", key="k", window=Session("5m"), metrics={"deleted": Count()})
    with pytest.raises(StreamValueError, match="'key' names a column"):
        Aggregation(name="a", key=["key", "x"], window=Tumbling("1h"), metrics={"n": Count()})
    spec = Aggregation(name="a", key="k", window=Session("5m"), metrics={"n": Count()})
    assert spec.sessions and pickle.loads(pickle.dumps(spec)) == spec
    ts = np.array([999, 1000, 1001])
    assert late(Session("5m"), ts, 1000).tolist() == [True, False, False]
    # a fixed window's event is late once its last window ended: [0, 1000) closes at 1000
    assert late(Tumbling("1s"), ts, 1000).tolist() == [True, False, False]
    first, last = span(Session("5m"), ts)
    assert first.tolist() == ts.tolist() and (last - ts).tolist() == [300_000] * 3
    first, last = span(Hopping("1h", "15m"), np.array([HOUR]))
    assert first.tolist() == [HOUR - 3 * 900_000] and last.tolist() == [2 * HOUR]
