"""What changing a spec does (stream/changes.py), as a pure decision: Hypothesis over
pairs of specs, every changed part's action checked against the rule it must keep."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream import (
    Aggregation,
    Count,
    Distinct,
    Hopping,
    Max,
    Session,
    Sum,
    Tumbling,
)
from riverbed.stream.changes import Replay, compare, legacy_shape, plan, shape, shape_hash
from riverbed.stream.specrecord import legacy_spec

METRICS = {
    "events": Count(),
    "users": Distinct("user_id"),
    "spent": Sum("amount"),
    "top": Max("amount"),
}
WINDOWS = [Tumbling("1h"), Tumbling("2h"), Hopping("2h", "1h"), Session("5m")]

specs = st.builds(
    lambda key, window, metrics, watermark, where, parts, output: Aggregation(
        name="agg",
        key=key,
        time="ts",
        window=window,
        metrics={m: METRICS[m] for m in metrics},
        watermark=watermark,
        where=where,
        state_partitions=parts,
        output=output,
    ),
    key=st.sampled_from(["flag", ("flag", "user_id")]),
    window=st.sampled_from(WINDOWS),
    metrics=st.lists(st.sampled_from(sorted(METRICS)), min_size=1, unique=True),
    watermark=st.sampled_from(["0s", "10m", "1h"]),
    where=st.sampled_from([None, "amount > 1"]),
    parts=st.sampled_from([2, 3, 5]),
    output=st.sampled_from(["update", "final"]),
)

# the parts the state cannot carry: a change of any of them refuses the start
REFUSED_PARTS = {"key", "time column", "window"}


def _expected(part: str, was: Any, now: Any, spec: Aggregation, replayed: bool) -> str:
    if was == now:
        return "kept"
    if part in REFUSED_PARTS:
        return "refused"
    if part.startswith("metric ") and now is None:
        return "applied"  # removed
    if part.startswith("metric ") and was is None:  # added: read again from the source
        return "backfilled" if replayed and not spec.sessions else "refused"
    if part.startswith("metric "):
        return "refused"  # redefined
    return "applied"


@given(specs, specs, st.booleans())
def test_every_change_gets_the_action_its_rule_says(
    a: Aggregation, b: Aggregation, replayed: bool
) -> None:
    source = None if replayed else "the source cannot be read again"
    changes = compare(shape(a), shape(b), source)
    assert {c.part for c in changes} >= REFUSED_PARTS | {"watermark", "where", "state partitions"}
    for c in changes:
        assert c.action == _expected(c.part, c.was, c.now, b, replayed), c
        assert bool(c.why) == (c.action != "kept")
        if c.action == "refused" and c.was is None:  # an added metric: says why not
            assert ("cannot be read again" if not replayed else "session") in c.why
    decided = plan("agg", shape(a), shape(b), 3, source)
    assert set(decided.backfilled) == {
        c.part.split("'")[1] for c in changes if c.action == "backfilled"
    }
    refused = [c for c in changes if c.action == "refused"]
    assert (decided.refusal() is None) == (not refused)
    for c in refused:  # the refusal names every refused part and why
        assert c.part in (decided.refusal() or "") and c.why in (decided.refusal() or "")
    assert ("refuses" in decided.text()) == bool(refused)


@given(specs)
def test_the_same_spec_changes_nothing(a: Aggregation) -> None:
    assert all(c.action == "kept" for c in compare(shape(a), shape(a)))
    assert "nothing changed" in plan("agg", shape(a), shape(a), 0).text()


def test_equal_specs_written_differently_have_one_shape() -> None:
    a = Aggregation(
        name="x", key="k", time="ts", window=Tumbling("1h"), watermark="60m", metrics={"n": Count()}
    )
    b = dataclasses.replace(a, window=Tumbling("60m"), watermark="3600s")
    assert shape(a) == shape(b) and shape_hash(shape(a)) == shape_hash(shape(b))
    c = dataclasses.replace(a, metrics={"n": Count(where="k = 'x'")})
    assert shape_hash(shape(c)) != shape_hash(shape(a))


def test_a_first_start_has_nothing_to_compare() -> None:
    spec = Aggregation(name="x", key="k", window=Tumbling("1h"), metrics={"n": Count()})
    decided = plan("x", None, shape(spec), None)
    assert decided.first and not decided.changes and decided.refusal() is None
    assert "no checkpoint yet" in decided.text()


@given(specs, specs)
def test_a_checkpoint_from_before_shapes_checks_what_it_recorded(
    a: Aggregation, b: Aggregation
) -> None:
    """An older riverbed recorded only the partition count and fixed windows vs
    sessions: those are compared, the rest taken as kept."""
    changes = {c.part: c for c in compare(legacy_shape(legacy_spec(a)), shape(b))}
    assert set(changes) == {"window", "state partitions"}
    layout_changed = isinstance(a.window, Session) != isinstance(b.window, Session)
    assert (changes["window"].action == "refused") == layout_changed
    moved = a.state_partitions != b.state_partitions  # the state is moved: rescale.py
    assert changes["state partitions"].action == ("applied" if moved else "kept")


def test_plan_prints_durations_and_metrics_as_a_spec_writes_them() -> None:
    a = Aggregation(
        name="x", key="k", window=Tumbling("1h"), watermark="1h", metrics={"n": Count()}
    )
    b = dataclasses.replace(a, watermark="2h", metrics={"n": Count(), "s": Sum("amount")})
    text = plan("x", shape(a), shape(b), 7).text()
    assert "compared with the spec of batch 7" in text
    assert "watermark: 1h → 2h" in text
    assert "backfill  metric 's': (none) → Sum(column='amount')" in text
    replay = Replay({0: (0, 1200), 1: (40, 900)}, gone=40, seconds=2.4)
    text = dataclasses.replace(plan("x", shape(a), shape(b), 7), replay=replay).text()
    assert "reads 2,060 records (partition: offsets 0: 0..1200, 1: 40..900), about 2 s" in text
    assert "40 records before them are gone (retention)" in text
    frame = "riverbed cannot read a DataFrame source's events again"
    refused = plan("x", shape(a), shape(b), 7, frame)
    assert "REFUSED   metric 's': (none) → Sum(column='amount')" in refused.text()
    assert (
        "metric 's': (none) → Sum(column='amount'): the state holds no value of it for the "
        f"events already counted, and {frame}" in (refused.refusal() or "")
    )
