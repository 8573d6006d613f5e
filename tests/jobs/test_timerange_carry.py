"""The carried state of time-range chunks, derived in Arrow (riverbed.timerange.carry):
folding chunk by chunk equals the parts of everything at once, and a tail is the last rows
per key before a boundary — whatever the rows, the chunking and the boundary."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from riverbed.timerange.carry import (
    CAND,
    CHUNK,
    NEXT,
    Boundary,
    T,
    carries,
    chunk_rows,
    fold,
    part_names,
    parts,
    tail_before,
    tails,
)

KEYS = ["sensor"]
INPUT = ["sensor", "ts", "value"]  # the input's columns (T, NEXT, IN: the batch's helpers)

rows_st = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2, 3]),
        st.integers(0, 99),  # time
        st.one_of(st.none(), st.integers(-40, 40)),  # value
    ),
    max_size=40,
)


def table(rows: list[tuple[int, int, int | None]]) -> pa.Table:
    return pa.table(
        {
            "sensor": pa.array([r[0] for r in rows], pa.int32()),
            "ts": pa.array([r[1] for r in rows], pa.int64()),
            T: pa.array([r[1] for r in rows], pa.int64()),
            "value": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def by_key(t: pa.Table) -> dict[Any, tuple[Any, ...]]:
    names = part_names("value")
    cols = t.to_pydict()
    return {k: tuple(cols[n][i] for n in names) for i, k in enumerate(cols["sensor"])}


def expected_parts(rows: list[tuple[int, int, int | None]]) -> dict[Any, tuple[Any, ...]]:
    out = {}
    for key in {r[0] for r in rows}:
        values = [r[2] for r in rows if r[0] == key and r[2] is not None]
        out[key] = (
            sum(values) if values else None,
            len(values),
            min(values, default=None),
            max(values, default=None),
        )
    return out


@given(rows_st, st.lists(st.integers(0, 99), max_size=4))
def test_folding_chunk_by_chunk_equals_the_parts_of_everything(
    rows: list[tuple[int, int, int | None]], cuts: list[int]
) -> None:
    edges = [0, *sorted(cuts), 100]
    carry = None
    for lo, hi in itertools.pairwise(edges):
        piece = table([r for r in rows if lo <= r[1] < hi])
        carry = fold(carry, parts(piece, KEYS, ["value"]), KEYS, ["value"])
    assert carry is not None
    assert by_key(carry) == expected_parts(rows)
    assert carry.schema.field("value__count").type == pa.int64()


def row_order(r: tuple[int, int, int | None]) -> tuple[int, int, bool, int]:
    """The job's row order per key: time, then value with nulls first."""
    return (r[0], r[1], r[2] is not None, r[2] or 0)


def with_next(rows: list[tuple[int, int, int | None]], n: int) -> pa.Table:
    """Rows in the job's order (time, then value, nulls first) with NEXT: the time of the
    row ``n`` later with the same key."""
    order = sorted(rows, key=row_order)
    nxt = []
    for i, r in enumerate(order):
        later = [o for o in order[i + 1 :] if o[0] == r[0]]
        nxt.append(later[n - 1][1] if len(later) >= n else None)
    t = table(order)
    return t.append_column(NEXT, pa.array(nxt, pa.int64()))


@given(rows_st, st.integers(1, 4), st.integers(0, 100))
@example([(2, 0, None), (2, 0, 0)], 2, 1)  # a null and a value tied in time
def test_a_tail_is_the_last_rows_per_key_before_the_boundary(
    rows: list[tuple[int, int, int | None]], n: int, next_lo: int
) -> None:
    got = tail_before(with_next(rows, n), INPUT, next_lo).to_pylist()
    order = sorted(rows, key=row_order)
    want = []
    for key in sorted({r[0] for r in rows}):
        older = [r for r in order if r[0] == key and r[1] < next_lo]
        want += older[-n:]
    as_tuples = sorted(((r["sensor"], r["ts"], r["value"]) for r in got), key=row_order)
    assert as_tuples == sorted(want, key=row_order)


@settings(max_examples=50)
@given(rows_st, st.integers(1, 3), st.integers(0, 30))
def test_each_chunk_of_a_batch_gets_the_carry_after_it(
    rows: list[tuple[int, int, int | None]], n: int, lookback: int
) -> None:
    """A batch of chunks [0,25) [25,50) [50,75) [75,100): each chunk gets its own rows
    without the helper columns, and its carry is what one chunk at a time would have
    carried after it."""
    batch = with_next(rows, n)
    bounds = [Boundary(s, s + 25, max(0, s + 25 - lookback)) for s in range(0, 100, 25)]
    chunks = [t // 25 for t in batch["ts"].to_pylist()]
    may_stay = [True] * batch.num_rows  # every row: the candidates' own filter is tested
    batch = batch.append_column(CHUNK, pa.array(chunks, pa.int64()))
    batch = batch.append_column(CAND, pa.array(may_stay, pa.bool_()))
    pieces = chunk_rows(batch, bounds)
    for i, (b, piece) in enumerate(zip(bounds, pieces, strict=True)):
        assert piece.column_names == INPUT
        assert sorted(piece["ts"].to_pylist()) == sorted(
            r[1] for r in rows if b.start <= r[1] < b.end
        )
        in_order = [t for t, c in zip(batch["ts"].to_pylist(), chunks, strict=True) if c == i]
        assert piece["ts"].to_pylist() == in_order, "a chunk's rows left the batch's order"
    after = carries(batch, bounds, KEYS, INPUT, ["value"], True, None)
    for b, carry in zip(bounds, after, strict=True):
        assert by_key(carry["cumulative"]) == expected_parts([r for r in rows if r[1] < b.end])
        tail = tail_before(batch, INPUT, b.next_lo)
        assert carry["tail"].equals(tail)


@given(rows_st, st.integers(1, 4), st.lists(st.integers(0, 100), min_size=1, max_size=6))
def test_the_tails_of_many_boundaries_in_one_pass_equal_one_boundary_at_a_time(
    rows: list[tuple[int, int, int | None]], n: int, next_los: list[int]
) -> None:
    """``tails`` (two binary searches per row) against ``tail_before`` per boundary,
    boundaries tied or not, row order kept."""
    batch = with_next(rows, n)
    los = sorted(next_los)
    for lo, got in zip(los, tails(batch, INPUT, los), strict=True):
        assert got.equals(tail_before(batch, INPUT, lo))
