"""Assignors (Hypothesis): every partition has exactly one live owner; balance; stickiness."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from riverbed.log.group.assignors import (
    ASSIGNORS,
    range_assignor,
    round_robin_assignor,
    sticky_assignor,
)

MEMBERS = st.lists(
    st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, max_size=8, unique=True
)
PARTS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 11)), max_size=30, unique=True
)


@given(MEMBERS, PARTS, st.sampled_from(sorted(ASSIGNORS)))
def test_every_partition_has_exactly_one_live_owner(
    members: list[str], parts: list[tuple[str, int]], name: str
) -> None:
    out = ASSIGNORS[name](members, parts, {})
    assert set(out) == set(parts)
    assert set(out.values()) <= set(members)


@given(MEMBERS, PARTS)
def test_round_robin_and_sticky_are_balanced(
    members: list[str], parts: list[tuple[str, int]]
) -> None:
    for assign in (round_robin_assignor, sticky_assignor):
        out = assign(members, parts, {})
        loads = [sum(1 for m in out.values() if m == member) for member in members]
        assert max(loads) - min(loads) <= 1


@given(MEMBERS, PARTS)
def test_range_is_balanced_per_topic(members: list[str], parts: list[tuple[str, int]]) -> None:
    out = range_assignor(members, parts, {})
    for topic in {t for t, _ in parts}:
        loads = [
            sum(1 for (t, _), m in out.items() if t == topic and m == member) for member in members
        ]
        assert max(loads) - min(loads) <= 1


@given(MEMBERS, MEMBERS, PARTS)
def test_sticky_moves_only_what_balance_requires(
    before: list[str], after: list[str], parts: list[tuple[str, int]]
) -> None:
    previous = sticky_assignor(before, parts, {})
    out = sticky_assignor(after, parts, previous)
    loads = [sum(1 for m in out.values() if m == member) for member in after]
    assert max(loads) - min(loads) <= 1
    kept = sum(1 for tp, m in out.items() if previous.get(tp) == m)
    # every surviving member keeps at least min(what it had, the new floor)
    floor = len(parts) // len(after)
    survivors = set(before) & set(after)
    must_keep = sum(min(sum(1 for m in previous.values() if m == s), floor) for s in survivors)
    assert kept >= must_keep
    # with the same members, nothing moves
    assert sticky_assignor(before, parts, previous) == previous
