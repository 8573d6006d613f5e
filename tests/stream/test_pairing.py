"""The stream-stream join's pure core (riverbed.stream.pairing): over any sequence of
batches and watermarks, the pairs it emits are the batch join of the on-time events,
each once; a left join's unmatched events come once; the state ends empty."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.state import StateConfig, StateProvider
from riverbed.state.keys import JOIN_WATERMARK
from riverbed.stream import pairing
from riverbed.stream.pairing import IDS, LEFT, RIGHT, Rule, buffered_count, step

Event = tuple[str, int, int, int | None]  # key, time, batch, until (a left event's)


def _events(side: int) -> st.SearchStrategy[list[Event]]:
    return st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(0, 60),
            st.integers(0, 5),
            st.one_of(st.none(), st.integers(-5, 80)),
        ),
        max_size=25,
    )


rules = st.one_of(
    st.builds(Rule, window_ms=st.integers(1, 20)),
    st.builds(
        lambda lo, width, until: Rule(lower_ms=lo, upper_ms=lo + width, until=until),
        st.integers(-15, 10),
        st.integers(0, 15),
        st.sampled_from([None, "lu"]),  # ``until``: each left event's own end (or none)
    ),
)


def _frame(events: list[Event], batch: int, part: int) -> pd.DataFrame:
    """A side's events of one batch; its column ``lv`` / ``rv`` names the event."""
    rows = [
        (k, ts, part, offset, f"{'lr'[part]}{offset}", until)
        for offset, (k, ts, b, until) in enumerate(events)
        if b == batch
    ]
    frame = pd.DataFrame(rows, columns=[*IDS, "lr"[part] + "v", "lu"])
    frame = frame.astype({"_ts": "int64", "_part": "int64", "_off": "int64", "lu": "Int64"})
    return frame if part == 0 else frame.drop(columns=["lu"])


def _oracle(
    rule: Rule, how: str, left: pd.DataFrame, right: pd.DataFrame
) -> tuple[set[tuple[int, int]], set[int]]:
    both = left.merge(right, on="_key", suffixes=("_l", "_r"))
    until = both["lu"].fillna(pairing.NO_TIME).to_numpy(dtype=np.int64)
    hit = rule.matches(both["_ts_l"].to_numpy(), both["_ts_r"].to_numpy(), until)
    pairs = set(zip(both["_off_l"][hit], both["_off_r"][hit], strict=True))
    alone = set(left["_off"]) - {lo for lo, _ in pairs} if how == "left" else set()
    return pairs, alone


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rule=rules,
    how=st.sampled_from(["inner", "left"]),
    left=_events(0),
    right=_events(1),
    marks=st.lists(st.integers(0, 12), min_size=6, max_size=6),
    cached=st.booleans(),
)
def test_every_on_time_pair_once_whatever_the_batches(
    rule: Rule, how: str, left: list[Event], right: list[Event], marks: list[int], cached: bool
) -> None:
    """``cached``: the process keeps decoded segments (else every read is the store's)."""
    watermarks = list(np.cumsum(marks))  # any never-decreasing watermark per batch
    budget = pairing._CACHE.budget
    pairing._CACHE.budget = budget if cached else 0
    try:
        _pair_batches(rule, how, left, right, watermarks)
    finally:
        pairing._CACHE.budget = budget


