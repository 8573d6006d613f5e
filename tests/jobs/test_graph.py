"""The resolver, pure: the seed's example, and properties checked by Hypothesis."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.jobs import CycleError, Dependency, Job, SpecError
from riverbed.jobs.graph import ActiveChunk, Freshness, find_cycle, resolve


def _main(ctx: Any, work_ids: list[int], **kwargs: Any) -> None:
    pass


def job(name: str, chunk: int | None, *deps: Dependency) -> Job:
    return Job(main=_main, name=name, chunk_size=chunk, dependencies=deps)


def seed_specs() -> dict[str, Job]:
    """Stau's documented example: A needs B and C; B needs E; C needs D."""
    return {
        "A": job("A", 3, Dependency("B", max_lag="1h"), Dependency("C", max_lag="1h")),
        "B": job("B", 2, Dependency("E", max_lag="1h")),
        "C": job("C", 6, Dependency("D", max_lag="1h")),
        "D": job("D", 6),
        "E": job("E", 6),
    }


def table(plan: Any) -> list[tuple[int, str, str, list[int], list[int]]]:
    """The plan as the seed's queue table: id, job, status, work ids, dependencies."""
    rows = [(0, plan.job, "MASTER", [], [i + 1 for i in plan.roots])]
    for c in plan.chunks:
        rows.append((c.index + 1, c.job, "QUEUED", list(c.work_ids), [u + 1 for u in c.upstream]))
    return rows


def test_the_seeds_example_resolves_to_the_seeds_queue_table() -> None:
    fresh = Freshness()
    fresh.record("C", "{}", [1, 2, 3, 4, 5, 6], at=1000.0)  # C ran 10 minutes ago
    plan = resolve(seed_specs(), "A", [1, 2, 3, 4, 5, 6], {}, fresh, now=1600.0)
    assert table(plan) == [
        (0, "A", "MASTER", [], [1, 2]),
        (1, "A", "QUEUED", [1, 2, 3], [3, 4]),
        (2, "A", "QUEUED", [4, 5, 6], [4, 5]),
        (3, "B", "QUEUED", [1, 2], [6]),
        (4, "B", "QUEUED", [3, 4], [6]),
        (5, "B", "QUEUED", [5, 6], [6]),
        (6, "E", "QUEUED", [1, 2, 3, 4, 5, 6], []),
    ]
    assert [(j, list(ids)) for j, ids, _ in plan.pruned] == [("C", [1, 2, 3, 4, 5, 6])]


def test_a_never_run_work_id_makes_the_chunk_stale() -> None:
    fresh = Freshness()
    fresh.record("C", "{}", [1, 2, 3, 4, 5], at=1000.0)  # 6 never ran (Stau ignored it)
    plan = resolve(seed_specs(), "A", [1, 2, 3, 4, 5, 6], {}, fresh, now=1600.0)
    assert {c.job for c in plan.chunks} == {"A", "B", "C", "D", "E"}


def test_max_lag_zero_always_reruns_and_lag_is_not_truncated_to_minutes() -> None:
    specs = {"A": job("A", None, Dependency("B", max_lag=0)), "B": job("B", None)}
    fresh = Freshness()
    fresh.record("B", "{}", [1], at=99.999)
    assert [c.job for c in resolve(specs, "A", [1], {}, fresh, now=100.0).chunks] == ["A", "B"]
    specs["A"] = job("A", None, Dependency("B", max_lag="90s"))
    fresh = Freshness()
    fresh.record("B", "{}", [1], at=10.0)
    assert [c.job for c in resolve(specs, "A", [1], {}, fresh, now=99.9).chunks] == ["A"]
    assert [c.job for c in resolve(specs, "A", [1], {}, fresh, now=100.0).chunks] == ["A", "B"]


def test_freshness_is_per_kwargs_and_fixed_kwargs_flow_down() -> None:
    specs = {
        "A": job("A", None, Dependency("B", max_lag="1h", kwargs={"mode": "full"})),
        "B": job("B", None, Dependency("C", max_lag="1h")),
        "C": job("C", None),
    }
    fresh = Freshness()
    fresh.record("B", "{}", [1], at=0.0)  # succeeded, but with other kwargs
    fresh.record("C", '{"mode":"full"}', [1], at=0.0)
    plan = resolve(specs, "A", [1], {}, fresh, now=10.0)
    assert [(c.job, c.kwargs) for c in plan.chunks] == [("A", {}), ("B", {"mode": "full"})]


def test_allow_missing_work_ids_asks_only_whether_the_job_ran() -> None:
    specs = {
        "A": job("A", None, Dependency("B", max_lag="1h", allow_missing_work_ids=True)),
        "B": job("B", None),
    }
    fresh = Freshness()
    fresh.record("B", "{}", [1, 2], at=0.0)
    assert [c.job for c in resolve(specs, "A", [1, 2, 3], {}, fresh, now=10.0).chunks] == ["A"]


