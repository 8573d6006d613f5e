"""Spark SQL expressions on Arrow batches: an aggregation's ``where`` and ``columns``.

(Over 600 lines: one evaluator — the typed nodes, Spark's type rules and the operator
and function table build each other while compiling, and one test module checks all of
it against Spark; the SQL types would go first if it were split.)

Users write Spark SQL (``where="price > 100 AND channel <> 'spam'"``,
``columns={"dollars": "price * 0.908"}``), because that is what they already write. On
the log-native path events never enter the JVM, so riverbed evaluates the expressions
itself, on the tasks' Arrow batches; the DataFrame path runs the same evaluator (a
``mapInArrow`` step), so every path gives the same answer. The answer is Spark's:
``tests/stream/test_expressions.py`` evaluates every supported operator and function
on generated rows (NULLs and edge values included) with Spark and with this module.

How: :func:`compile_expression` parses with ``sqlglot`` (Spark dialect) into a tree of
typed nodes — Spark's own type rules (an integer literal is an INT, ``0.908`` a
DECIMAL(3,3), ``/`` gives a DOUBLE, ``%`` the wider integer type) — and refuses at
start, in one line naming it, anything it does not support or that does not type
(an unknown column, ``'a' + 1``, an unsupported function). Evaluation is vectorized
with ``pyarrow.compute``; regular expressions run Python's ``re`` per value (Java's and
Python's syntax agree on what is supported here; RE2's do not).

Errors: Spark 4 runs ANSI SQL — an integer overflow, a division by zero or a string
that is not a number under ``CAST`` fail the query. A stream must not stop on one bad
row, so here such a row is *malformed*: its reason names the expression and the error,
and it is counted and sent to the dead-letter topic like any malformed record. As in
Spark, a part of an expression that is not evaluated for a row cannot fail it: the
right side of ``AND`` where the left is false, of ``OR`` where it is true, a ``CASE``
branch not taken, a ``COALESCE`` argument after a non-null one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverbed.stream.errors import StreamValueError

__all__ = [
    "SUPPORTED",
    "Compiled",
    "ExpressionError",
    "arrow_type",
    "compile_expression",
    "spark_type",
]


class ExpressionError(StreamValueError):
    """An expression riverbed cannot evaluate exactly as Spark does, or that does not
    type: refused at start."""


# -- types -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SqlType:
    """A Spark SQL type: boolean, int, bigint, double, string, timestamp, decimal(p, s),
    or void (the type of a bare NULL)."""

    name: str
    precision: int = 0
    scale: int = 0

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return self.name

    @property
    def numeric(self) -> bool:
        return self.name in ("int", "bigint", "double", "decimal")

    @property
    def integral(self) -> bool:
        return self.name in ("int", "bigint")


BOOLEAN, INT, BIGINT = SqlType("boolean"), SqlType("int"), SqlType("bigint")
DOUBLE, STRING, TIMESTAMP = SqlType("double"), SqlType("string"), SqlType("timestamp")
VOID = SqlType("void")
_BOUNDS = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
_MAX_PRECISION = 38


def decimal(precision: int, scale: int) -> SqlType:
    return SqlType("decimal", precision, scale)


def arrow_type(t: SqlType) -> pa.DataType:
    """The Arrow type that holds values of ``t``."""
    if t.name == "decimal":
        return pa.decimal128(t.precision, t.scale)
    return {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "double": pa.float64(),
        "string": pa.string(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "void": pa.null(),
    }[t.name]


def spark_type(t: pa.DataType) -> SqlType | None:
    """The Spark SQL type of an Arrow column (``None``: not one expressions can use)."""
    if pa.types.is_boolean(t):
        return BOOLEAN
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return INT
    if pa.types.is_int64(t):
        return BIGINT
    if pa.types.is_floating(t):
        return DOUBLE
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return STRING
    if pa.types.is_timestamp(t):
        return TIMESTAMP
    if pa.types.is_decimal(t):
        return decimal(t.precision, t.scale)
    if pa.types.is_null(t):
        return VOID
    return None


def _as_decimal(t: SqlType) -> SqlType:
    """An integral type as the decimal Spark widens it to (INT 10 digits, BIGINT 20)."""
    return {"int": decimal(10, 0), "bigint": decimal(20, 0)}.get(t.name, t)


def _wider(a: SqlType, b: SqlType, what: str) -> SqlType:
    """The common type of two operands (Spark's numeric widening); ``what`` names the
    expression in an error."""
    if a == VOID:
        return b
    if b == VOID or a == b:
        return a
    if a.numeric and b.numeric:
        if DOUBLE in (a, b):
            return DOUBLE
        if a.integral and b.integral:
            return BIGINT
        da, db = _as_decimal(a), _as_decimal(b)
        scale = max(da.scale, db.scale)
        digits = max(da.precision - da.scale, db.precision - db.scale)
        return _bounded(digits + scale, scale, what)
    raise ExpressionError(f"{what}: {a} and {b} do not mix; cast one of them")


def _bounded(precision: int, scale: int, what: str) -> SqlType:
    if precision > _MAX_PRECISION:
        raise ExpressionError(
            f"{what}: a decimal of {precision} digits is past Spark's 38, where Spark "
            "rounds it (riverbed does not); cast an operand to double"
        )
    return decimal(precision, scale)


# -- evaluation --------------------------------------------------------------------------

Errors = np.ndarray  # bool per row: evaluating this row failed (Spark's ANSI error)


@dataclass
class Value:
    """A node's values for a batch, and the rows whose evaluation failed, with why."""

    array: pa.Array
    failed: Errors | None = None  # None: none
    why: str = ""


class Node:
    type: SqlType
    text: str

    def evaluate(self, batch: pa.Table) -> Value:
        raise NotImplementedError


def _fail(value: Value, failed: np.ndarray, why: str) -> Value:
    """``value`` with ``failed`` rows added to its failures (the first reason kept)."""
    if not failed.any():
        return value
    if value.failed is None:
        return Value(value.array, failed, why)
    return Value(value.array, value.failed | failed, value.why or why)


def _merge(array: pa.Array, parts: Sequence[tuple[Value, np.ndarray | None]]) -> Value:
    """``array`` failing where any part failed on the rows it was evaluated for (a mask
    of None: all rows)."""
    out = Value(array)
    for part, mask in parts:
        if part.failed is not None:
            failed = part.failed if mask is None else part.failed & mask
            out = _fail(out, failed, part.why)
    return out


def _mask(array: pa.Array, want: bool) -> np.ndarray:
    """Rows where a boolean array is ``want`` (NULL is neither)."""
    filled = pc.fill_null(array, not want)
    mask: np.ndarray = np.asarray(filled.to_numpy(zero_copy_only=False), dtype=bool)
    return mask if want else ~mask


def _null_mask(array: pa.Array) -> np.ndarray:
    mask: np.ndarray = np.asarray(pc.is_null(array).to_numpy(zero_copy_only=False), dtype=bool)
    return mask


@dataclass
class ColumnRef(Node):
    name: str
    type: SqlType
    text: str

    def evaluate(self, batch: pa.Table) -> Value:
        column = batch.column(self.name)
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        want = arrow_type(self.type)
        if array.type != want:
            array = array.cast(want)
        return Value(array)


@dataclass
class Literal(Node):
    value: Any
    type: SqlType
    text: str

    def evaluate(self, batch: pa.Table) -> Value:
        scalar = pa.scalar(self.value, arrow_type(self.type))
        return Value(
            pa.repeat(scalar, batch.num_rows) if batch.num_rows else pa.array([], scalar.type)
        )


@dataclass
class Apply(Node):
    """An operator or function over already evaluated arguments: ``run`` gets their
    arrays and returns the result and its failed rows (or None)."""

    args: list[Node]
    type: SqlType
    text: str
    run: Callable[[list[pa.Array]], tuple[pa.Array, np.ndarray | None]]
    error: str = ""

    def evaluate(self, batch: pa.Table) -> Value:
        values = [a.evaluate(batch) for a in self.args]
        array, failed = self.run([v.array for v in values])
        out = _merge(array, [(v, None) for v in values])
        if failed is not None:
            out = _fail(out, failed, f"{self.error} in {self.text}")
        return out


@dataclass
class Logic(Node):
    """AND / OR: three-valued, and the right side fails a row only where Spark
    evaluates it (the left is not false for AND, not true for OR)."""

    op: str
    left: Node
    right: Node
    text: str
    type: SqlType = BOOLEAN

    def evaluate(self, batch: pa.Table) -> Value:
        left, right = self.left.evaluate(batch), self.right.evaluate(batch)
        if self.op == "and":
            array, evaluated = pc.and_kleene(left.array, right.array), ~_mask(left.array, False)
        else:
            array, evaluated = pc.or_kleene(left.array, right.array), ~_mask(left.array, True)
        return _merge(array, [(left, None), (right, evaluated)])


@dataclass
class Case(Node):
    """CASE WHEN c1 THEN v1 ... ELSE e END (IF, and COALESCE as a chain of them): a
    branch's failures count only for the rows that take it."""

    conditions: list[Node]
    values: list[Node]
    otherwise: Node | None
    type: SqlType
    text: str

    def evaluate(self, batch: pa.Table) -> Value:
        n = batch.num_rows
        result = pa.nulls(n, arrow_type(self.type))
        undecided = np.ones(n, dtype=bool)
        parts: list[tuple[Value, np.ndarray | None]] = []
        for condition, value in zip(self.conditions, self.values, strict=True):
            cond = condition.evaluate(batch)
            parts.append((cond, undecided.copy()))
            taken = undecided & _mask(cond.array, True)
            val = value.evaluate(batch)
            parts.append((val, taken))
            result = pc.if_else(pa.array(taken), _cast(val.array, self.type), result)
            undecided &= ~taken
        if self.otherwise is not None:
            val = self.otherwise.evaluate(batch)
            parts.append((val, undecided))
            result = pc.if_else(pa.array(undecided), _cast(val.array, self.type), result)
        return _merge(result, parts)


def _cast(array: pa.Array, t: SqlType) -> pa.Array:
    """``array`` as ``t``'s Arrow type: a widening (Spark's implicit casts), so an integer
    past 2**53 becomes the nearest double as in Java (Arrow's safe cast refuses it)."""
    want = arrow_type(t)
    if array.type == want:
        return array
    return array.cast(want, safe=not pa.types.is_floating(want))


# -- the operators and functions -----------------------------------------------------------


def _overflowed(t: SqlType, exact: Any) -> np.ndarray | None:
    """Rows where integer arithmetic left ``t``'s range (Spark ANSI: an error), from the
    result computed in Python ints (``exact``)."""
    low, high = _BOUNDS[t.name]
    failed = np.array([v is not None and not low <= v <= high for v in exact], dtype=bool)
    return failed if failed.any() else None


def _integer_op(op: Callable[[int, int], int], t: SqlType) -> Callable[[list[pa.Array]], Any]:
    """+ - * on integers: exact, failing the rows that overflow ``t`` (ANSI)."""
    checked = {"add": "add_checked", "subtract": "subtract_checked", "multiply": "multiply_checked"}

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
        a, b = (x.cast(arrow_type(t)) for x in arrays)
        try:
            return pc.call_function(checked[op.__name__], [a, b]), None
        except pa.ArrowInvalid:  # an overflow somewhere: find which rows, null them
            exact = [
                None if x is None or y is None else op(x, y)
                for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)
            ]
            failed = _overflowed(t, exact)
            assert failed is not None
            low, high = _BOUNDS[t.name]
            kept = [v if v is not None and low <= v <= high else None for v in exact]
            return pa.array(kept, arrow_type(t)), failed

    return run


