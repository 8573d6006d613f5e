"""The log server's wire shapes (the pure core of riverbed.log.wire), by property."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.log.base import Damage
from riverbed.log.errors import (
    CorruptLogError,
    LogError,
    OffsetOutOfRangeError,
    RecordRejectedError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import Columns, RawRecord
from riverbed.log.schema import from_batch, schema_of, to_batch
from riverbed.log.wire import (
    BatchTooLargeError,
    ProtocolError,
    batch_columns,
    batch_records,
    batch_rows,
    columns_batch,
    error_info,
    records_batch,
    remote_error,
)

SCHEMA = schema_of("user_id long, flag string")
records = st.lists(
    st.builds(
        RawRecord,
        st.integers(-(2**62), 2**62),
        st.none() | st.binary(max_size=8),
        st.binary(max_size=16),
        st.dictionaries(st.text(max_size=4), st.binary(max_size=4), max_size=2),
    ),
    max_size=30,
)
typed_values = st.lists(
    st.fixed_dictionaries(
        {"user_id": st.none() | st.integers(-(2**63), 2**63 - 1), "flag": st.text(max_size=5)}
    ),
    max_size=30,
)


@given(records)
@settings(deadline=None)  # the first example pays pyarrow's warm-up
def test_produced_records_cross_the_wire_unchanged(rows: list[RawRecord]) -> None:
    got, typed = batch_records(records_batch(rows, None))
    assert typed is None
    assert got == rows


@given(typed_values, st.integers(0, 2**40))
@settings(deadline=None)
def test_typed_values_travel_as_their_columns(values: list[dict[str, Any]], ts: int) -> None:
    assert SCHEMA is not None
    rows = [RawRecord(ts + i, None, v, {}) for i, v in enumerate(values)]
    got, typed = batch_records(records_batch(rows, to_batch(values, SCHEMA)))
    assert typed is not None and typed.schema == SCHEMA
    assert from_batch(typed) == values
    assert [r.timestamp_ms for r in got] == [r.timestamp_ms for r in rows]


@given(records, st.integers(0, 10**9))
@settings(deadline=None)
def test_fetched_rows_keep_their_offsets(rows: list[RawRecord], first: int) -> None:
    numbered = [(first + 3 * i, r) for i, r in enumerate(rows)]  # gaps, as after a skip
    batch = records_batch(rows, None, [o for o, _ in numbered])
    assert batch_rows(batch) == numbered


@given(
    st.integers(0, 10**6),
    st.lists(st.integers(1, 20), max_size=5),
    st.booleans(),
    st.integers(1, 4),
)
@settings(max_examples=60, deadline=None)
def test_columns_cross_the_wire_in_any_split(
    start: int, runs: list[int], gap: bool, pieces: int
) -> None:
    offsets = []
    at = start
    for n in runs:
        offsets.extend(range(at, at + n))
        at += n + (7 if gap else 0)
    n = len(offsets)
    columns = Columns(
        start,
        np.arange(n, dtype=np.int64) * 1000,
        pa.array([b"k%d" % i if i % 3 else None for i in range(n)], pa.binary()),
        pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        np.array(offsets, np.int64) if gap and len(runs) > 1 else None,
    )
    batch = columns_batch(columns)
    cut = [batch.slice(i, max(1, n // pieces)) for i in range(0, n, max(1, n // pieces))]
    got = batch_columns(start, cut)
    assert got.offsets.tolist() == offsets
    assert got.timestamps_ms.tolist() == columns.timestamps_ms.tolist()
    assert got.keys.to_pylist() == columns.keys.to_pylist()
    assert got.values.to_pylist() == columns.values.to_pylist()
    assert (got.picked is None) == (not gap or len(runs) <= 1 or n == 0)


def test_errors_come_back_as_the_same_exception() -> None:
    damage = Damage("p/0.log", 10, 5, 9, 40)
    corrupt = CorruptLogError("bad batch")
    corrupt.damage = damage
    cases: list[Exception] = [
        TopicNotFoundError("clicks"),
        TopicExistsError("topic 'clicks' already exists"),
        OffsetOutOfRangeError("offset 3 was removed"),
        RecordRejectedError("refused", index=4, field="user_id", reason="is 'x'"),
        BatchTooLargeError("too big"),
        ProtocolError("protocol 2"),
        ValueError("partition 9"),
        corrupt,
    ]
    for exc in cases:
        back = remote_error(error_info(exc), "fallback")
        assert type(back) is type(exc) and str(back) == str(exc)
    rejected = remote_error(error_info(cases[3]), "")
    assert isinstance(rejected, RecordRejectedError)
    assert (rejected.index, rejected.field, rejected.reason) == (4, "user_id", "is 'x'")
    assert remote_error(error_info(corrupt), "").damage == damage  # type: ignore[attr-defined]
    unknown = remote_error(error_info(KeyError("x")), "")
    assert type(unknown) is LogError and "KeyError" in str(unknown)
    assert str(remote_error(b"not json", "the call failed")) == "the call failed"
