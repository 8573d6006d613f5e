"""A schema's DDL read without a JVM (riverbed.spark.ddl) reads what Spark reads, and
leaves to Spark whatever is not a list of primitive fields."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from riverbed.spark.ddl import TYPES, simple_schema

# names Spark reads as plain identifiers, keywords among them (a column called `order`)
NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
    st.sampled_from(["order", "select", "from", "table", "timestamp", "date", "string", "not"]),
)


@st.composite
def ddls(draw: st.DrawFn) -> str:
    fields = []
    for _ in range(draw(st.integers(1, 6))):
        name = draw(NAMES)
        if draw(st.booleans()):
            name = f"`{name}`"
        kind = draw(st.sampled_from(sorted(TYPES)))
        kind = "".join(c.upper() if draw(st.booleans()) else c for c in kind)
        between = draw(st.sampled_from([" ", "  ", ": ", ":", " : "]))
        not_null = draw(st.sampled_from(["", " NOT NULL", " not null"]))
        pad = draw(st.sampled_from(["", " ", "  "]))
        fields.append(f"{pad}{name}{between}{kind}{not_null}{pad}")
    return ",".join(fields)


@pytest.mark.spark
@settings(max_examples=150, deadline=None)
@given(ddl=ddls())
def test_it_reads_what_spark_reads(spark: Any, ddl: str) -> None:
    mine = simple_schema(ddl)
    assert mine is not None, ddl
    assert mine == StructType.fromDDL(ddl), ddl


@pytest.mark.parametrize(
    "ddl",
    [
        "a DECIMAL(10,2)",  # parameterised types
        "a ARRAY<INT>",
        "a STRUCT<b: INT>",
        "a INT COMMENT 'the a'",
        "a INT,",  # a syntax error: Spark says what is wrong
        "a INT b STRING",
        "a BOOL",  # not a Spark type: Spark names it
        "a VARCHAR(3)",
        "INT",  # a type, not a list of fields
        "",
        "`a,b` INT",
    ],
)
def test_what_is_not_a_list_of_primitive_fields_is_left_to_spark(ddl: str) -> None:
    assert simple_schema(ddl) is None


@given(st.text(max_size=40))
def test_any_text_is_read_or_left_to_spark_and_never_raises(text: str) -> None:
    found = simple_schema(text)
    assert found is None or (isinstance(found, StructType) and len(found.fields) >= 1)