def test_shared_by_default_unique_when_asked() -> None:
    base = {"D": job("D", None)}
    shared = {
        **base,
        "A": job("A", None, Dependency("B"), Dependency("C")),
        "B": job("B", None, Dependency("D")),
        "C": job("C", None, Dependency("D")),
    }
    assert [c.job for c in resolve(shared, "A", [1]).chunks].count("D") == 1
    unique = {**shared, "C": job("C", None, Dependency("D", unique=True))}
    assert [c.job for c in resolve(unique, "A", [1]).chunks].count("D") == 2


def test_cycles_are_named_and_depth_is_unlimited() -> None:
    specs = {
        "A": job("A", None, Dependency("B")),
        "B": job("B", None, Dependency("C")),
        "C": job("C", None, Dependency("A")),
    }
    with pytest.raises(CycleError, match="A → B → C → A"):
        resolve(specs, "A", [1])
    chain = {f"j{i}": job(f"j{i}", None, Dependency(f"j{i + 1}")) for i in range(50)}
    chain["j50"] = job("j50", None)
    assert len(resolve(chain, "j0", [1]).chunks) == 51


def test_unknown_dependency_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="'A' depends on 'nope'"):
        resolve({"A": job("A", None, Dependency("nope"))}, "A", [1])


def test_active_chunks_are_reused_not_duplicated() -> None:
    specs = {"A": job("A", 2, Dependency("B")), "B": job("B", 2)}
    active = [ActiveChunk(41, "B", "{}", (1, 2)), ActiveChunk(42, "B", "{}", (3,))]
    plan = resolve(specs, "A", [1, 2, 3, 4], {}, Freshness(), active)
    reused = [c for c in plan.chunks if c.reuse is not None]
    assert sorted(c.reuse for c in reused) == [41]  # [3, 4] is only half covered
    a12 = next(c for c in plan.chunks if c.job == "A" and c.work_ids == (1, 2))
    assert [plan.chunks[u].reuse for u in a12.upstream] == [41]
    assert [c.work_ids for c in plan.new_chunks if c.job == "B"] == [(3, 4)]


# -- properties -------------------------------------------------------------------------

NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Job]:
    """Random acyclic specs over NAMES (edges only to later names), random chunk sizes."""
    specs = {}
    for i, name in enumerate(NAMES):
        later = NAMES[i + 1 :]
        deps = draw(st.lists(st.sampled_from(later), unique=True, max_size=3)) if later else []
        lags = [draw(st.sampled_from([None, 0, 30, 100])) for _ in deps]
        specs[name] = job(
            name,
            draw(st.one_of(st.none(), st.integers(1, 7))),
            *(Dependency(d, max_lag=lag) for d, lag in zip(deps, lags, strict=True)),
        )
    return specs


def _reachable(specs: dict[str, Job], root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(d.job for d in specs[n].dependencies)
    return seen


@settings(max_examples=200, deadline=None)
@given(dags(), st.lists(st.integers(-50, 50), unique=True, max_size=25))
def test_without_history_every_job_covers_the_work_ids_exactly(
    specs: dict[str, Job], ids: list[int]
) -> None:
    plan = resolve(specs, "a", ids)
    for name in _reachable(specs, "a"):
        mine = [c for c in plan.chunks if c.job == name]
        covered = [w for c in mine for w in c.work_ids]
        assert sorted(covered) == sorted(ids)  # no id missing, none twice
        size = specs[name].chunk_size
        assert all(len(c.work_ids) <= (size or max(len(ids), 1)) for c in mine)


@settings(max_examples=200, deadline=None)
@given(dags(), st.lists(st.integers(0, 30), unique=True, max_size=20))
def test_links_exactly_where_work_ids_intersect(specs: dict[str, Job], ids: list[int]) -> None:
    plan = resolve(specs, "a", ids)
    for parent in plan.chunks:
        deps = {d.job for d in specs[parent.job].dependencies}
        for child in plan.chunks:
            if child.job not in deps:
                assert child.index not in parent.upstream
                continue
            meets = (
                not parent.work_ids
                or not child.work_ids
                or bool(set(parent.work_ids) & set(child.work_ids))
            )
            assert (child.index in parent.upstream) == meets


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.lists(st.integers(0, 15), unique=True, min_size=1, max_size=15),
    st.sampled_from([0, 10, 50]),
    st.dictionaries(st.integers(0, 15), st.floats(0, 100)),
    st.booleans(),
)
def test_pruning_is_exactly_per_chunk_max_lag_and_kwargs(
    a_size: int,
    b_size: int,
    ids: list[int],
    lag: int,
    ages: dict[int, float],
    other_kwargs: bool,
) -> None:
    specs = {"A": job("A", a_size, Dependency("B", max_lag=lag)), "B": job("B", b_size)}
    now = 1000.0
    fresh = Freshness()
    for w, age in ages.items():
        fresh.record("B", '{"x":1}' if other_kwargs else "{}", [w], now - age)
    plan = resolve(specs, "A", ids, {}, fresh, now=now)
    ran = {c.work_ids for c in plan.chunks if c.job == "B"}
    ordered = sorted(ids)
    for lo in range(0, len(ordered), b_size):
        chunk = tuple(ordered[lo : lo + b_size])
        stale = other_kwargs or any(w not in ages or ages[w] >= lag for w in chunk)
        assert (chunk in ran) == stale, (chunk, ages, lag)


