"""A lookup table in parts (riverbed.stream.lookupparts): joining events with the table
part by part gives exactly what joining them with the whole table gives — every event
once, in order, its columns and whether it found a row — for integer keys of other
widths on the two sides, text keys, NULL keys and keys the table lacks; parts follow
the state's placement rule; a part no event needs is never asked for."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.stream.joins import Lookup
from riverbed.stream.lookupparts import join_parts, parts_of, split
from riverbed.stream.lookups import join
from riverbed.stream.rescale import partition_of

LOOKUP = Lookup("t.parquet", on=("k", "id"))


@st.composite
def cases(draw: st.DrawFn) -> tuple[pa.Table, pa.Table, int]:
    text = draw(st.booleans())
    keys = draw(st.lists(st.integers(-50, 50), unique=True, max_size=40))
    seen = draw(st.lists(st.one_of(st.none(), st.integers(-60, 60)), max_size=60))
    if text:
        table_keys = pa.array([f"c{k}" for k in keys], pa.string())
        event_keys = pa.array([None if k is None else f"c{k}" for k in seen], pa.string())
    else:  # narrower on the events' side, as a topic's int field and a SQL bigint
        table_keys = pa.array(keys, pa.int64())
        event_keys = pa.array(seen, pa.int32())
    owners = draw(st.lists(st.one_of(st.none(), st.text(max_size=3)), min_size=len(keys),
                           max_size=len(keys)))  # fmt: skip
    table = pa.table({"id": table_keys, "owner": pa.array(owners, pa.string()),
                      "rank": pa.array(range(len(keys)), pa.int64())})  # fmt: skip
    events = pa.table({"n": pa.array(range(len(seen)), pa.int64()), "k": event_keys})
    return table, events, draw(st.integers(1, 7))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_joining_part_by_part_is_joining_with_the_whole_table(
    case: tuple[pa.Table, pa.Table, int],
) -> None:
    table, events, n = case
    parts = split(table, "id", n)
    assert sum(p.num_rows for p in parts) == table.num_rows
    asked: list[int] = []

    def part(p: int) -> pa.Table:
        asked.append(p)
        return parts[p]

    got, found = join_parts(events, LOOKUP, n, part, table.schema)
    want, want_found = join(events, LOOKUP, table)
    assert got.equals(want) and found.equals(want_found)
    needed = {int(p) for p in parts_of(events.column("k"), n) if p >= 0}
    assert sorted(asked) == sorted(needed)  # each part asked for once, only if needed


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), max_size=30),
       st.integers(1, 9))  # fmt: skip
def test_a_keys_part_is_its_state_partition(values: list[int | None], n: int) -> None:
    got = parts_of(pa.array(values, pa.int64()), n).tolist()
    assert got == [-1 if v is None else partition_of(str(v).encode(), n) for v in values]
    assert parts_of(pa.array(values, pa.int64()).dictionary_encode(), n).tolist() == got
