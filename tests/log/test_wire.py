"""The log server's wire shapes (the pure core of riverbed.log.wire), by property."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
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
from riverbed.log.records import RawRecord, StoredBatch, decode_body, encode_body, encode_columns
from riverbed.log.schema import schema_of, to_batch
from riverbed.log.wire import (
    BatchTooLargeError,
    ProtocolError,
    batch_columns,
    batch_stored,
    columns_fetched,
    error_info,
    fetched_columns,
    records_batch,
    remote_error,
    stored_batch,
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


@given(records, st.integers(0, 30), st.integers(0, 30))
@settings(deadline=None)  # the first example pays pyarrow's warm-up
def test_produced_columns_are_stored_as_the_same_bytes_as_rows(
    rows: list[RawRecord], cut: int, length: int
) -> None:
    """The server appends the wire's columns straight from their buffers: the stored
    body is byte for byte what the row encoder writes — whole batches and slices of
    them (Arrow offsets that do not start at 0)."""
    batch = batch_columns(records_batch(rows, None))
    if rows:
        assert encode_columns(batch).body == encode_body(rows).body
    part = batch.slice(cut, cut + length)
    expected = rows[cut : cut + length]
    if expected:
        body = encode_columns(part).body
        assert body == encode_body(expected).body
        assert decode_body(body, len(expected), 0).rows() == expected


@given(typed_values, st.integers(0, 2**40), st.integers(0, 5))
@settings(deadline=None)
def test_typed_values_travel_and_are_stored_as_their_columns(
    values: list[dict[str, Any]], ts: int, cut: int
) -> None:
    assert SCHEMA is not None
    rows = [RawRecord(ts + i, None, v, {}) for i, v in enumerate(values)]
    batch = batch_columns(records_batch(rows, to_batch(values, SCHEMA))).slice(cut, len(rows))
    if not len(batch):
        return
    stored = decode_body(encode_columns(batch).body, len(batch), 0)
    assert stored.values.type == pa.struct(list(SCHEMA))
    assert stored.values.to_pylist() == values[cut:]
    assert stored.timestamps_ms.tolist() == [r.timestamp_ms for r in rows[cut:]]


def test_a_produced_batch_without_values_is_refused() -> None:
    batch = records_batch([RawRecord(1, None, b"v")], None)
    holed = pa.RecordBatch.from_arrays(
        [*batch.columns[:2], pa.array([None], pa.binary()), batch.column(3)],
        schema=batch.schema,
    )
    with pytest.raises(ProtocolError, match="without a value"):
        batch_columns(holed)


@given(records, typed_values, st.integers(0, 10**12))
@settings(deadline=None)
def test_a_columnar_fetch_carries_what_the_stored_batch_decodes_to(
    rows: list[RawRecord], values: list[dict[str, Any]], base: int
) -> None:
    """A fetch "as columns": the server decodes a stored batch and sends its columns with
    the base offset; the client gets the same timestamps, keys and values (bytes or a
    typed topic's struct) a local decode gives, and no headers (a columnar read has
    none)."""
    assert SCHEMA is not None
    typed = [RawRecord(i, None if i % 2 else b"k", v, {}) for i, v in enumerate(values)]
    for batch_rows, schema in ((rows, None), (typed, SCHEMA)):
        if not batch_rows:
            continue
        wire = records_batch(batch_rows, to_batch(values, schema) if schema else None)
        body = encode_columns(batch_columns(wire)).body
        stored = StoredBatch(base, len(batch_rows), body)
        sent, metadata = fetched_columns(stored)
        got_base, got = columns_fetched(sent, pa.py_buffer(metadata))
        local = stored.decode()
        assert got_base == base and got.headers is None
        assert got.timestamps_ms.tolist() == local.timestamps_ms.tolist()
        assert got.keys.to_pylist() == local.keys.to_pylist()
        assert got.values.to_pylist() == local.values.to_pylist()
    with pytest.raises(ProtocolError, match="without its base offset"):
        columns_fetched(records_batch([RawRecord(1, None, b"v")], None), None)


@given(
    st.lists(st.tuples(st.integers(0, 10**12), st.integers(1, 10**4), st.binary(max_size=40))),
    st.integers(1, 4),
)
@settings(max_examples=60, deadline=None)
def test_stored_batches_cross_the_wire_in_any_split(
    batches: list[tuple[int, int, bytes]], pieces: int
) -> None:
    stored = [StoredBatch(b, n, body) for b, n, body in batches]
    table = pa.Table.from_batches([stored_batch(stored)])
    step = max(1, len(stored) // pieces)
    got = [s for b in table.to_batches(max_chunksize=step) for s in batch_stored(b)]
    assert [(s.base_offset, s.count, bytes(s.body)) for s in got] == batches


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