def _pair_batches(
    rule: Rule, how: str, left: list[Event], right: list[Event], watermarks: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        provider = StateProvider(
            StateConfig(
                local_dir=Path(tmp) / "local", durable=str(Path(tmp) / "d"), engine="memory"
            )
        )
        got_pairs: list[tuple[int, int]] = []
        got_alone: list[int] = []
        on_time: dict[int, list[pd.DataFrame]] = {0: [], 1: []}
        previous = 0  # the watermark of the batch before
        for batch, w in enumerate([*watermarks, 10_000]):  # the last: everything closes
            frames = []
            for part, events in ((0, left), (1, right)):
                frame = _frame(events, batch, part)
                late = rule.late(frame["_ts"].to_numpy(), int(w))
                frames.append(frame.loc[~late].reset_index(drop=True))
                on_time[part].append(frames[-1])
            store = provider.load("j", 0, version=batch)
            out = step(store, rule, how, frames[0], frames[1], int(w), (["lv", "lu"], ["rv"]))
            store.commit(batch + 1)
            pairs, alone = out.pairs.to_pydict(), out.unmatched.to_pydict()
            got_pairs += list(zip(pairs["l_off"], pairs["r_off"], strict=True))
            got_alone += alone["l_off"]
            # no row comes earlier than the rule says an aggregation may wait for
            least = rule.earliest("left", previous)
            assert all(t >= least for t in pairs["l_ts"] + alone["l_ts"])
            assert all(t >= rule.earliest("right", previous) for t in pairs["r_ts"])
            previous = int(w)
            # the columns travel with the ids, both sides'
            assert pairs["lv"] == [f"l{o}" for o in pairs["l_off"]]
            assert pairs["rv"] == [f"r{o}" for o in pairs["r_off"]]
        want_pairs, want_alone = _oracle(rule, how, pd.concat(on_time[0]), pd.concat(on_time[1]))
        assert sorted(got_pairs) == sorted(want_pairs)  # each once: no duplicates
        assert sorted(got_alone) == sorted(want_alone)
        store = provider.load("j", 0)
        assert buffered_count(store, rule) == {"left": 0, "right": 0}  # the watermark passed all
        # nor any segment or paired rows: only the watermark
        assert [k for k, _ in store.scan(b"")] == [JOIN_WATERMARK]
        store.abort()


def test_state_holds_only_what_a_partner_could_still_reach() -> None:
    """An interval join (right at most 5 ms before, 10 after the left): once the
    watermark passes, a buffered event goes; before, it stays."""
    rule = Rule(lower_ms=-5, upper_ms=10)
    with tempfile.TemporaryDirectory() as tmp:
        provider = StateProvider(
            StateConfig(local_dir=Path(tmp) / "l", durable=str(Path(tmp) / "d"), engine="memory")
        )
        store = provider.load("j", 0, version=0)
        left = pd.DataFrame([("a", 100, 0, 0, "x")], columns=[*IDS, "lv"])
        right = pd.DataFrame([("a", 100, 1, 0, "y")], columns=[*IDS, "rv"])
        step(store, rule, "left", left, right, 0, (["lv"], ["rv"]))
        assert buffered_count(store, rule) == {"left": 1, "right": 1}
        nothing = pd.DataFrame(columns=[*IDS, "lv"]), pd.DataFrame(columns=[*IDS, "rv"])
        # right at 100 can meet a left up to 105 (lower -5): kept while W <= 105
        out = step(store, rule, "left", *nothing, 105, (["lv"], ["rv"]))
        assert buffered_count(store, rule) == {"left": 1, "right": 1}
        out = step(store, rule, "left", *nothing, 106, (["lv"], ["rv"]))
        assert buffered_count(store, rule) == {"left": 1, "right": 0}
        # left at 100 can meet a right up to 110: dropped at 111, matched: not emitted
        out = step(store, rule, "left", *nothing, 111, (["lv"], ["rv"]))
        assert buffered_count(store, rule) == {"left": 0, "right": 0}
        assert out.unmatched.num_rows == 0
        store.abort()
    assert LEFT != RIGHT


def test_a_partition_of_join_state_format_1_is_rewritten_by_its_next_batch() -> None:
    """State a riverbed before the segments wrote (a msgpack list of events per side and
    key, with a paired flag, and an index entry per event) is read by the next batch:
    its events pair, its flags hold, and only segments are left."""
    import msgpack

    from riverbed.state.keys import JOIN_EXPIRY, JOIN_ROWS, join_expiry_key, join_rows_key

    rule = Rule(lower_ms=-5, upper_ms=10)
    with tempfile.TemporaryDirectory() as tmp:
        provider = StateProvider(
            StateConfig(local_dir=Path(tmp) / "l", durable=str(Path(tmp) / "d"), engine="memory")
        )
        store = provider.load("j", 0, version=0)
        left = [[100, 0, 0, False, "x0"], [101, 0, 1, True, "x1"]]  # x1 paired before
        right = [[103, 1, 0, False, "y0"]]
        for side, events in ((LEFT, left), (RIGHT, right)):
            store.put(join_rows_key(side, b"a"), msgpack.packb(events, use_bin_type=True))
            for t, part, off, _, _ in events:
                expiry = int(rule.expires(side, np.array([t]))[0])
                store.put(join_expiry_key(side, expiry, t, part, off, b"a"), b"")
        store.commit(1)

        store = provider.load("j", 0, version=1)
        new_left = pd.DataFrame([("a", 110, 0, 2, "x2")], columns=[*IDS, "lv"])
        new_right = pd.DataFrame([("a", 112, 1, 1, "y1")], columns=[*IDS, "rv"])
        out = step(store, rule, "left", new_left, new_right, 50, (["lv"], ["rv"]))
        store.commit(2)
        # x2 meets y1 (gap 2) and y0? no: 103 - 110 = -7 < -5; x0, x1 meet no new one
        pairs = out.pairs.to_pydict()
        assert sorted(zip(pairs["lv"], pairs["rv"], strict=True)) == [("x2", "y1")]
        assert out.unmatched.num_rows == 0
        store = provider.load("j", 0, version=2)
        assert not list(store.scan(JOIN_ROWS)) and not list(store.scan(JOIN_EXPIRY))
        assert buffered_count(store, rule) == {"left": 3, "right": 2}
        nothing = pd.DataFrame(columns=[*IDS, "lv"]), pd.DataFrame(columns=[*IDS, "rv"])
        out = step(store, rule, "left", *nothing, 500, (["lv"], ["rv"]))
        store.commit(3)
        # x1's flag from format 1 held: only x0 was never paired
        assert out.unmatched.column("lv").to_pylist() == ["x0"]
        store = provider.load("j", 0, version=3)
        assert [k for k, _ in store.scan(b"")] == [JOIN_WATERMARK]
        store.abort()
