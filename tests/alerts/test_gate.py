"""The alerts gate, pure: each alert once, repeats, resolutions, the rate limit, and
nothing held back without being counted (Hypothesis against a plain model)."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.alerts.gate import Alert, Gate, Notice

CONDITIONS = [Alert(f"c{i}", f"cond{i % 2}", "warning", f"s{i}", "holds") for i in range(4)]
EVENTS = [Alert(f"e{i}", f"ev{i % 2}", "error", f"s{i}", "happened", event=True) for i in range(8)]

ticks = st.lists(
    st.tuples(
        st.floats(0.5, 400.0),  # seconds since the previous tick
        st.sets(st.sampled_from(CONDITIONS + EVENTS)),
    ),
    max_size=40,
)


def model(steps: list[tuple[float, set[Alert]]], repeat: float) -> list[tuple[str, str]]:
    """What an unlimited gate must send: (status, key), in order of ticks."""
    out: list[tuple[str, str]] = []
    now, last_sent, seen = 1000.0, {}, set()
    for dt, holding in steps:
        now += dt
        held = {a.key for a in holding if not a.event}
        tick = []
        for a in holding:
            if a.event and a.key not in seen:
                seen.add(a.key)
                tick.append(("firing", a.key))
        for key in sorted(held):
            if key not in last_sent:
                tick.append(("firing", key))
                last_sent[key] = now
            elif repeat and now - last_sent[key] >= repeat:
                tick.append(("repeat", key))
                last_sent[key] = now
        for key in sorted(set(last_sent) - held):
            tick.append(("resolved", key))
            del last_sent[key]
        out += sorted(tick)
    return out


def run(
    gate: Gate, steps: list[tuple[float, set[Alert]]], roundtrip: bool
) -> tuple[list[Notice], Gate]:
    sent: list[Notice] = []
    now = 1000.0
    for dt, holding in steps:
        now += dt
        sent += gate.decide(now, sorted(holding, key=lambda a: a.key))
        if roundtrip:  # the watcher stores the gate and a restarted one reads it back
            gate = Gate.from_dict(json.loads(json.dumps(gate.to_dict())))
    return sent, gate


@settings(max_examples=300, deadline=None)
@given(ticks, st.sampled_from([0.0, 300.0, 1000.0]), st.booleans())
def test_without_a_limit_each_alert_is_sent_as_the_model_says(
    steps: list[tuple[float, set[Alert]]], repeat: float, roundtrip: bool
) -> None:
    sent, _ = run(Gate(repeat=repeat, limit=10_000, per=60.0), steps, roundtrip)
    got: list[tuple[str, str]] = []
    at = None
    tick: list[tuple[str, str]] = []
    for n in sent:
        assert n.alert is not None and n.status != "summary"
        if n.at != at:
            got += sorted(tick)
            tick, at = [], n.at
        tick.append((n.status, n.alert.key))
    got += sorted(tick)
    assert got == model(steps, repeat)


@settings(max_examples=300, deadline=None)
@given(ticks, st.integers(1, 4), st.sampled_from([30.0, 60.0]), st.booleans())
def test_the_limit_holds_and_every_notice_held_back_is_counted(
    steps: list[tuple[float, set[Alert]]], limit: int, per: float, roundtrip: bool
) -> None:
    free, _ = run(Gate(repeat=300.0, limit=10_000, per=per), steps, False)
    limited, gate = run(Gate(repeat=300.0, limit=limit, per=per), steps, roundtrip)
    # the token bucket: never more than `limit` at once plus what the elapsed time refilled
    if limited:
        start = 1000.0 + steps[0][0]
        for i, n in enumerate(limited):
            assert i + 1 <= limit + (n.at - start) * limit / per + 1e-6
    # nothing lost: what the unlimited gate sent = sent here + held (summaries + unsent)
    wanted = Counter(n.alert.kind for n in free if n.alert is not None)
    passed = Counter(n.alert.kind for n in limited if n.alert is not None)
    held: Counter[str] = Counter()
    for n in limited:
        if n.status == "summary":
            assert n.held and n.alert is None
            held.update(n.held)
    held.update(gate.held)
    assert passed + held == wanted
    # and what was sent is what the unlimited gate sent, in order, with gaps
    keys = iter((n.status, n.alert.key) for n in free if n.alert is not None)
    for n in limited:
        if n.alert is not None:
            assert (n.status, n.alert.key) in keys  # a subsequence


def test_a_new_watcher_takes_old_failures_as_history() -> None:
    gate = Gate()
    assert gate.remember(EVENTS[:3] + CONDITIONS[:1], 5.0) == 3
    sent = gate.decide(10.0, EVENTS[:4] + CONDITIONS[:1])
    assert [(n.status, n.alert.key) for n in sent if n.alert] == [
        ("firing", "e3"),
        ("firing", "c0"),
    ]
