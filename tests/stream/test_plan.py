"""The pure core of the log-native trigger loop: which offsets a batch reads, and when."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from riverbed.spark.offsets import TriggerError, batch_ends, begin_offsets, capped, source_limits
from riverbed.stream.plan import (
    Trigger,
    balanced_groups,
    ends_of,
    has_input,
    parse_trigger,
    slices_json,
)

offsets = st.integers(0, 10_000)


@st.composite
def partitions(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, int]]:
    """(begin, latest) per partition, latest >= begin mostly, sometimes behind."""
    n = draw(st.integers(1, 8))
    begin = {p: draw(offsets) for p in range(n)}
    latest = {p: max(0, begin[p] + draw(st.integers(-5, 5_000))) for p in range(n)}
    return begin, latest


@given(partitions(), st.one_of(st.none(), st.integers(1, 20_000)))
def test_a_batch_takes_min_of_budget_and_backlog_never_backwards_never_past_the_end(
    data: tuple[dict[int, int], dict[int, int]], max_rows: int | None
) -> None:
    begin, latest = data
    ends = batch_ends(begin, latest, max_rows)
    backlog = sum(max(0, latest[p] - begin[p]) for p in latest)
    taken = sum(ends[p] - begin[p] for p in latest)
    assert all(begin[p] <= ends[p] <= max(begin[p], latest[p]) for p in latest)
    assert taken == (backlog if max_rows is None else min(max_rows, backlog))


@given(partitions(), st.integers(1, 5_000))
def test_the_budget_is_shared_in_proportion_to_the_backlog(
    data: tuple[dict[int, int], dict[int, int]], max_rows: int
) -> None:
    begin, latest = data
    ends = batch_ends(begin, latest, max_rows)
    backlog = {p: max(0, latest[p] - begin[p]) for p in latest}
    total = sum(backlog.values())
    if total > max_rows:  # each partition within one record of its share
        for p in latest:
            share = backlog[p] * max_rows / total
            assert share - 1 < ends[p] - begin[p] < share + 1 + len(latest)


@settings(deadline=None)  # up to thousands of plans in one example
@given(
    st.dictionaries(st.integers(0, 6), st.integers(0, 3_000), min_size=1),
    st.integers(1, 2_000),
    st.integers(0, 500),
)
def test_batches_planned_one_after_another_read_every_offset_once(
    ends_now: dict[int, int], max_rows: int, first: int
) -> None:
    """The loop's life: plan, record, plan from the recorded ends, ... until the
    available-now target; the plans tile each partition exactly."""
    retained = {p: (min(first, e), e) for p, e in ends_now.items()}
    target = {p: e for p, (_, e) in retained.items()}
    previous: dict[int, int] | None = None
    read = {p: 0 for p in retained}
    total = sum(e - f for f, e in retained.values())
    plans = 0
    while True:
        begin = begin_offsets(retained, previous, "earliest")
        slices = slices_json(begin, batch_ends(begin, capped(retained, target), max_rows))
        if not has_input(slices):
            break
        plans += 1
        assert plans <= total  # every plan reads at least one record: the loop ends
        for p, (s, e) in slices.items():
            assert s == (previous or {}).get(int(p), retained[int(p)][0])
            read[int(p)] += e - s
        assert sum(e - s for s, e in slices.values()) <= max_rows
        previous = ends_of(slices)
    assert read == {p: e - f for p, (f, e) in retained.items()}


@given(
    st.dictionaries(st.integers(0, 6), st.tuples(offsets, st.integers(0, 1_000)), min_size=1),
    st.dictionaries(st.integers(0, 6), offsets),
)
def test_a_batch_starts_where_the_last_ended_never_before_what_retention_kept(
    spans: dict[int, tuple[int, int]], previous: dict[int, int]
) -> None:
    retained = {p: (f, f + n) for p, (f, n) in spans.items()}
    begin = begin_offsets(retained, previous, "earliest")
    for p, (f, _) in retained.items():
        assert begin[p] == (max(previous[p], f) if p in previous else f)
    assert begin_offsets(retained, None, "earliest") == {p: f for p, (f, _) in retained.items()}
    assert begin_offsets(retained, None, "latest") == {p: e for p, (_, e) in retained.items()}


def test_an_available_now_target_holds_back_what_came_later_and_new_partitions() -> None:
    retained = {0: (0, 120), 1: (5, 80), 2: (3, 40)}  # partition 2 created after the start
    assert capped(retained, {0: 100, 1: 90}) == {0: 100, 1: 80, 2: 3}
    assert capped(retained, None) == {0: 120, 1: 80, 2: 40}


@pytest.mark.parametrize(
    ("given_", "want"),
    [
        (None, Trigger()),
        ({}, Trigger()),
        ({"availableNow": True}, Trigger(available_now=True)),
        ({"once": True}, Trigger(available_now=True)),
        ({"processingTime": "1 second"}, Trigger(interval_s=1.0)),
        ({"processingTime": "250 milliseconds"}, Trigger(interval_s=0.25)),
        ({"processingTime": "2 minutes"}, Trigger(interval_s=120.0)),
        ({"processingTime": "0 seconds"}, Trigger(interval_s=0.0)),
        ({"processingTime": 5}, Trigger(interval_s=5.0)),
    ],
)
def test_spark_trigger_keywords_are_understood(given_: dict[str, object], want: Trigger) -> None:
    assert parse_trigger(given_) == want


@pytest.mark.parametrize(
    ("given_", "names"),
    [
        ({"continuous": "1 second"}, "availableNow=True"),
        ({"availableNow": True, "once": True}, "availableNow=True"),
        ({"availableNow": False}, "must be True"),
        ({"processingTime": "soon"}, "'1 second'"),
        ({"processingTime": "3 fortnights"}, "'1 second'"),
        ({"processingTime": -1}, "must not be negative"),
    ],
)
def test_a_bad_trigger_is_named_with_the_accepted_forms(
    given_: dict[str, object], names: str
) -> None:
    with pytest.raises(TriggerError, match=names):
        parse_trigger(given_)


def test_source_limits_are_checked() -> None:
    assert source_limits({}) == (None, "earliest")
    assert source_limits({"maxrecordsperbatch": "700", "startingoffsets": "latest"}) == (
        700,
        "latest",
    )
    with pytest.raises(ValueError, match="maxRecordsPerBatch must be a positive integer"):
        source_limits({"maxrecordsperbatch": "0"})
    with pytest.raises(ValueError, match="startingOffsets must be earliest or latest"):
        source_limits({"startingoffsets": "middle"})


@given(st.lists(st.integers(0, 1_000_000), max_size=40), st.integers(1, 16))
@example(sizes=[6, 6, 6, 6], bins=3)  # the best split is 12, twice the old bound's 8
def test_partitions_are_spread_over_the_cores_each_once_and_balanced(
    sizes: list[int], bins: int
) -> None:
    items = list(enumerate(sizes))
    groups = balanced_groups(items, lambda item: item[1], bins)
    assert sorted(i for g in groups for i in g) == sorted(items)  # each exactly once
    assert all(groups) and len(groups) == min(bins, len(items))
    loads = [sum(size for _, size in g) for g in groups]
    if loads:  # greedy's bound: the fullest group was the lightest when it got its last
        m = len(groups)
        assert max(loads) <= sum(sizes) / m + max(sizes) * (1 - 1 / m) + 1e-6
    for g in groups:  # biggest first inside a group
        assert [s for _, s in g] == sorted((s for _, s in g), reverse=True)


@given(st.lists(st.integers(0, 1_000), max_size=7), st.integers(1, 3))
@example(sizes=[6, 6, 6, 6], bins=3)
def test_the_spread_is_within_four_thirds_of_the_best_split(sizes: list[int], bins: int) -> None:
    """The longest-processing-time bound, against the best split found exhaustively
    (the average is only a lower bound of the best: 4 x 6 in 3 groups needs 12)."""
    groups = balanced_groups(list(enumerate(sizes)), lambda item: item[1], bins)
    if not groups:
        return
    m = len(groups)
    best = min(
        max(sum(s for s, g in zip(sizes, where, strict=True) if g == k) for k in range(m))
        for where in itertools.product(range(m), repeat=len(sizes))
    )
    assert max(sum(s for _, s in g) for g in groups) <= best * (4 / 3 - 1 / (3 * m)) + 1e-9
