"""Typed topics' pure core: schemas parse and print back, values become typed columns and
come back equal, and a value that does not fit names its record, field and reason."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.log.schema import (
    TYPES,
    SchemaError,
    ValueMismatch,
    from_batch,
    parse_schema,
    schema_ddl,
    to_batch,
)

CANONICAL = ["long", "int", "short", "byte", "double", "float", "string", "boolean",
             "timestamp", "date", "binary"]  # fmt: skip
BOUNDS = {"long": 63, "int": 31, "short": 15, "byte": 7}


def values_of(type_name: str) -> st.SearchStrategy[Any]:
    if type_name in BOUNDS:
        bits = BOUNDS[type_name]
        return st.integers(-(2**bits), 2**bits - 1)
    if type_name == "double":
        return st.floats(allow_nan=False)
    if type_name == "float":
        return st.floats(allow_nan=False, width=32)
    if type_name == "string":
        return st.text(max_size=8)
    if type_name == "boolean":
        return st.booleans()
    if type_name == "timestamp":
        # st.datetimes takes naive bounds and attaches the time zone itself
        low, high = datetime(1970, 1, 1), datetime(2200, 1, 1)  # noqa: DTZ001
        return st.datetimes(min_value=low, max_value=high, timezones=st.just(UTC))
    if type_name == "date":
        return st.dates(min_value=date(1, 1, 1))
    return st.binary(max_size=8)


schemas = st.lists(
    st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), st.sampled_from(CANONICAL)),
    min_size=1,
    max_size=6,
    unique_by=lambda f: f[0],
)


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    fields = draw(schemas)
    rows = draw(
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={name: st.none() | values_of(type_name) for name, type_name in fields},
            ),
            max_size=20,
        )
    )
    return fields, rows


@settings(deadline=None)  # the first example pays pyarrow's warm-up
@given(schemas)
def test_a_schema_prints_back_to_itself(fields: list[tuple[str, str]]) -> None:
    ddl = ", ".join(f"{n} {t}" for n, t in fields)
    schema = parse_schema(ddl)
    assert schema.names == [n for n, _ in fields]
    assert schema_ddl(schema) == ddl
    assert parse_schema(schema_ddl(schema)) == schema


def test_spark_type_aliases_and_spacing() -> None:
    assert parse_schema(" a BIGINT ,b integer,  c: string") == pa.schema(
        [("a", pa.int64()), ("b", pa.int32()), ("c", pa.string())]
    )
    assert set(TYPES) >= set(CANONICAL)


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("", "empty schema"),
        ("user_id", "cannot read 'user_id'"),
        ("user_id lng", "field 'user_id' has type 'lng'"),
        ("a long, a string", "field 'a' appears twice"),
        ("a map<string,int>", "cannot read"),
    ],
)
def test_bad_schemas_are_named(ddl: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        parse_schema(ddl)


@settings(deadline=None)
@given(schema_and_rows())
def test_values_round_trip_through_typed_columns(
    case: tuple[list[tuple[str, str]], list[dict[str, Any]]],
) -> None:
    fields, rows = case
    schema = parse_schema(", ".join(f"{n} {t}" for n, t in fields))
    batch = to_batch(rows, schema)
    assert batch.schema == schema and batch.num_rows == len(rows)
    back = from_batch(batch)
    for given_row, got in zip(rows, back, strict=True):
        for name, type_name in fields:
            want = given_row.get(name)
            if type_name == "float" and want is not None:
                assert got[name] == pytest.approx(want, rel=1e-6)
            else:
                assert got[name] == want


def test_timestamps_from_iso_text_and_naive_datetimes_are_utc() -> None:
    schema = parse_schema("ts timestamp, d date")
    t = datetime(2026, 11, 23, 7, 30, tzinfo=UTC)
    rows = [
        {"ts": "2026-11-23T07:30:00Z", "d": "2026-11-23"},
        {"ts": "2026-11-23T08:30:00+01:00"},
        {"ts": datetime(2026, 11, 23, 7, 30)},  # noqa: DTZ001 -- naive means UTC
        {"ts": t + timedelta(microseconds=1)},
    ]
    got = [r["ts"] for r in from_batch(to_batch(rows, schema))]
    assert got == [t, t, t, t + timedelta(microseconds=1)]


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        ({"user_id": "seven"}, "user_id", "is 'seven', which is not a long"),
        ({"user_id": 1.5}, "user_id", "is 1.5, which is not a long"),
        ({"user_id": True}, "user_id", "is True, which is not a long"),
        ({"user_id": 2**63}, "user_id", "which is not a long"),
        ({"ts": "yesterday"}, "ts", "is 'yesterday', which is not a timestamp"),
        ({"flag": 3}, "flag", "is 3, which is not a string"),
        ({"amount": "3.5"}, "amount", "which is not a double"),
        ({"userid": 7}, "userid", "is not in the topic's schema (user_id long,"),
    ],
)
def test_a_value_that_does_not_fit_names_record_field_and_reason(
    row: dict[str, Any], field: str, reason: str
) -> None:
    schema = parse_schema("user_id long, flag string, amount double, ts timestamp")
    good = {"user_id": 1, "flag": "a", "amount": 2, "ts": "2026-11-23T00:00:00Z"}
    with pytest.raises(ValueMismatch) as caught:
        to_batch([good, good, row], schema)
    assert (caught.value.index, caught.value.field) == (2, field)
    assert reason in str(caught.value) and str(caught.value).startswith("record 2: field")


def test_a_value_that_is_not_a_mapping_is_named() -> None:
    with pytest.raises(ValueMismatch, match="record 0: the record is a list"):
        to_batch([[1, 2]], parse_schema("a long"))
