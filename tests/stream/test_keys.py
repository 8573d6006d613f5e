"""Composite keys' text (riverbed.stream.keys): vectorized, it equals JSON row by row."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream import Aggregation, Count, Tumbling
from riverbed.stream.keys import decode, encode

PART = st.one_of(st.none(), st.text(max_size=6), st.integers(-(2**63), 2**63 - 1))


@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=6)),
                          st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
                          st.one_of(st.none(), st.booleans())), max_size=40))  # fmt: skip
def test_the_key_of_each_row_is_its_parts_as_json_and_null_if_one_is(
    rows: list[tuple[Any, ...]],
) -> None:
    table = pa.table(
        {
            "s": pa.array([r[0] for r in rows], pa.string()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "b": pa.array([r[2] for r in rows], pa.bool_()),
        }
    )
    got = encode(table, ("s", "n", "b")).to_pylist()
    want = [
        None if None in r else json.dumps(list(r), separators=(",", ":"), ensure_ascii=False)
        for r in rows
    ]
    assert got == want


def test_keys_decode_into_parts_typed_as_their_columns() -> None:
    spec = Aggregation(
        name="a", key=["s", "n"], window=Tumbling("1h"), metrics={"c": Count()},
        column_types={"s": "string", "n": "long"},
    )  # fmt: skip
    assert decode(['["web",3]', '["a\\"b",-1]'], spec) == {"s": ["web", 'a"b'], "n": [3, -1]}
    untyped = Aggregation(name="a", key=["s", "n"], window=Tumbling("1h"), metrics={"c": Count()})
    assert decode(['["web",3]'], untyped) == {"s": ["web"], "n": ["3"]}


@given(st.lists(st.tuples(st.one_of(st.none(), st.text("ab yé-_.", max_size=6)),
                          st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
                max_size=40))  # fmt: skip
def test_keys_of_plain_text_and_numbers_are_the_same_json(rows: list[tuple[Any, ...]]) -> None:
    """(Parts JSON writes as they are go through Arrow's string kernels, the others a
    tuple at a time: both give json.dumps's text.)"""
    narrow = all(r[1] is None or abs(r[1]) < 2**31 for r in rows)
    numbers = pa.array([r[1] for r in rows], pa.int32() if narrow else pa.int64())
    table = pa.table({"s": pa.array([r[0] for r in rows], pa.string()), "n": numbers})
    for parts in (("s", "n"), ("n", "s"), ("n",)):
        got = encode(table, parts).to_pylist()
        want = [
            None
            if any(r[("s", "n").index(p)] is None for p in parts)
            else json.dumps(
                [r[("s", "n").index(p)] for p in parts], separators=(",", ":"), ensure_ascii=False
            )
            for r in rows
        ]
        assert got == want
