"""riverbed's Spark SQL expressions give exactly what Spark gives.

Every supported operator and function (``riverbed.stream.expressions.SUPPORTED``) is in
``EXPRESSIONS``; Hypothesis generates rows — NULLs, integer and double edges, strings
that are and are not numbers — and each expression is evaluated over them by Spark
(``selectExpr`` on the tests' session, ANSI as Spark 4 runs by default) and by riverbed.
Values and types must be equal. Where riverbed says a row fails (an overflow, a
division by zero, a CAST of a string that is not a number), Spark must fail on that row
alone, and not on the others."""

from __future__ import annotations

import math
import os
import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.stream.expressions import (
    SUPPORTED,
    ExpressionError,
    arrow_type,
    compile_expression,
    spark_type,
)

SCHEMA = pa.schema(
    [
        ("i", pa.int32()),
        ("l", pa.int64()),
        ("d", pa.float64()),
        ("s", pa.string()),
        ("b", pa.bool_()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
TYPES = {f.name: spark_type(f.type) for f in SCHEMA}

EXPRESSIONS = [
    # arithmetic: integers (ANSI overflow), doubles, decimals, division, remainders
    "i + 1", "i + i", "l + l", "l - i", "i * i", "l * 3", "i - 2147483647", "-i", "-l",
    "d + i", "d * 2.5e0", "d - l", "i / 3", "l / i", "d / d", "i % 7", "l % i", "d % 2.0",
    "l div 3", "i div i",
    "l * 0.908", "i + 1.25", "l - 0.5", "i * 100.01", "0.1 + 0.2",
    "abs(i)", "abs(l)", "abs(d)", "floor(d)", "ceil(d)", "floor(i)",
    # comparisons and logic (three-valued), NULL-safe equality, NaN's order
    "i = l", "d < 1.5", "d >= d", "d = d", "s = 'a'", "s <> 'b'", "l >= i", "i != 3",
    "l > 0.5", "d <=> d", "s <=> 'x'", "i <=> NULL",
    "b AND i > 0", "b OR l < 0", "NOT b", "NOT (i > 0 AND b)",
    "i IS NULL", "s IS NOT NULL", "i IN (1, 2, NULL)", "s IN ('a', 'b')", "d IN (0.0, 1.5)",
    "i NOT IN (1, 2)", "l BETWEEN -5 AND 5", "d BETWEEN 0 AND 1",
    "s LIKE 'a%'", "s LIKE '_b%'", "s NOT LIKE '%c'", "s LIKE '%'",
    # conditionals: a branch not taken cannot fail a row
    "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' ELSE 'zero' END",
    "CASE WHEN d > 0 THEN l ELSE i END", "CASE WHEN i <> 0 THEN l / i ELSE -1 END",
    "CASE WHEN b THEN s END", "if(b, i, l)", "if(i = 0, NULL, l div i)",
    "coalesce(i, l, 0)", "coalesce(s, 'none')", "coalesce(i, l * l)",
    "i > 0 AND l / i > 1", "i = 0 OR l div i > 1",
    # casts: ANSI CAST fails a row, TRY_CAST gives NULL
    "cast(s as int)", "cast(s as bigint)", "cast(s as double)", "cast(s as boolean)",
    "try_cast(s as int)", "try_cast(s as double)", "cast(d as int)", "cast(d as bigint)",
    "cast(i as string)", "cast(l as string)", "cast(b as string)", "cast(l as double)",
    "cast(b as int)", "cast(i as boolean)", "cast(l as int)", "cast(i as decimal(12, 2))",
    "cast(l * 0.5 as double)", "10L + i", "1.5D * i",
    # strings
    "lower(s)", "upper(s)", "length(s)", "trim(s)", "substring(s, 2, 3)", "substring(s, -2)",
    "substr(s, 0, 2)", "substring(s, -5, 2)", "concat(s, '-', s)", "concat(s, NULL)",
    "regexp_extract(s, '([a-c]+)(\\\\d*)', 2)", "regexp_extract(s, 'b+', 0)",
    "regexp_extract(s, '^(a)?b', 1)",
    "replace(s, 'a', 'xy')", "replace(s, '1')", "replace(s, '', 'z')",
    "length(s) - length(replace(s, 'c', ''))",
    # one part of a split string (ANSI: an index past the parts fails [i] and element_at)
    "split(s, '/')[1]", "element_at(split(s, '/'), 2)", "element_at(split(s, '/'), -1)",
    "try_element_at(split(s, '[/.]+'), 3)", "try_element_at(split(s, '/'), -4)",
    "get(split(s, 'b'), 0)", "get(split(s, '/'), -1)", "split(s, '/', 2)[1]",
    "get(split(s, '/', -1), 2)", "get(split(s, '^a'), 0)",
    "split_part(s, '/', 2)", "split_part(s, '.', -1)", "split_part(s, '', 1)",
    "split_part(s, 'ab', -2)",
    # times (the session's time zone is UTC)
    "year(ts)", "month(ts)", "day(ts)", "dayofmonth(ts)", "hour(ts)", "minute(ts)",
    "second(ts)",
]  # fmt: skip

INTS = st.one_of(
    st.none(),
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 1, -1, 7, -7, 2**31 - 1, -(2**31)]),
)
LONGS = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-10, 10),
    st.sampled_from([0, 2**63 - 1, -(2**63), 2**31, 2**53 + 1]),
)
DOUBLES = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5, -2.5, 0.5, 1e300, float("nan"), 2.0**63]),
)
TEXT = st.one_of(
    st.none(),
    st.text(alphabet="abc123 +-.eEé/", max_size=8),
    st.sampled_from(
        [
            "",
            " 42 ",
            "-7",
            "1e3",
            "2.5",
            "abc",
            "true",
            "NaN",
            "Infinity",
            "99999999999",
            "  b ",
            "ab12",
            "t",
            "no",
        ]
    ),
)
TIMES = st.one_of(
    st.none(),
    st.datetimes(
        # naive bounds, as Hypothesis asks; the values get UTC
        min_value=datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None),
        max_value=datetime(2100, 1, 1, tzinfo=UTC).replace(tzinfo=None),
        timezones=st.just(UTC),
    ),
)
ROWS = st.lists(st.tuples(INTS, LONGS, DOUBLES, TEXT, st.booleans() | st.none(), TIMES),
                min_size=1, max_size=12)  # fmt: skip


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)], SCHEMA)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same Python type (NaN equals NaN; -0.0 equals 0.0)."""
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def _spark_fails(spark: Any, table: pa.Table, text: str) -> bool:
    try:
        spark.createDataFrame(table).selectExpr(f"{text} AS e").toArrow()
    except Exception as exc:  # Spark's ANSI errors come as several classes
        return "Exception" in type(exc).__name__ or "Error" in type(exc).__name__
    return False


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    return {text: compile_expression(text, TYPES) for text in EXPRESSIONS}


CHECKS = 4  # failed rows checked by Spark alone, per example
EXAMPLES = int(os.environ.get("RIVERBED_EXPRESSION_EXAMPLES", "25"))  # more: a longer hunt


@pytest.mark.spark
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=ROWS)
def test_every_supported_expression_gives_what_spark_gives(
    spark: Any, compiled: dict[str, Any], rows: list[tuple[Any, ...]]
) -> None:
    table = _table(rows)
    failed_any: dict[str, list[int]] = {}
    ours: dict[str, list[Any]] = {}
    for text, expression in compiled.items():
        values, why = expression.evaluate(table)
        failures = [i for i, w in enumerate(why.to_pylist()) if w is not None]
        failed_any[text] = failures
        ours[text] = values.to_pylist()
    # the rows no expression fails: Spark evaluates every expression over them at once
    clean = [i for i in range(len(rows)) if not any(i in f for f in failed_any.values())]
    if clean:
        subset = table.take(clean)
        result = (
            spark.createDataFrame(subset)
            .selectExpr(*[f"{t} AS e{n}" for n, t in enumerate(EXPRESSIONS)])
            .toArrow()
        )
        for n, text in enumerate(EXPRESSIONS):
            field = result.schema.field(f"e{n}")
            assert field.type == arrow_type(compiled[text].type) or (
                pa.types.is_timestamp(field.type) and compiled[text].type.name == "timestamp"
            ), (text, field.type, compiled[text].type)
            theirs = result.column(f"e{n}").to_pylist()
            mine = [ours[text][i] for i in clean]
            for row, a, b in zip(clean, mine, theirs, strict=True):
                assert _same(a, b), (text, rows[row], a, b)
    # a failed row: Spark fails on it alone (a Spark job each: a few per example, drawn
    # by the example, so that over the run every kind of failure is checked)
    failing = sorted(text for text, failures in failed_any.items() if failures)
    for text in random.Random(repr(rows)).sample(failing, min(CHECKS, len(failing))):
        lone = table.take([failed_any[text][0]])
        assert _spark_fails(spark, lone, text), (text, rows[failed_any[text][0]])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nope + 1", "no column 'nope'; the events have i, l, d, s, b, ts"),
        ("foo(i)", "FOO is not supported"),
        ("i + 'a'", "int and string do not mix"),
        ("s > 1", "string and int cannot be compared"),
        ("i AND b", "i is int, not boolean"),
        ("l * 0.1234567890123456789012345", "past Spark's 38"),
        ("l / 0.5", "decimal division is not supported"),
        ("regexp_extract(s, '(a', 1)", "does not compile"),
        ("regexp_extract(s, '(a)', 2)", "has 1 group(s), not 2"),
        ("i +", "is not a Spark SQL expression"),
        ("(SELECT 1)", "is not supported"),
        ("cast(ts as int)", "CAST from timestamp to int is not supported"),
        ("split(s, '/')", "SPLIT gives an array"),
        ("split(s, 'x*')[0]", "matches the empty string is not supported"),
        ("element_at(split(s, '/'), 0)", "start at 1, not 0"),
        ("split(s, '/')[i]", "must be an integer literal"),
        ("replace(s, s)", "REPLACE needs string literals"),
        ("split_part(s, '/', 0)", "non-zero integer literal"),
    ],
)
def test_what_riverbed_cannot_evaluate_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ExpressionError) as refused:
        compile_expression(text, TYPES)
    message = str(refused.value)
    assert says in message and "\n" not in message, message


def test_the_supported_list_names_every_family_the_test_covers() -> None:
    families = ["CASE WHEN", "COALESCE", "CAST", "REGEXP_EXTRACT", "SUBSTRING", "HOUR", "LIKE"]
    families += ["REPLACE", "SPLIT", "SPLIT_PART", "element_at", "try_element_at", "get"]
    for name in families:
        assert name in SUPPORTED


def test_a_failing_row_names_the_expression_and_a_branch_not_taken_fails_nothing() -> None:
    table = _table([(1, 2**62, 0.0, "x", True, None), (0, 5, 1.0, "7", False, None)])
    values, why = compile_expression("l * 4", TYPES).evaluate(table)
    assert values.to_pylist() == [None, 20]
    assert why.to_pylist() == ["integer overflow in l * 4", None]
    values, why = compile_expression("CASE WHEN i = 0 THEN 0 ELSE l div i END", TYPES).evaluate(
        table
    )
    assert values.to_pylist() == [2**62, 0] and why.null_count == 2
    values, why = compile_expression("cast(s as int)", TYPES).evaluate(table)
    assert values.to_pylist() == [None, 7] and why.to_pylist()[0].startswith("a value that is")
    assert compile_expression("0.908", TYPES).type.precision == 3
    assert Decimal("0.908") == compile_expression("0.908", TYPES).evaluate(table)[0][0].as_py()


PLAIN_TEXTS = st.lists(
    st.one_of(
        st.none(),
        st.integers(-(10**18) + 1, 10**18 - 1).map(str),
        st.sampled_from(["007", "-0", "2147483647", "2147483648", "-2147483649", "0"]),
    ),
    min_size=1,
    max_size=30,
)


@given(texts=PLAIN_TEXTS)
def test_a_cast_of_plain_integer_texts_at_once_gives_what_row_by_row_gives(
    texts: list[str | None],
) -> None:
    """Texts that are all plain integers (a key's text of ids) are cast by Arrow at once;
    the answer — values, NULLs, the rows that fail — is the row-by-row path's, which
    the test above holds to Spark's."""
    from riverbed.stream.expressions import _converter, _plain_integers

    table = pa.table({"s": pa.array(texts, pa.string())})
    for text in ("cast(s as int)", "cast(s as bigint)", "try_cast(s as int)"):
        node = compile_expression(text, {"s": TYPES["s"]})
        values, why = node.evaluate(table)
        to = node.type
        assert _plain_integers(to)(table.column("s").combine_chunks(), True) is not None
        slow = _converter(TYPES["s"], to)
        want = [None if t is None else slow(t) for t in texts]
        assert values.to_pylist() == want, text
        failed = [i for i, w in enumerate(why.to_pylist()) if w is not None]
        pairs = enumerate(zip(texts, want, strict=True))
        expect = [i for i, (t, w) in pairs if t is not None and w is None]
        if text.startswith("try"):
            expect = []
        assert failed == expect, text


@settings(max_examples=40, deadline=None)
@given(rows=ROWS)
def test_a_batch_of_repeated_values_gives_what_each_row_alone_gives(
    compiled: dict[str, Any], rows: list[tuple[Any, ...]]
) -> None:
    """Per-value functions (regexes, splits, substrings) run once per distinct string when
    a batch repeats them (``expressions._each``): the answer — values and failed rows —
    is the one the rows give each alone, which the Spark test holds to Spark's."""
    table = _table(rows)
    repeated = pa.concat_tables([table] * (64 // len(rows) + 1))
    for text, node in compiled.items():
        values, why = node.evaluate(table)
        many, many_why = node.evaluate(repeated)
        times = repeated.num_rows // table.num_rows
        pairs = zip(many.to_pylist(), values.to_pylist() * times, strict=True)
        assert all(_same(a, b) for a, b in pairs), text
        failed = [w is not None for w in why.to_pylist()]
        assert [w is not None for w in many_why.to_pylist()] == failed * times, text
