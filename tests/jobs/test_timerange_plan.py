"""Time-range planning, pure: times, grids, requests, resume and reruns (Hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.jobs.timerange import RangeError, SpecError, TimeRangeJob
from riverbed.timerange.plan import (
    DAY_US,
    Progress,
    Shape,
    advance,
    check_chunk,
    chunk_label,
    edges,
    format_time,
    next_chunk,
    parse_time,
    plan_request,
)
from riverbed.timerange.spec import Cumulative, Rolling, Rows, Tumbling

H = 3_600_000_000
M = 60_000_000
T0 = parse_time("2026-01-01")


def test_times_read_and_print_in_utc() -> None:
    assert parse_time("2026-01-01") == T0
    assert parse_time("2026-01-01T05:00Z") == T0 + 5 * H
    assert parse_time("2026-01-01T06:00+01:00") == T0 + 5 * H
    assert parse_time(datetime(2026, 1, 1, 5, tzinfo=UTC)) == T0 + 5 * H
    assert format_time(T0 + 5 * H + 1) == "2026-01-01T05:00:00.000001Z"
    assert chunk_label(T0 + 5 * H) == "20260101T050000Z"
    with pytest.raises(RangeError, match="ISO 8601"):
        parse_time("yesterday")


@pytest.mark.parametrize(
    ("chunk", "tumbling", "message"),
    [
        (7 * M, 0, "does not divide a day"),
        (25 * H, 0, "does not divide a day"),
        (30 * M, H, "whole 1h tumbling windows"),
    ],
)
def test_chunks_that_do_not_divide_are_refused(chunk: int, tumbling: int, message: str) -> None:
    with pytest.raises(RangeError, match=message):
        check_chunk(chunk, tumbling)


def test_chunks_that_divide_are_accepted() -> None:
    for chunk in (5 * M, 15 * M, H, 6 * H, DAY_US, 2 * DAY_US):
        check_chunk(chunk, 0)
    check_chunk(2 * H, H)


def test_bad_requests_name_the_fix() -> None:
    shape = Shape(chunk=H)
    with pytest.raises(RangeError, match="not before --to"):
        plan_request(None, shape, T0 + H, T0 + H)
    with pytest.raises(RangeError, match=r"not on a 1h edge.*--from 2026-01-01T00:00:00Z"):
        plan_request(None, shape, T0 + 10 * M, T0 + 2 * H)
    with pytest.raises(RangeError, match="not on the 1h chunk grid"):
        plan_request(None, shape, T0, T0 + 90 * M)
    done = Progress(origin=T0, chunk=H, done_to=T0 + 3 * H, target=T0 + 3 * H)
    with pytest.raises(RangeError, match="gap"):
        plan_request(done, shape, T0 + 5 * H, T0 + 6 * H)
    with pytest.raises(RangeError, match="before this job's origin"):
        plan_request(done, shape, T0 - H, T0 + 6 * H)
    with pytest.raises(RangeError, match="keep --chunk 1h"):
        plan_request(done, Shape(chunk=30 * M), T0, T0 + 6 * H)
    with pytest.raises(RangeError, match="tumbling window would be cut"):
        days = Shape(chunk=2 * DAY_US, tumbling=2 * DAY_US)
        plan_request(None, days, T0 + DAY_US, T0 + 5 * DAY_US)


def test_the_spec_knows_its_lookback_and_carry() -> None:
    job = TimeRangeJob(
        input=lambda spark, s, e: None,
        key="k",
        time="t",
        metrics=[Rolling("30min", "v"), Rolling("2h", "v", "max"), Rows(10, "v")],
        tumbling=[Tumbling("1h", "v")],
    )
    assert job.lookback_us == 2 * H
    assert job.tail_rows == 9
    assert job.tumbling_us == H
    assert [n for _, n in job.rolling[0].names()] == ["v_mean_30m"]
    with pytest.raises(SpecError, match="unknown aggregate 'median'"):
        Rolling("1h", "v", "median")
    with pytest.raises(SpecError, match="same column twice"):
        TimeRangeJob(
            input=lambda s, a, b: None,
            key="k",
            time="t",
            metrics=[Cumulative("v"), Cumulative("v")],
        )
    with pytest.raises(SpecError, match="cannot read duration"):
        Rolling("half an hour", "v")


def run_to_end(progress: Progress, computed: list[int]) -> Progress:
    while (start := next_chunk(progress)) is not None:
        computed.append(start)
        progress = advance(progress, start, f"t{len(computed)}")
    return progress


@given(
    st.integers(1, 12),
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30), st.booleans()), max_size=6),
    st.sampled_from([0, 30 * M, H, 3 * H]),
    st.booleans(),
    st.data(),
)
@settings(max_examples=300, deadline=None)
def test_every_chunk_is_current_after_any_requests_and_crashes(
    first: int,
    requests: list[tuple[int, int, bool]],
    lookback: int,
    unbounded: bool,
    data: st.DataObject,
) -> None:
    """A model: each chunk's input has a version (a rerun of a range is a late correction
    of it); a chunk's output reads the inputs of the chunks its windows reach (all before
    it when ``unbounded``). After any sequence of runs — each cut short by a crash at a
    random point and resumed — every chunk's output was computed from current inputs,
    and chunks advanced only in order."""
    shape = Shape(chunk=H, lookback=lookback, unbounded=unbounded)
    inputs: dict[int, int] = {}  # chunk start → input version
    seen: dict[int, dict[int, int]] = {}  # chunk start → input versions it read
    progress = plan_request(None, shape, T0, T0 + first * H)

    def compute(start: int) -> None:
        reach = T0 if unbounded else start - lookback
        seen[start] = {s: inputs.get(s, 0) for s in inputs if reach - H < s <= start}

    def resume(progress: Progress) -> Progress:
        while (start := next_chunk(progress)) is not None:
            if data.draw(st.integers(0, 9), label="crash") == 0:
                return progress  # killed before publishing this chunk
            assert start == progress.origin or start - H in seen, "chunks advance in order"
            compute(start)
            progress = advance(progress, start, "t")
        return progress

    progress = resume(progress)
    for offset, length, rerun in requests:
        start = min(T0 + offset * H, progress.done_to)
        end = start + length * H
        if rerun:
            for s, _ in edges(start, min(end, progress.done_to), H):
                inputs[s] = inputs.get(s, 0) + 1  # late correction of that input
        progress = plan_request(progress, shape, start, end, rerun)
        progress = resume(progress)
    progress = resume(progress)
    while next_chunk(progress) is not None:  # the last resume, never killed
        start = next_chunk(progress)
        assert start is not None
        compute(start)
        progress = advance(progress, start, "t")
    assert progress.redo_from is None
    assert progress.done_to == progress.target
    for start, _ in edges(T0, progress.done_to, H):
        reach = T0 if unbounded else start - lookback
        current = {s: v for s, v in inputs.items() if reach - H < s <= start}
        assert {s: v for s, v in seen[start].items() if v} == {
            s: v for s, v in current.items() if v
        }, f"chunk {format_time(start)} is stale"
    assert progress.done == progress.total


def test_a_rerun_of_a_bounded_job_stops_after_the_lookback() -> None:
    shape = Shape(chunk=H, lookback=90 * M)
    done = Progress(origin=T0, chunk=H, done_to=T0 + 10 * H, target=T0 + 10 * H)
    redo = plan_request(done, shape, T0 + 2 * H, T0 + 3 * H, rerun=True)
    # input of [2h, 3h) feeds windows up to 4h30 → chunks 2h, 3h and 4h
    assert (redo.redo_from, redo.redo_to) == (T0 + 2 * H, T0 + 5 * H)
    computed: list[int] = []
    run_to_end(redo, computed)
    assert computed == [T0 + 2 * H, T0 + 3 * H, T0 + 4 * H]
    cumulative = plan_request(done, Shape(chunk=H, unbounded=True), T0 + 2 * H, T0 + 3 * H, True)
    assert cumulative.redo_to == T0 + 10 * H


def test_a_request_inside_the_done_range_has_nothing_to_do() -> None:
    done = Progress(origin=T0, chunk=H, done_to=T0 + 10 * H, target=T0 + 10 * H)
    again = plan_request(done, Shape(chunk=H), T0, T0 + 4 * H)
    assert next_chunk(again) is None
    more = plan_request(done, Shape(chunk=H), T0 + 4 * H, T0 + 12 * H)
    computed: list[int] = []
    run_to_end(more, computed)
    assert computed == [T0 + 10 * H, T0 + 11 * H]