def add(x: int, y: int) -> int:
    return x + y


def subtract(x: int, y: int) -> int:
    return x - y


def multiply(x: int, y: int) -> int:
    return x * y


def _arith(name: str, left: Node, right: Node, text: str) -> Node:
    t = _wider(left.type, right.type, text)
    if t == VOID:
        t = INT
    if not t.numeric:
        raise ExpressionError(f"{text}: {name} needs numbers, not {left.type} and {right.type}")
    if t.integral:
        op = {"+": add, "-": subtract, "*": multiply}[name]
        return Apply([left, right], t, text, _integer_op(op, t), "integer overflow")
    if t == DOUBLE:
        fn = {"+": pc.add, "-": pc.subtract, "*": pc.multiply}[name]
        return Apply(
            [left, right], DOUBLE, text, lambda a: (fn(*(_cast(x, DOUBLE) for x in a)), None)
        )
    # decimals: Spark's result types (before its 38-digit cap, refused in _bounded)
    da, db = _as_decimal(left.type), _as_decimal(right.type)
    if name == "*":
        out = _bounded(da.precision + db.precision + 1, da.scale + db.scale, text)
    else:
        scale = max(da.scale, db.scale)
        out = _bounded(
            max(da.precision - da.scale, db.precision - db.scale) + scale + 1, scale, text
        )
    fn = {"+": pc.add, "-": pc.subtract, "*": pc.multiply}[name]

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        a, b = _cast(arrays[0], da), _cast(arrays[1], db)
        return fn(a, b).cast(arrow_type(out)), None

    return Apply([left, right], out, text, run)


