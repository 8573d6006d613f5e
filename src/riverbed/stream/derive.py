"""An aggregation's ``columns`` and ``where`` over a batch of events.

``where`` keeps the events for which it is true (NULL and false drop an event, as in
SQL); derived columns are evaluated in the order given, each may use the events' fields
and the columns derived before it, and ``where`` may use them too. As in SQL, where a
``SELECT`` is evaluated after its ``WHERE``, a derived column cannot fail an event the
filter drops: the columns ``where`` reads are derived first, then ``where``, then the
others — only for the events kept. A row whose evaluation fails (Spark's ANSI
errors: :mod:`riverbed.stream.expressions`) is malformed, with the reason naming the
column or the filter. The same :class:`Derivation` runs on the log-native tasks'
batches and, through ``mapInArrow``, on the DataFrame path's, so both give one answer.

Compiled once per process for a spec and an input schema (:func:`derivation`); the
driver compiles first, so a spec that cannot be evaluated is refused at start.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverbed.stream import keys
from riverbed.stream.aggregation import KEY, Aggregation
from riverbed.stream.expressions import (
    BOOLEAN,
    Compiled,
    ExpressionError,
    SqlType,
    compile_expression,
    spark_type,
)
from riverbed.stream.metrics import where_column

__all__ = ["KEPT", "Derivation", "compile_for", "derivation", "map_in_arrow", "spark_schema"]

KEPT = "_kept"  # the DataFrame path's flag: the event passed ``where``


@dataclass(frozen=True)
class Derivation:
    """The compiled ``columns`` (in order) and ``where`` of a spec for one input schema."""

    columns: tuple[tuple[str, Compiled], ...]
    where: Compiled | None
    before_where: frozenset[str] = frozenset()  # the derived columns ``where`` needs
    key_parts: tuple[str, ...] = ()  # a composite key's parts: its column is derived last

    @property
    def types(self) -> dict[str, SqlType]:
        return {name: compiled.type for name, compiled in self.columns}

    def apply(self, batch: pa.RecordBatch | pa.Table) -> tuple[pa.Table, pa.Array, pa.Array]:
        """``batch`` with the derived columns added; why each row failed (null: it did
        not); whether each row passed ``where`` (true also where there is none)."""
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        why = pa.nulls(table.num_rows, pa.string())
        for name, compiled in self.columns:
            if name in self.before_where:
                values, failed = compiled.evaluate(table)
                why = pc.coalesce(why, _named(failed, f"columns[{name!r}]"))
                table = table.append_column(name, values)
        kept = pa.repeat(pa.scalar(True), table.num_rows)
        if self.where is not None:
            passed, failed = self.where.evaluate(table)
            why = pc.coalesce(why, _named(failed, "where"))
            kept = pc.fill_null(passed, False)
        for name, compiled in self.columns:
            if name not in self.before_where:
                values, failed = compiled.evaluate(table)
                # an event the filter drops is never evaluated here: it cannot fail
                failed = pc.if_else(kept, failed, pa.scalar(None, pa.string()))
                why = pc.coalesce(why, _named(failed, f"columns[{name!r}]"))
                table = table.append_column(name, values)
        order = [n for n, _ in self.columns]
        if self.key_parts:  # the composite key's column, from its parts (keys.py)
            table = table.append_column(KEY, keys.encode(table, self.key_parts))
            order.append(KEY)
        return _ordered(table, order), why, kept


def _ordered(table: pa.Table, derived: list[str]) -> pa.Table:
    """The events' fields, then the derived columns in the spec's order (as the
    DataFrame path's schema declares them)."""
    fields = [n for n in table.column_names if n not in derived]
    return table.select([*fields, *derived])


def _named(failed: pa.Array, where: str) -> pa.Array:
    """Each failure's reason, prefixed with the part of the spec it came from."""
    if failed.null_count == len(failed):
        return failed
    return pc.binary_join_element_wise(pa.scalar(f"{where}: "), failed, "")


def compile_for(spec: Aggregation, schema: dict[str, SqlType]) -> Derivation | None:
    """The spec's derivation over input columns of ``schema``; ``None`` when it has no
    ``columns``, ``where``, metric ``where`` or composite key.
    :class:`ExpressionError` names what cannot be evaluated."""
    if not spec.derives:
        return None
    known = dict(schema)
    compiled: list[tuple[str, Compiled]] = []
    for name, text in spec.columns.items():
        if name in known:
            raise ExpressionError(
                f"aggregation {spec.name!r}: columns[{name!r}] is the name of one of the "
                "events' fields; give the derived column a name of its own"
            )
        try:
            expression = compile_expression(text, known)
        except ExpressionError as exc:
            raise ExpressionError(f"aggregation {spec.name!r}, columns[{name!r}]: {exc}") from None
        compiled.append((name, expression))
        known[name] = expression.type
    where = None
    if spec.where is not None:
        try:
            where = compile_expression(spec.where, known)
        except ExpressionError as exc:
            raise ExpressionError(f"aggregation {spec.name!r}, where: {exc}") from None
        if where.type not in (BOOLEAN,):
            raise ExpressionError(
                f"aggregation {spec.name!r}, where: {spec.where!r} is {where.type}, not a "
                "condition (boolean)"
            )
    # each metric's where: a boolean column after the others, evaluated for the events
    # kept (riverbed.stream.metrics.where_column)
    for metric_name, metric in spec.metrics.items():
        if metric.where is None:
            continue
        try:
            condition = compile_expression(metric.where, known)
        except ExpressionError as exc:
            raise ExpressionError(
                f"aggregation {spec.name!r}, metric {metric_name!r} where: {exc}"
            ) from None
        if condition.type != BOOLEAN:
            raise ExpressionError(
                f"aggregation {spec.name!r}, metric {metric_name!r}: where {metric.where!r} "
                f"is {condition.type}, not a condition (boolean)"
            )
        compiled.append((where_column(metric_name), condition))
    if spec.composite:
        unknown = [p for p in spec.key_parts if p not in known]
        if unknown:
            raise ExpressionError(
                f"aggregation {spec.name!r}: key part(s) {unknown} are neither fields of "
                f"the events ({', '.join(schema)}) nor derived columns"
            )
    needed: set[str] = set(where.references) if where is not None else set()
    for name, expression in reversed(compiled):  # what the needed columns read, too
        if name in needed:
            needed |= expression.references
    before = frozenset(n for n, _ in compiled if n in needed)
    return Derivation(tuple(compiled), where, before, spec.key_parts if spec.composite else ())


def column_types(spec: Aggregation, arrow_schema: pa.Schema) -> dict[str, SqlType]:
    """The Spark SQL types of the events' fields and of the spec's derived columns."""
    types = input_types(arrow_schema)
    derived = compile_for(spec, types)
    return types | (derived.types if derived is not None else {})


def input_types(arrow_schema: pa.Schema) -> dict[str, SqlType]:
    """The Spark SQL types of a batch's columns that expressions can use."""
    out = {}
    for f in arrow_schema:
        t = spark_type(f.type)
        if t is not None and not f.name.startswith("_"):
            out[f.name] = t
    return out


@functools.lru_cache(maxsize=64)
def _cached(spec: Aggregation, schema: tuple[tuple[str, SqlType], ...]) -> Derivation | None:
    return compile_for(spec, dict(schema))


def derivation(spec: Aggregation, arrow_schema: pa.Schema) -> Derivation | None:
    """:func:`compile_for` for a batch's schema, compiled once per process."""
    return _cached(spec, tuple(input_types(arrow_schema).items()))


def spark_schema(derived: Derivation, given: Any) -> Any:
    """The schema of :func:`map_in_arrow`'s batches for input ``given`` (a Spark
    StructType): its fields, the derived columns, ``_error`` if it had none, :data:`KEPT`."""
    from pyspark.sql.types import (
        BooleanType,
        DecimalType,
        DoubleType,
        IntegerType,
        LongType,
        NullType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    def spark(t: SqlType) -> Any:
        if t.name == "decimal":
            return DecimalType(t.precision, t.scale)
        return {
            "boolean": BooleanType(),
            "int": IntegerType(),
            "bigint": LongType(),
            "double": DoubleType(),
            "string": StringType(),
            "timestamp": TimestampType(),
            "void": NullType(),
        }[t.name]

    fields = list(given.fields)
    fields += [StructField(name, spark(c.type)) for name, c in derived.columns]
    if derived.key_parts:
        fields.append(StructField(KEY, StringType()))
    if "_error" not in given.fieldNames():
        fields.append(StructField("_error", StringType()))
    return StructType([*fields, StructField(KEPT, BooleanType(), False)])


def map_in_arrow(spec: Aggregation) -> Any:
    """The DataFrame path's ``mapInArrow`` function: each batch with the derived columns,
    :data:`KEPT`, and the failures in ``_error`` (beside the source's own)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            derived = derivation(spec, batch.schema)
            assert derived is not None  # only a spec that derives something maps
            table, why, kept = derived.apply(batch)
            if "_error" in table.column_names:
                at = table.schema.get_field_index("_error")
                table = table.set_column(at, "_error", pc.coalesce(table.column("_error"), why))
            else:
                table = table.append_column("_error", why)
            table = table.append_column(KEPT, kept)
            yield from table.to_batches()

    return run
