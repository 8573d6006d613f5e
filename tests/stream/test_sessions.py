"""Session windows' pure core: sessions cut from any split of the events, merged in any
order, are the sessions of all the events; the rows a reader keeps (emitted sessions,
tombstones applied) are exactly the current sessions."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.stream import sessions

GAP = 10


def direct(
    events: list[tuple[int, int, int]], gap: int
) -> dict[int, list[tuple[int, int, frozenset[int]]]]:
    """The definition: per key, events by time, a new session where the next event is
    more than ``gap`` after the one before. Events are (id, key, ts)."""
    out: dict[int, list[tuple[int, int, frozenset[int]]]] = {}
    for key in sorted({k for _, k, _ in events}):
        mine = sorted((t, i) for i, k, t in events if k == key)
        runs: list[list[tuple[int, int]]] = []
        for t, i in mine:
            if runs and t - runs[-1][-1][0] <= gap:
                runs[-1].append((t, i))
            else:
                runs.append([(t, i)])
        out[key] = [(r[0][0], r[-1][0] + gap, frozenset(i for _, i in r)) for r in runs]
    return out


def cut_into_partials(events: list[tuple[int, int, int]], gap: int) -> dict[int, list[Any]]:
    """What one task makes of its events: per key, (start, end, {"ids": ...})."""
    if not events:
        return {}
    ids = np.array([i for i, _, _ in events])
    keys = np.array([k for _, k, _ in events])
    ts = np.array([t for _, _, t in events], dtype=np.int64)
    order, bounds = sessions.cut(ts, keys, gap)
    out: dict[int, list[Any]] = {}
    for a, b in itertools.pairwise(bounds):
        picked = order[a:b]
        assert len(set(keys[picked].tolist())) == 1
        assert np.all(np.diff(ts[picked]) <= gap) and np.all(np.diff(ts[picked]) >= 0)
        out.setdefault(int(keys[picked[0]]), []).append(
            (
                int(ts[picked[0]]),
                int(ts[picked[-1]]) + gap,
                {"ids": frozenset(ids[picked].tolist())},
            )
        )
    return out


def combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    assert not (a["ids"] & b["ids"]), "an event counted twice"
    return {"ids": a["ids"] | b["ids"]}


events_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 200)), min_size=1, max_size=60
).map(lambda pairs: [(i, k, t) for i, (k, t) in enumerate(pairs)])


@settings(max_examples=300, deadline=None)
@given(events=events_strategy, data=st.data())
def test_sessions_of_any_split_merged_in_any_order_are_the_sessions_of_all_events(
    events: list[tuple[int, int, int]], data: Any
) -> None:
    # events in batches (any order: out of order across batches), each batch in tasks
    shuffled = data.draw(st.permutations(events))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=4)))
    batches = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]
    stored: dict[int, list[Any]] = {}
    table: dict[tuple[int, int], frozenset[int]] = {}  # what a reader sees: (key, start)
    for batch in batches:
        split = data.draw(st.integers(0, len(batch)))
        incoming: dict[int, list[Any]] = {}
        for task in (batch[:split], batch[split:]):
            for key, found in cut_into_partials(task, GAP).items():
                incoming.setdefault(key, []).extend(found)
        for key, new in incoming.items():
            merged = sessions.merge(stored.get(key, []), data.draw(st.permutations(new)), combine)
            starts = [s for s, _, _ in merged.sessions]
            assert starts == sorted(starts)
            for (_, e1, _), (s2, _, _) in zip(merged.sessions, merged.sessions[1:], strict=False):
                assert s2 > e1, "sessions that touch were not merged"
            stored[key] = merged.sessions
            for start, _, partials in merged.changed:  # upserts, then tombstones
                table[(key, start)] = partials["ids"]
            for start in merged.removed:
                assert (key, start) in table
                del table[(key, start)]
    want = direct(events, GAP)
    got = {k: [(s, e, p["ids"]) for s, e, p in v] for k, v in stored.items()}
    assert got == want
    assert table == {(k, s): ids for k, v in want.items() for s, _, ids in v}


def test_events_exactly_the_gap_apart_share_a_session_as_in_spark() -> None:
    ts = np.array([0, 300_000, 600_001], dtype=np.int64)  # 0, +5m, +5m 1ms
    order, bounds = sessions.cut(ts, np.zeros(3, dtype=np.int64), 300_000)
    assert [order[a:b].tolist() for a, b in itertools.pairwise(bounds)] == [[0, 1], [2]]
    merged = sessions.merge(
        [(0, 300_000, {"n": 1})],
        [(300_000, 600_000, {"n": 1})],
        lambda a, b: {"n": a["n"] + b["n"]},
    )
    assert merged.sessions == [(0, 600_000, {"n": 2})] and merged.removed == []


def test_a_stored_session_nothing_touched_is_neither_emitted_nor_rewritten() -> None:
    merged = sessions.merge(
        [(0, 10, {"n": 1}), (50, 60, {"n": 1})], [(100, 110, {"n": 3})], lambda a, b: a
    )
    assert merged.changed == [(100, 110, {"n": 3})] and merged.gone == [] and merged.removed == []
    assert [s for s, _, _ in merged.sessions] == [0, 50, 100]
