"""The console's trends and metrics text: pure rules, checked exhaustively."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.ui.metrics import Family, escape, exposition
from riverbed.ui.trend import Trend, describe_drain, drain_seconds, rate, slope

times = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=2, max_size=40).map(
    lambda gaps: [sum(gaps[: i + 1]) for i in range(len(gaps))]
)


@given(times, st.floats(min_value=0, max_value=1e6), st.floats(min_value=-1e3, max_value=1e3))
def test_slope_of_a_line_is_its_slope(ts: list[float], start: float, per_s: float) -> None:
    points = [(t, start + per_s * t) for t in ts]
    got = slope(points)
    assert got is not None and math.isclose(got, per_s, rel_tol=1e-6, abs_tol=1e-6)


@given(times, st.lists(st.integers(min_value=0, max_value=10_000), min_size=40, max_size=40))
def test_rate_of_a_growing_counter_is_growth_over_time(ts: list[float], steps: list[int]) -> None:
    values = [sum(steps[: i + 1]) for i in range(len(ts))]
    points = list(zip(ts, values, strict=False))
    got = rate(points)
    want = (values[-1] - values[0]) / (ts[-1] - ts[0])
    assert got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


def test_a_counter_that_restarts_counts_from_where_it_restarted() -> None:
    assert rate([(0, 100), (1, 150), (2, 10), (3, 30)]) == (50 + 10 + 20) / 3
    assert rate([(0, 5)]) is None and rate([(1, 5), (1, 9)]) is None


@given(times, st.floats(min_value=1, max_value=1e6), st.floats(min_value=0.01, max_value=1e4))
def test_a_shrinking_lag_drains_when_its_line_reaches_zero(
    ts: list[float], lag: float, per_s: float
) -> None:
    # the lag at the last sample is `lag`; it fell by per_s every second before
    points = [(t, lag + per_s * (ts[-1] - t)) for t in ts]
    got = drain_seconds(points)
    assert got is not None and math.isclose(got, lag / per_s, rel_tol=1e-5)


@given(times, st.floats(min_value=1, max_value=1e6), st.floats(min_value=0, max_value=1e4))
def test_a_lag_that_does_not_shrink_never_drains(ts: list[float], lag: float, per_s: float) -> None:
    points = [(t, lag + per_s * (t - ts[0])) for t in ts]
    assert drain_seconds(points) is None
    assert describe_drain(None, points[-1][1]) == "not draining"


def test_drain_descriptions() -> None:
    assert drain_seconds([(0, 10), (1, 0)]) == 0.0 and describe_drain(0.0, 0) == "drained"
    assert describe_drain(30, 5) == "≈ 30 s"
    assert describe_drain(600, 5) == "≈ 10 min"
    assert describe_drain(7200, 5) == "≈ 2.0 h"


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(-1e6, 1e6)), max_size=60))
def test_a_trend_keeps_the_newest_points_in_time_order(points: list[tuple[float, float]]) -> None:
    trend = Trend(keep=10)
    trend.extend(points)
    kept = trend.points
    assert len(kept) <= 10
    assert [t for t, _ in kept] == sorted({t for t, _ in kept})  # ordered, one per instant
    if points:
        assert kept[-1][0] == max(t for t, _ in points)


# -- Prometheus text --------------------------------------------------------------------


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), text)


@given(st.text(max_size=40), st.floats(allow_nan=False, allow_infinity=False))
def test_any_label_value_survives_the_text_format(value: str, number: float) -> None:
    fam = Family("riverbed_x", "help\nwith a newline")
    fam.add(number, topic=value, partition=3)
    text = exposition([fam])
    lines = text.rstrip("\n").split("\n")  # only \n ends a line in the format
    assert lines[0] == "# HELP riverbed_x help\\nwith a newline"
    assert lines[1] == "# TYPE riverbed_x gauge" and len(lines) == 3
    m = re.fullmatch(r'riverbed_x\{partition="3",topic="((?:[^"\\]|\\.)*)"\} (\S+)', lines[2])
    assert m, lines[2]
    assert _unescape(m.group(1)) == value
    assert math.isclose(float(m.group(2)), number, rel_tol=1e-12, abs_tol=0)
    assert "\n" not in escape(value)


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="not a Prometheus name"):
        Family("riverbed-lag", "x")
    with pytest.raises(ValueError, match="gauge or counter"):
        Family("riverbed_lag", "x", type="histogram")
    fam = Family("riverbed_lag", "x")
    fam.add(1, **{"bad-label": "v"})
    with pytest.raises(ValueError, match="not a Prometheus label"):
        exposition([fam])
    special = Family("riverbed_y", "y")
    special.add(float("nan"))
    special.add(float("inf"), a="b")
    assert exposition([special]).splitlines()[2:] == ["riverbed_y NaN", 'riverbed_y{a="b"} +Inf']