@st.composite
def any_graphs(draw: st.DrawFn) -> dict[str, Job]:
    return {
        n: job(
            n,
            None,
            *(
                Dependency(d)
                for d in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
                if d != n
            ),
        )
        for n in NAMES
    }


def _acyclic_from(specs: dict[str, Job], root: str) -> bool:
    nodes = _reachable(specs, root)
    indeg = {n: 0 for n in nodes}
    for n in nodes:
        for d in specs[n].dependencies:
            indeg[d.job] += 1
    ready = [n for n, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for d in specs[n].dependencies:
            indeg[d.job] -= 1
            if indeg[d.job] == 0:
                ready.append(d.job)
    return seen == len(nodes)


@settings(max_examples=300, deadline=None)
@given(any_graphs())
def test_cycles_are_found_exactly(specs: dict[str, Job]) -> None:
    cycle = find_cycle(specs, "a")
    assert (cycle is None) == _acyclic_from(specs, "a")
    if cycle is not None:
        assert cycle[0] == cycle[-1]
        for x, y in itertools.pairwise(cycle):
            assert y in {d.job for d in specs[x].dependencies}


# -- code versions: staleness by a change of the job's source ----------------------------

VERSIONS = ["", "git:aaa src:111", "git:bbb src:111", "git:ccc src:222"]  # "": not recorded


def _source(v: str) -> str:
    return v.split("src:")[1] if "src:" in v else ""


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.integers(0, 15), unique=True, min_size=1, max_size=15),
    st.dictionaries(st.integers(0, 15), st.sampled_from(VERSIONS)),
    st.sampled_from(VERSIONS[1:]),
)
def test_stale_only_runs_exactly_the_chunks_the_current_source_has_not_run(
    size: int, ids: list[int], ran: dict[int, str], current: str
) -> None:
    specs = {"A": job("A", size)}
    fresh = Freshness()
    for w, v in ran.items():
        fresh.record("A", "{}", [w], 10.0 + w, v)
    plan = resolve(specs, "A", ids, {}, fresh, now=100.0, code={"A": current}, stale_only=True)
    runs = {c.work_ids: c.why for c in plan.chunks}
    kept = {p[1] for p in plan.pruned}
    ordered = sorted(ids)
    for lo in range(0, len(ordered), size):
        chunk = tuple(ordered[lo : lo + size])
        never = [w for w in chunk if w not in ran]
        # a commit elsewhere in the repository (same src:) changes nothing; no record: current
        changed = [w for w in chunk if _source(ran.get(w, "")) not in ("", _source(current))]
        assert (chunk in runs) == bool(never or changed), (chunk, ran, current)
        assert (chunk in kept) != (chunk in runs)
        if changed and chunk in runs and "code changed" in runs[chunk]:
            assert f"src:{_source(current)}" in runs[chunk]
        elif chunk in runs:
            assert "never succeeded" in runs[chunk] or "code changed" in runs[chunk]
    # without stale_only every root chunk runs, saying when its code changed
    full = resolve(specs, "A", ids, {}, fresh, now=100.0, code={"A": current})
    assert sorted(w for c in full.chunks for w in c.work_ids) == ordered
    for c in full.chunks:
        changed = any(_source(ran.get(w, "")) not in ("", _source(current)) for w in c.work_ids)
        assert ("code changed" in c.why) == changed
        assert c.why.startswith("submitted")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10), unique=True, min_size=1, max_size=10),
    st.dictionaries(st.integers(0, 10), st.sampled_from(VERSIONS)),
    st.sampled_from(VERSIONS[1:]),
    st.booleans(),
)
def test_a_dependency_fresh_within_max_lag_runs_again_when_its_source_changed(
    ids: list[int], ran: dict[int, str], current: str, allow_missing: bool
) -> None:
    specs = {
        "A": job("A", None, Dependency("B", max_lag="1h", allow_missing_work_ids=allow_missing)),
        "B": job("B", None),
    }
    fresh = Freshness()
    for w, v in sorted(ran.items()):
        fresh.record("B", "{}", [w], 50.0 + w, v)
    plan = resolve(specs, "A", ids, {}, fresh, now=100.0, code={"A": "src:x", "B": current})
    b = [c for c in plan.chunks if c.job == "B"]
    if allow_missing:  # only whether B ran at all, and the newest success's code
        newest = ran[max(ran)] if ran else None
        stale = newest is None or _source(newest) not in ("", _source(current))
    else:
        stale = any(w not in ran or _source(ran[w]) not in ("", _source(current)) for w in ids)
    assert bool(b) == stale, (ran, current)
    if b and ran and all(w in ran for w in ids) and not allow_missing:
        assert b[0].why.startswith("code changed")