def _divide(left: Node, right: Node, text: str) -> Node:
    """``/``: Spark divides integers and doubles as doubles; by zero: an error (ANSI)."""
    for side in (left, right):
        if side.type.name == "decimal":
            raise ExpressionError(f"{text}: decimal division is not supported; cast to double")
        if not (side.type.numeric or side.type == VOID):
            raise ExpressionError(f"{text}: / needs numbers, not {side.type}")

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
        a, b = _cast(arrays[0], DOUBLE), _cast(arrays[1], DOUBLE)
        zero = _mask(pc.equal(b, 0.0), True)
        safe_b = pc.if_else(pa.array(zero), pa.scalar(None, pa.float64()), b)
        return pc.divide(a, safe_b), (zero & ~_null_mask(a)) if zero.any() else None

    return Apply([left, right], DOUBLE, text, run, "division by zero")


def _integral_division(name: str, left: Node, right: Node, text: str) -> Node:
    """``%`` (the wider integer type; the dividend's sign, as Java) and ``div``
    (BIGINT, toward zero); by zero: an error (ANSI). ``%`` of doubles: fmod."""
    t = _wider(left.type, right.type, text)
    if t == VOID:
        t = INT
    if name == "div" and not t.integral:
        raise ExpressionError(f"{text}: div needs integers, not {left.type} and {right.type}")
    if not (t.integral or t == DOUBLE):
        raise ExpressionError(
            f"{text}: % needs integers or doubles, not {left.type} and {right.type}"
        )
    out = BIGINT if name == "div" else t

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
        a, b = _cast(arrays[0], t), _cast(arrays[1], t)
        absent = _null_mask(a) | _null_mask(b)
        if t == DOUBLE:
            x = pc.fill_null(a, 0.0).to_numpy(zero_copy_only=False)
            y = pc.fill_null(b, 1.0).to_numpy(zero_copy_only=False)
            zero = (y == 0.0) & ~absent
            with np.errstate(invalid="ignore", divide="ignore"):
                # C's fmod, which is Java's % (NaN for an infinite dividend, the
                # dividend for an infinite divisor)
                values = np.fmod(x, np.where(zero, 1.0, y))
            return _with_nulls(values, absent | zero, pa.float64()), zero if zero.any() else None
        x = pc.fill_null(a, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        y = pc.fill_null(b, 1).to_numpy(zero_copy_only=False).astype(np.int64)
        zero = (y == 0) & ~absent
        # MIN_LONG % -1 is 0 (and MIN_LONG div -1 overflows): never asked of numpy
        over = (x == _BOUNDS["bigint"][0]) & (y == -1)
        y = np.where((y == 0) | over, 1, y)
        remainder = np.fmod(x, y)  # the dividend's sign, as Java
        if name == "div":
            failed = zero | (over & ~absent)
            values = (x - remainder) // y  # exact: a multiple of y
            result = _with_nulls(values, absent | failed, pa.int64())
            return result, failed if failed.any() else None
        return (
            _with_nulls(remainder, absent | zero, arrow_type(t)),
            zero if zero.any() else None,
        )

    return Apply([left, right], out, text, run, "division by zero")


def _with_nulls(values: np.ndarray, null: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.array(values, mask=null).cast(kind)


_COMPARE = {"=": pc.equal, "<>": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
            ">": pc.greater, ">=": pc.greater_equal}  # fmt: skip


def _compare(op: str, left: Node, right: Node, text: str) -> Node:
    t = _comparable(left.type, right.type, text)
    fn = _COMPARE[op]

    def run(a: list[pa.Array]) -> tuple[pa.Array, None]:
        x, y = _cast(a[0], t), _cast(a[1], t)
        if t == DOUBLE:
            return _nan_compare(op, x, y), None
        return fn(x, y), None

    return Apply([left, right], BOOLEAN, text, run)


def _nan_compare(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    """Spark's order of doubles: NaN equals NaN and is greater than any other value
    (Arrow's comparisons follow IEEE: NaN equals nothing)."""
    nan_x, nan_y = pc.is_nan(x), pc.is_nan(y)
    # rank: NaN above everything; compare (rank, value) lexicographically
    big = pa.scalar(0.0)
    xv = pc.if_else(nan_x, big, x)
    yv = pc.if_else(nan_y, big, y)
    rx, ry = pc.cast(nan_x, pa.int8()), pc.cast(nan_y, pa.int8())
    lt = pc.or_(pc.less(rx, ry), pc.and_(pc.equal(rx, ry), pc.less(xv, yv)))
    eq = pc.and_(pc.equal(rx, ry), pc.equal(xv, yv))
    out = {
        "=": eq,
        "<>": pc.invert(eq),
        "<": lt,
        "<=": pc.or_(lt, eq),
        ">": pc.invert(pc.or_(lt, eq)),
        ">=": pc.invert(lt),
    }[op]
    return out


def _comparable(a: SqlType, b: SqlType, text: str) -> SqlType:
    if a == b or VOID in (a, b):
        return b if a == VOID else a
    if a.numeric and b.numeric:
        return _wider(a, b, text)
    raise ExpressionError(f"{text}: {a} and {b} cannot be compared; cast one of them")


def _null_safe_equal(left: Node, right: Node, text: str) -> Node:
    t = _comparable(left.type, right.type, text)

    def run(a: list[pa.Array]) -> tuple[pa.Array, None]:
        x, y = _cast(a[0], t), _cast(a[1], t)
        both = pc.and_(pc.is_null(x), pc.is_null(y))
        equal = _nan_compare("=", x, y) if t == DOUBLE else pc.equal(x, y)
        return pc.fill_null(pc.or_(pc.fill_null(equal, False), both), False), None

    return Apply([left, right], BOOLEAN, text, run)


def _not(arg: Node, text: str) -> Node:
    _need(arg, BOOLEAN, text)
    return Apply([arg], BOOLEAN, text, lambda a: (pc.invert(a[0]), None))


def _need(node: Node, t: SqlType, text: str) -> None:
    if node.type not in (t, VOID):
        raise ExpressionError(f"{text}: {node.text} is {node.type}, not {t}")


def _in(arg: Node, options: list[Node], text: str) -> Node:
    """x IN (a, b, ...): true if equal to one; else NULL if x or any option is NULL."""
    t = arg.type
    for o in options:
        t = _comparable(t, o.type, text)

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        x = _cast(arrays[0], t)
        found = pa.repeat(pa.scalar(False), len(x))
        for option in arrays[1:]:
            y = _cast(option, t)
            found = pc.or_kleene(found, _nan_compare("=", x, y) if t == DOUBLE else pc.equal(x, y))
        return found, None

    return Apply([arg, *options], BOOLEAN, text, run)


def _like(arg: Node, pattern: Node, text: str, negate: bool) -> Node:
    if not isinstance(pattern, Literal) or pattern.type != STRING:
        raise ExpressionError(f"{text}: LIKE needs a string literal pattern")
    _need(arg, STRING, text)

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        matched = pc.match_like(arrays[0], pattern.value)
        return (pc.invert(matched) if negate else matched), None

    return Apply([arg], BOOLEAN, text, run)


def _is_null(arg: Node, text: str) -> Node:
    return Apply([arg], BOOLEAN, text, lambda a: (pc.is_null(a[0]), None))


def _cast_node(arg: Node, to: SqlType, text: str, safe: bool) -> Node:
    """CAST (ANSI: a value that does not convert fails its row) and TRY_CAST (NULL)."""
    source = arg.type
    if to == source or source == VOID:
        return Apply([arg], to, text, lambda a: (_cast(a[0], to), None))
    allowed = {
        ("int", "bigint"), ("bigint", "int"), ("int", "double"), ("bigint", "double"),
        ("double", "int"), ("double", "bigint"), ("int", "string"), ("bigint", "string"),
        ("boolean", "string"), ("string", "int"), ("string", "bigint"), ("string", "double"),
        ("string", "boolean"), ("boolean", "int"), ("boolean", "bigint"), ("int", "boolean"),
        ("bigint", "boolean"), ("decimal", "double"), ("int", "decimal"), ("bigint", "decimal"),
    }  # fmt: skip
    if (source.name, to.name) not in allowed:
        raise ExpressionError(f"{text}: CAST from {source} to {to} is not supported")
    convert = _converter(source, to)
    plain = _plain_integers(to) if source == STRING and to.integral else None

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
        if plain is not None:  # texts of plain integers (ids: a key's text): at once
            got = plain(arrays[0], safe)
            if got is not None:
                return got
        values, failed = [], np.zeros(len(arrays[0]), dtype=bool)
        for i, v in enumerate(arrays[0].to_pylist()):
            out = None if v is None else convert(v)
            if v is not None and out is None:
                failed[i] = not safe
            values.append(out)
        return pa.array(values, arrow_type(to)), failed if failed.any() else None

    article = "an" if to.name[0] in "aeiou" else "a"
    return Apply([arg], to, text, run, f"a value that is not {article} {to}")


_PLAIN_INTEGER = r"^-?[0-9]{1,18}$"  # Arrow parses these as Spark does; 18 digits fit


def _plain_integers(
    to: SqlType,
) -> Callable[[pa.Array, bool], tuple[pa.Array, np.ndarray | None] | None]:
    """CAST of texts to ``to`` by Arrow, when every text is a plain integer (no sign
    but ``-``, no space, at most 18 digits) or NULL — what a key's text of an id is;
    None otherwise (the row-by-row path gives Spark's answer for the rest)."""
    low, high = _BOUNDS[to.name]

    def run(array: pa.Array, safe: bool) -> tuple[pa.Array, np.ndarray | None] | None:
        if not pc.all(pc.fill_null(pc.match_substring_regex(array, _PLAIN_INTEGER), True)).as_py():
            return None
        ints = pc.cast(array, pa.int64())
        fits = pc.fill_null(pc.and_(pc.greater_equal(ints, low), pc.less_equal(ints, high)), True)
        if pc.all(fits).as_py():
            return ints.cast(arrow_type(to)), None
        out = pc.if_else(fits, ints, pa.scalar(None, pa.int64())).cast(arrow_type(to))
        failed = ~fits.to_numpy(zero_copy_only=False)  # (a NULL text fits: it stays NULL)
        return out, None if safe else failed

    return run


def _converter(source: SqlType, to: SqlType) -> Callable[[Any], Any]:
    """One value from ``source`` to ``to`` as Spark's ANSI CAST does; None: it cannot."""

    def in_range(v: int) -> int | None:
        low, high = _BOUNDS[to.name]
        return v if low <= v <= high else None

    if to.integral:
        if source == DOUBLE:
            return lambda v: _double_to_integral(v, to)
        if source == STRING:
            return lambda v: _parse_int(v, in_range)
        if source == BOOLEAN:
            return lambda v: int(v)
        return in_range
    if to == DOUBLE:
        if source == STRING:
            return _parse_double
        if source.name == "decimal":
            return lambda v: float(v)
        return lambda v: float(v)
    if to == STRING:
        if source == BOOLEAN:
            return lambda v: "true" if v else "false"
        return str
    if to == BOOLEAN:
        if source == STRING:
            return _parse_boolean
        return lambda v: v != 0
    if to.name == "decimal":
        limit = 10 ** (to.precision - to.scale)
        return lambda v: Decimal(v) if abs(v) < limit else None
    raise ExpressionError(f"CAST from {source} to {to} is not supported")


def _double_to_integral(v: float, to: SqlType) -> int | None:
    """Spark's ANSI check, in doubles as Spark does it (``floor(v) <= MAX`` with MAX
    rounded to a double: 2**63 passes and becomes Long.MaxValue, as Java's toLong)."""
    low, high = _BOUNDS[to.name]
    if not math.isfinite(v) or not (math.floor(v) <= float(high) and math.ceil(v) >= float(low)):
        return None
    return max(low, min(high, int(v)))


_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")


def _parse_int(text: str, in_range: Callable[[int], int | None]) -> int | None:
    if not _INT_TEXT.match(text):
        return None
    return in_range(int(text))


_DOUBLE_TEXT = re.compile(r"^\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)[dDfF]?\s*$")


_SPECIAL_DOUBLES = {
    "nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
}


def _parse_double(text: str) -> float | None:
    stripped = text.strip()
    if stripped.lower() in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[stripped.lower()]
    if not _DOUBLE_TEXT.match(text):
        return None
    return float(stripped.rstrip("dDfF"))


def _parse_boolean(text: str) -> bool | None:
    word = text.strip().lower()
    if word in ("t", "true", "y", "yes", "1"):
        return True
    if word in ("f", "false", "n", "no", "0"):
        return False
    return None


def _string_function(fn: Callable[[pa.Array], pa.Array]) -> Callable[[list[pa.Array]], Any]:
    return lambda a: (fn(a[0]), None)


def _each(array: pa.Array, one: Callable[[str], Any], kind: pa.DataType | None = None) -> pa.Array:
    """``one`` of each string (NULL stays NULL), in Python — once per distinct value when
    they repeat (urls, channels: a batch holds few), else once per row; strings unless
    ``kind`` says."""
    kind = pa.string() if kind is None else kind
    if len(array) >= 64:
        encoded = pc.dictionary_encode(array)
        distinct = encoded.dictionary.to_pylist()
        if 2 * len(distinct) <= len(array):
            return pa.array([one(s) for s in distinct], kind).take(encoded.indices)
    return pa.array([None if s is None else one(s) for s in array.to_pylist()], kind)


def _substring(arg: Node, start: Node, length: Node | None, text: str) -> Node:
    """Spark's 1-based SUBSTRING(s, pos[, len]): pos 0 is 1, a negative pos counts from
    the end; as ``UTF8String.substringSQL``."""
    _need(arg, STRING, text)
    for n in (start, length):
        if n is not None and not (isinstance(n, Literal) and n.type.integral):
            raise ExpressionError(f"{text}: SUBSTRING needs integer literals for pos and len")
    pos = int(start.value)  # type: ignore[attr-defined]
    size = int(length.value) if length is not None else 2**31 - 1  # type: ignore[attr-defined]

    def one(s: str) -> str:
        n = len(s)
        first = pos - 1 if pos > 0 else (n + pos if pos < 0 else 0)
        end = min(first + size, 2**31 - 1)
        first = max(first, 0)
        return "" if first >= end else s[first:end]

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        return _each(arrays[0], one), None

    return Apply([arg], STRING, text, run)


def _regex(function: str, arg: Node, pattern: Node, number: Node | None, what: str,
           text: str) -> re.Pattern[str]:  # fmt: skip
    """A regex function's string argument checked, and its regex — a string literal —
    compiled; ``number`` (its group, its limit) an integer literal if given."""
    _need(arg, STRING, text)
    if not isinstance(pattern, Literal) or pattern.type != STRING:
        raise ExpressionError(f"{text}: {function} needs a string literal regex")
    if number is not None and not (isinstance(number, Literal) and number.type.integral):
        raise ExpressionError(f"{text}: {function} needs an integer literal {what}")
    try:
        return re.compile(pattern.value)
    except re.error as exc:
        raise ExpressionError(f"{text}: the regex does not compile ({exc})") from None


def _regexp_extract(arg: Node, pattern: Node, index: Node | None, text: str) -> Node:
    """REGEXP_EXTRACT(s, regex[, idx=1]): the group's text, "" when the regex does not
    match or the group took no part; NULL for a NULL input."""
    compiled = _regex("REGEXP_EXTRACT", arg, pattern, index, "group", text)
    group = 1 if index is None else int(index.value)  # type: ignore[attr-defined]
    if not 0 <= group <= compiled.groups:
        raise ExpressionError(f"{text}: the regex has {compiled.groups} group(s), not {group}")

    def one(s: str) -> str:
        found = compiled.search(s)
        return (found.group(group) or "") if found else ""

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        return _each(arrays[0], one), None

    return Apply([arg], STRING, text, run)


_REGEX_SYNTAX = set(".$|()[]{}^?*+\\")


@dataclass(frozen=True)
class _Split:
    """SPLIT(s, regex[, limit]) as Spark splits a string: Java's ``String.split`` with
    the limit (0 and below: -1, every part, trailing empty ones kept) — a zero-width
    match at the start makes no empty first part. ``literal``: the regex when it is
    plain text (no regex syntax), split by Arrow at once."""

    regex: re.Pattern[str]
    most: int
    literal: str | None

    def __call__(self, s: str) -> list[str]:
        out: list[str] = []
        at = 0
        for found in self.regex.finditer(s):
            if 0 < self.most <= len(out) + 1:
                break
            if at == 0 and found.start() == found.end() == 0:
                continue
            out.append(s[at : found.start()])
            at = found.end()
        if at == 0 and not out:
            return [s]
        out.append(s[at:])
        return out

    def lists(self, strings: pa.Array) -> pa.ListArray:
        """Every string's parts at once (a literal regex only)."""
        assert self.literal is not None
        most = self.most - 1 if self.most > 0 else None
        parts: pa.ListArray = pc.split_pattern(strings, pattern=self.literal, max_splits=most)
        return parts


def _splitter(arg: Node, pattern: Node, limit: Node | None, text: str) -> _Split:
    """:class:`_Split` of SPLIT's arguments. A regex that matches the empty string is
    refused (Java and Python step past empty matches differently)."""
    compiled = _regex("SPLIT", arg, pattern, limit, "limit", text)
    if compiled.search("") is not None:
        raise ExpressionError(
            f"{text}: SPLIT by a regex that matches the empty string is not supported"
        )
    plain = None if set(compiled.pattern) & _REGEX_SYNTAX else compiled.pattern
    return _Split(compiled, int(limit.value) if limit is not None else -1, plain)  # type: ignore[attr-defined]


def _split_at(arg: Node, parts: _Split, index: Node, base: int, missing: str, text: str) -> Node:
    """One part of a split string: ``base`` 0 (``split(…)[i]``, ``get``) or 1
    (``element_at``: a negative index counts from the end); an index past the parts is
    ``missing``: ``"fail"`` (ANSI's error), ``"null"`` (``try_element_at``, ``get``)."""
    if not (isinstance(index, Literal) and index.type.integral):
        raise ExpressionError(f"{text}: the index of a split string must be an integer literal")
    i = int(index.value)
    if base == 1 and i == 0:
        raise ExpressionError(f"{text}: SQL array indices start at 1, not 0")
    fails = missing == "fail"

    def position(count: Any) -> Any:
        """The part's place among ``count`` parts (past them: out of range)."""
        return i - 1 if base == 1 and i > 0 else (count + i if base == 1 else i)

    def pick(s: str) -> dict[str, Any]:
        got = parts(s)
        at = position(len(got))
        if 0 <= at < len(got):
            return {"v": got[at], "f": False}
        return {"v": None, "f": fails}

    kind = pa.struct([("v", pa.string()), ("f", pa.bool_())])

    def at_once(strings: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
        lists = parts.lists(strings)
        given = pc.is_valid(strings).to_numpy(zero_copy_only=False)
        count = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        at = position(count.astype(np.int64))
        inside = given & (at >= 0) & (at < count)
        first = lists.offsets.to_numpy(zero_copy_only=False)[:-1].astype(np.int64)
        where = pa.array(np.where(inside, first + at, 0), mask=~inside)  # (NULL: none)
        values = lists.values.take(where) if inside.any() else pa.nulls(len(strings), pa.string())
        failed = given & ~inside if fails else np.zeros(len(strings), dtype=bool)
        return values, failed if failed.any() else None

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
        if parts.literal is not None and len(arrays[0]):
            return at_once(arrays[0])
        picked = _each(arrays[0], pick, kind)
        failed = pc.fill_null(pc.struct_field(picked, [1]), False).to_numpy(zero_copy_only=False)
        return pc.struct_field(picked, [0]), failed if failed.any() else None

    return Apply([arg], STRING, text, run, "array index out of bounds")


def _split_part(arg: Node, delimiter: Node, index: Node, text: str) -> Node:
    """SPLIT_PART(s, delimiter, n): the n-th part (1-based; negative from the end) of
    ``s`` split at a literal delimiter (an empty one does not split), ``""`` past the
    parts."""
    _need(arg, STRING, text)
    if not isinstance(delimiter, Literal) or delimiter.type != STRING:
        raise ExpressionError(f"{text}: SPLIT_PART needs a string literal delimiter")
    if not (isinstance(index, Literal) and index.type.integral) or int(index.value) == 0:
        raise ExpressionError(f"{text}: SPLIT_PART needs a non-zero integer literal index")
    cut, i = str(delimiter.value), int(index.value)

    def one(s: str) -> str:
        got = s.split(cut) if cut else [s]
        at = i - 1 if i > 0 else len(got) + i
        return got[at] if 0 <= at < len(got) else ""

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        return _each(arrays[0], one), None

    return Apply([arg], STRING, text, run)


def _replace(arg: Node, search: Node, replacement: Node | None, text: str) -> Node:
    """REPLACE(s, search[, replace='']): every occurrence of ``search`` replaced (an
    empty ``search`` replaces nothing)."""
    _need(arg, STRING, text)
    for n in (search, replacement):
        if n is not None and not (isinstance(n, Literal) and n.type == STRING):
            raise ExpressionError(f"{text}: REPLACE needs string literals to search and replace")
    find = str(search.value)  # type: ignore[attr-defined]
    put = "" if replacement is None else str(replacement.value)  # type: ignore[attr-defined]
    if not find:
        return Apply([arg], STRING, text, lambda a: (a[0], None))
    return Apply(
        [arg], STRING, text,
        _string_function(lambda a: pc.replace_substring(a, pattern=find, replacement=put)),
    )  # fmt: skip


def _concat(args: list[Node], text: str) -> Node:
    for a in args:
        _need(a, STRING, text)

    def run(arrays: list[pa.Array]) -> tuple[pa.Array, None]:
        strings = [_cast(a, STRING) for a in arrays]
        return pc.binary_join_element_wise(*strings, "", null_handling="emit_null"), None

    return Apply(args, STRING, text, run)


def _abs(arg: Node, text: str) -> Node:
    t = arg.type
    if not (t.numeric or t == VOID):
        raise ExpressionError(f"{text}: ABS needs a number, not {t}")
    if t.integral:

        def run(a: list[pa.Array]) -> tuple[pa.Array, np.ndarray | None]:
            try:
                return pc.abs_checked(a[0]), None
            except pa.ArrowInvalid:
                low = _BOUNDS[t.name][0]
                failed = _mask(pc.equal(a[0], low), True)
                return pc.abs(
                    pc.if_else(pa.array(failed), pa.scalar(None, a[0].type), a[0])
                ), failed

        return Apply([arg], t, text, run, "integer overflow")
    return Apply([arg], t, text, lambda a: (pc.abs(a[0]), None))


def _rounding(name: str, arg: Node, text: str) -> Node:
    """FLOOR / CEIL: a BIGINT, converted as Java's ``(long)`` does (Spark's code): NaN is
    0 and a value past the range is its nearest end — never an error."""
    if arg.type.integral:
        return Apply([arg], BIGINT, text, lambda a: (_cast(a[0], BIGINT), None))
    if arg.type != DOUBLE:
        raise ExpressionError(f"{text}: {name.upper()} needs a number, not {arg.type}")
    fn = math.floor if name == "floor" else math.ceil
    low, high = _BOUNDS["bigint"]

    def java_long(v: float) -> int:
        if math.isnan(v):
            return 0
        if v >= 2.0**63:
            return high
        if v <= -(2.0**63):
            return low
        return int(fn(v))

    def run(a: list[pa.Array]) -> tuple[pa.Array, None]:
        values = [None if v is None else java_long(v) for v in a[0].to_pylist()]
        return pa.array(values, pa.int64()), None

    return Apply([arg], BIGINT, text, run)


_PARTS = {"Hour": pc.hour, "Minute": pc.minute, "Second": pc.second, "Year": pc.year,
          "Month": pc.month, "Day": pc.day, "DayOfMonth": pc.day}  # fmt: skip


def _part(name: str, arg: Node, text: str) -> Node:
    _need(arg, TIMESTAMP, text)
    fn = _PARTS[name]
    return Apply([arg], INT, text, lambda a: (fn(a[0]).cast(pa.int32()), None))


SUPPORTED = (
    "column names, literals (integers, decimals, doubles 1e3/1.5D, strings, true/false, NULL), "
    "+ - * / % div, unary -, = == <> != < <= > >= <=>, AND OR NOT, IS [NOT] NULL, "
    "[NOT] IN (...), BETWEEN, [NOT] LIKE, CASE WHEN, IF, COALESCE, CAST/TRY_CAST (int, "
    "bigint, double, string, boolean, decimal), ABS, FLOOR, CEIL, LOWER, UPPER, LENGTH, "
    "TRIM, SUBSTRING/SUBSTR, CONCAT, REPLACE, REGEXP_EXTRACT, one part of SPLIT "
    "(split(s, regex)[i], element_at, try_element_at, get), SPLIT_PART, YEAR, MONTH, "
    "DAY/DAYOFMONTH, HOUR, MINUTE, SECOND"
)


# -- from sqlglot's tree to nodes ----------------------------------------------------------


def _literal(e: Any, text: str) -> Literal:
    from sqlglot import exp

    if isinstance(e, exp.Null):
        return Literal(None, VOID, text)
    if isinstance(e, exp.Boolean):
        return Literal(bool(e.this), BOOLEAN, text)
    if e.is_string:
        return Literal(e.this, STRING, text)
    raw = str(e.this)
    if re.fullmatch(r"\d+", raw):
        value = int(raw)
        if value <= _BOUNDS["int"][1]:
            return Literal(value, INT, text)
        if value <= _BOUNDS["bigint"][1]:
            return Literal(value, BIGINT, text)
        return Literal(Decimal(raw), _bounded(len(raw), 0, text), text)
    if re.fullmatch(r"\d*\.\d*", raw):
        whole, _, fraction = raw.partition(".")
        digits = len(whole.lstrip("0")) + len(fraction)
        precision = max(digits, len(fraction), 1)
        return Literal(Decimal(raw), _bounded(precision, len(fraction), text), text)
    return Literal(float(raw), DOUBLE, text)  # 1e3, 1.5e-2: doubles


_TYPE_NAMES = {"INT": INT, "BIGINT": BIGINT, "DOUBLE": DOUBLE, "TEXT": STRING,
               "VARCHAR": STRING, "BOOLEAN": BOOLEAN, "SMALLINT": INT, "TINYINT": INT}  # fmt: skip


def _to_type(dt: Any, text: str) -> SqlType:
    name = str(dt.this.name) if hasattr(dt.this, "name") else str(dt.this)
    if name == "DECIMAL":
        params = [int(p.this.this) for p in dt.expressions]
        precision, scale = (params + [10, 0][len(params) :])[:2] if params else (10, 0)
        return _bounded(precision, scale, text)
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    raise ExpressionError(f"{text}: CAST to {dt.sql('spark')} is not supported")


def _build(e: Any, schema: Mapping[str, SqlType]) -> Node:
    from sqlglot import exp

    text = e.sql("spark")

    def sub(x: Any) -> Node:
        return _build(x, schema)

    if isinstance(e, exp.Paren):
        return sub(e.this)
    if isinstance(e, exp.Column):
        if e.table:
            raise ExpressionError(f"{text}: qualified names are not supported; use {e.name}")
        if e.name not in schema:
            raise ExpressionError(
                f"{text}: no column {e.name!r}; the events have {', '.join(schema) or 'none'}"
            )
        return ColumnRef(e.name, schema[e.name], text)
    if isinstance(e, exp.Literal | exp.Null | exp.Boolean):
        return _literal(e, text)
    if isinstance(e, exp.Neg):
        inner = sub(e.this)
        if isinstance(inner, Literal) and inner.type.numeric:
            return _literal_negated(inner, text)
        return _arith("-", Literal(0, INT, "0"), inner, text)
    if isinstance(e, exp.Add | exp.Sub | exp.Mul):
        op = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}[type(e)]
        return _arith(op, sub(e.this), sub(e.expression), text)
    if isinstance(e, exp.Div):
        return _divide(sub(e.this), sub(e.expression), text)
    if isinstance(e, exp.Mod):
        return _integral_division("%", sub(e.this), sub(e.expression), text)
    if isinstance(e, exp.IntDiv):
        return _integral_division("div", sub(e.this), sub(e.expression), text)
    compare = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
    if type(e) in compare:
        return _compare(compare[type(e)], sub(e.this), sub(e.expression), text)
    if isinstance(e, exp.NullSafeEQ):
        return _null_safe_equal(sub(e.this), sub(e.expression), text)
    if isinstance(e, exp.And | exp.Or):
        left, right = sub(e.this), sub(e.expression)
        _need(left, BOOLEAN, text)
        _need(right, BOOLEAN, text)
        return Logic("and" if isinstance(e, exp.And) else "or", left, right, text)
    if isinstance(e, exp.Not):
        return _not(sub(e.this), text)
    if isinstance(e, exp.Is):
        if not isinstance(e.expression, exp.Null):
            raise ExpressionError(f"{text}: only IS NULL and IS NOT NULL are supported")
        return _is_null(sub(e.this), text)
    if isinstance(e, exp.In):
        if e.args.get("query") or e.args.get("unnest") or e.args.get("field"):
            raise ExpressionError(f"{text}: IN takes a list of values here, not a query")
        return _in(sub(e.this), [sub(x) for x in e.expressions], text)
    if isinstance(e, exp.Between):
        value, low, high = sub(e.this), sub(e.args["low"]), sub(e.args["high"])
        return Logic(
            "and", _compare(">=", value, low, text), _compare("<=", value, high, text), text
        )
    if isinstance(e, exp.Like):
        if e.args.get("escape"):
            raise ExpressionError(f"{text}: LIKE ... ESCAPE is not supported")
        return _like(sub(e.this), sub(e.expression), text, bool(e.args.get("negate")))
    if isinstance(e, exp.Case):
        if e.this is not None:
            raise ExpressionError(
                f"{text}: CASE x WHEN ... is not supported; write CASE WHEN x = ..."
            )
        conditions = [sub(i.this) for i in e.args["ifs"]]
        values = [sub(i.args["true"]) for i in e.args["ifs"]]
        otherwise = sub(e.args["default"]) if e.args.get("default") is not None else None
        return _case(conditions, values, otherwise, text)
    if isinstance(e, exp.If):
        otherwise = sub(e.args["false"]) if e.args.get("false") is not None else None
        return _case([sub(e.this)], [sub(e.args["true"])], otherwise, text)
    if isinstance(e, exp.Coalesce):
        args = [sub(e.this), *(sub(x) for x in e.expressions)]
        conditions = [_not(_is_null(a, a.text), a.text) for a in args[:-1]]
        return _case(conditions, args[:-1], args[-1], text)
    if isinstance(e, exp.TryCast | exp.Cast):
        to = _to_type(e.args["to"], text)
        return _cast_node(sub(e.this), to, text, safe=bool(e.args.get("safe")))
    if isinstance(e, exp.Abs):
        return _abs(sub(e.this), text)
    if isinstance(e, exp.Floor | exp.Ceil):
        if e.args.get("decimals") is not None:
            raise ExpressionError(f"{text}: FLOOR/CEIL with a scale is not supported")
        return _rounding("floor" if isinstance(e, exp.Floor) else "ceil", sub(e.this), text)
    if isinstance(e, exp.Lower | exp.Upper | exp.Length):
        arg = sub(e.this)
        _need(arg, STRING, text)
        if isinstance(e, exp.Length):
            return Apply(
                [arg], INT, text, _string_function(lambda a: pc.utf8_length(a).cast(pa.int32()))
            )
        fn = pc.utf8_lower if isinstance(e, exp.Lower) else pc.utf8_upper
        return Apply([arg], STRING, text, _string_function(fn))
    if isinstance(e, exp.Trim):
        if e.args.get("position") or e.args.get("expression"):
            raise ExpressionError(f"{text}: TRIM of other characters is not supported")
        arg = sub(e.this)
        _need(arg, STRING, text)
        return Apply([arg], STRING, text, _string_function(lambda a: pc.utf8_trim(a, " ")))
    if isinstance(e, exp.Substring):
        length = e.args.get("length")
        return _substring(sub(e.this), sub(e.args["start"]), sub(length) if length else None, text)
    if isinstance(e, exp.RegexpExtract):
        group = e.args.get("group")
        return _regexp_extract(sub(e.this), sub(e.expression), sub(group) if group else None, text)
    if isinstance(e, exp.Concat):
        return _concat([sub(x) for x in e.expressions], text)
    if isinstance(e, exp.Replace):
        replacement = e.args.get("replacement")
        return _replace(
            sub(e.this), sub(e.expression), sub(replacement) if replacement else None, text
        )
    if isinstance(e, exp.SplitPart):
        return _split_part(sub(e.this), sub(e.args["delimiter"]), sub(e.args["part_index"]), text)
    getter = isinstance(e, exp.Anonymous) and str(e.name).lower() == "get"
    if isinstance(e, exp.Bracket) or getter:
        array, index = (
            (e.expressions[0], e.expressions[1]) if getter else (e.this, e.expressions[0])
        )
        if len(e.expressions) != (2 if getter else 1) or not isinstance(array, exp.RegexpSplit):
            raise ExpressionError(
                f"{text}: arrays are not supported but for one part of a split string "
                "(split(s, '/')[i], element_at(split(s, '/'), i), get(split(s, '/'), i))"
            )
        limit, strings = array.args.get("limit"), sub(array.this)
        parts = _splitter(strings, sub(array.expression), sub(limit) if limit else None, text)
        base = 0 if getter else int(e.args.get("offset") or 0)
        missing = "null" if getter or e.args.get("safe") else "fail"
        return _split_at(strings, parts, sub(index), base, missing, text)
    if isinstance(e, exp.RegexpSplit):
        raise ExpressionError(
            f"{text}: SPLIT gives an array, which riverbed's expressions do not hold; take "
            "one part of it: split(s, '/')[i], element_at(split(s, '/'), i), get(...)"
        )
    part = type(e).__name__
    if part in _PARTS:
        inner = e.this.this if isinstance(e.this, exp.TsOrDsToDate) else e.this
        return _part(part, sub(inner), text)
    name = e.name if isinstance(e, exp.Anonymous) else type(e).__name__
    raise ExpressionError(
        f"{text}: {name.upper()} is not supported in riverbed's expressions "
        f"(supported: {SUPPORTED})"
    )


def _literal_negated(inner: Literal, text: str) -> Literal:
    value = -inner.value
    t = inner.type
    if t == INT and value < _BOUNDS["int"][0]:
        t = BIGINT
    return Literal(value, t, text)


def _case(conditions: list[Node], values: list[Node], otherwise: Node | None, text: str) -> Node:
    for c in conditions:
        _need(c, BOOLEAN, text)
    t = VOID
    for v in [*values, *([otherwise] if otherwise is not None else [])]:
        t = _wider(t, v.type, text)
    return Case(conditions, values, otherwise, t, text)


def references(node: Node) -> set[str]:
    """The column names an expression reads."""
    if isinstance(node, ColumnRef):
        return {node.name}
    children: list[Node] = []
    if isinstance(node, Apply):
        children = node.args
    elif isinstance(node, Logic):
        children = [node.left, node.right]
    elif isinstance(node, Case):
        children = [*node.conditions, *node.values]
        children += [node.otherwise] if node.otherwise is not None else []
    return set().union(*(references(c) for c in children)) if children else set()


@dataclass(frozen=True)
class Compiled:
    """A typed expression, ready for batches: :meth:`evaluate` gives its values and, per
    row, the reason it failed (None where it did not)."""

    text: str
    type: SqlType
    node: Node

    @property
    def references(self) -> set[str]:
        return references(self.node)

    def evaluate(self, batch: pa.Table | pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        value = self.node.evaluate(table)
        n = table.num_rows
        if value.failed is None:
            return value.array, pa.nulls(n, pa.string())
        why = pa.array([value.why if f else None for f in value.failed.tolist()], pa.string())
        return value.array, why


def compile_expression(text: str, schema: Mapping[str, SqlType]) -> Compiled:
    """``text`` (Spark SQL) over columns of ``schema``; :class:`ExpressionError` naming
    what is wrong, before any event is read."""
    import sqlglot
    from sqlglot.errors import ParseError

    try:
        tree = sqlglot.parse_one(text, read="spark")
    except ParseError as exc:
        first = str(exc).splitlines()[0]
        raise ExpressionError(f"{text!r} is not a Spark SQL expression: {first}") from None
    node = _build(tree, schema)
    return Compiled(text, node.type, node)
