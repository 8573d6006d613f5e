"""An aggregation's ``columns`` and ``where`` over a batch of events (and a join side's:
:func:`side_derivation`).

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

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
from riverbed.stream.joins import Lookup
from riverbed.stream.lookups import join, key_types_match
from riverbed.stream.metrics import where_column

__all__ = [
    "KEPT",
    "UNMATCHED",
    "Applied",
    "Derivation",
    "compile_for",
    "compile_side",
    "derivation",
    "map_in_arrow",
    "named_failures",
    "side_derivation",
    "spark_schema",
]

KEPT = "_kept"  # the DataFrame path's flag: the event passed ``where``
UNMATCHED = "_unmatched"  # the DataFrame path's flag: a lookup found no row for the event


class Applied(NamedTuple):
    """A batch through a :class:`Derivation`: the events with the lookups' and the
    derived columns (row for row), why each failed (null: it did not), whether each was
    kept (``where``, and an inner lookup's match), whether a lookup missed it."""

    table: pa.Table
    why: pa.Array
    kept: pa.Array
    unmatched: pa.Array | None = None


@dataclass(frozen=True)
class Derivation:
    """The compiled ``columns`` (in order) and ``where`` of a spec for one input schema."""

    columns: tuple[tuple[str, Compiled], ...]
    where: Compiled | None
    before_where: frozenset[str] = frozenset()  # the derived columns ``where`` needs
    key_parts: tuple[str, ...] = ()  # a composite key's parts: its column is derived last
    lookups: tuple[Lookup, ...] = ()  # joined first, in order (lookups.py)
    lookup_types: tuple[tuple[str, SqlType], ...] = ()  # the columns they add

    @property
    def types(self) -> dict[str, SqlType]:
        return {name: compiled.type for name, compiled in self.columns}

    def apply(self, batch: pa.RecordBatch | pa.Table, tables: Sequence[pa.Table] = ()) -> Applied:
        """``batch`` joined with the lookups' ``tables`` (their snapshots, in order) and
        the derived columns added (see :class:`Applied`)."""
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        why = pa.nulls(table.num_rows, pa.string())
        kept = pa.repeat(pa.scalar(True), table.num_rows)
        unmatched = None
        for lookup, rows in zip(self.lookups, tables, strict=True):
            table, found = join(table, lookup, rows)
            missed = pc.invert(found)
            unmatched = missed if unmatched is None else pc.or_(unmatched, missed)
            if lookup.how == "inner":
                kept = pc.and_(kept, found)
        for name, compiled in self.columns:
            if name in self.before_where:
                values, failed = compiled.evaluate(table)
                # an event an inner lookup dropped is not there to fail (as in SQL)
                failed = pc.if_else(kept, failed, pa.scalar(None, pa.string()))
                why = pc.coalesce(why, named_failures(failed, f"columns[{name!r}]"))
                table = table.append_column(name, values)
        if self.where is not None:
            passed, failed = self.where.evaluate(table)
            why = pc.coalesce(why, named_failures(failed, "where"))
            kept = pc.and_(kept, pc.fill_null(passed, False))
        for name, compiled in self.columns:
            if name not in self.before_where:
                values, failed = compiled.evaluate(table)
                # an event the filter drops is never evaluated here: it cannot fail
                failed = pc.if_else(kept, failed, pa.scalar(None, pa.string()))
                why = pc.coalesce(why, named_failures(failed, f"columns[{name!r}]"))
                table = table.append_column(name, values)
        order = [n for n, _ in self.lookup_types] + [n for n, _ in self.columns]
        if self.key_parts:  # the composite key's column, from its parts (keys.py)
            table = table.append_column(KEY, keys.encode(table, self.key_parts))
            order.append(KEY)
        return Applied(_ordered(table, order), why, kept, unmatched)


def _ordered(table: pa.Table, derived: list[str]) -> pa.Table:
    """The events' fields, then the derived columns in the spec's order (as the
    DataFrame path's schema declares them)."""
    fields = [n for n in table.column_names if n not in derived]
    return table.select([*fields, *derived])


def named_failures(failed: pa.Array, where: str) -> pa.Array:
    """Each failure's reason, prefixed with the part of the spec it came from (an
    aggregation's ``where`` or derived column, a join side's ``where``)."""
    if failed.null_count == len(failed):
        return failed
    return pc.binary_join_element_wise(pa.scalar(f"{where}: "), failed, "")


def compile_for(
    spec: Aggregation,
    schema: dict[str, SqlType],
    lookup_schemas: Sequence[pa.Schema] = (),
) -> Derivation | None:
    """The spec's derivation over input columns of ``schema`` (and the columns of its
    lookups' tables, ``lookup_schemas``: their snapshots'); ``None`` when it has no
    lookups, ``columns``, ``where``, metric ``where`` or composite key.
    :class:`ExpressionError` names what cannot be evaluated."""
    if not spec.derives:
        return None
    known = dict(schema)
    added = _lookup_columns(spec, schema, lookup_schemas)
    known.update(added)
    try:
        compiled, where = _columns_and_where(list(spec.columns.items()), spec.where, known)
    except ExpressionError as exc:
        raise ExpressionError(f"aggregation {spec.name!r}, {exc}") from None
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
    return Derivation(
        tuple(compiled),
        where,
        _before_where(compiled, where),
        spec.key_parts if spec.composite else (),
        spec.lookups,
        tuple(added.items()),
    )


def _before_where(compiled: list[tuple[str, Compiled]], where: Compiled | None) -> frozenset[str]:
    """The derived columns ``where`` reads, and the ones those read (derived first)."""
    needed: set[str] = set(where.references) if where is not None else set()
    for name, expression in reversed(compiled):  # what the needed columns read, too
        if name in needed:
            needed |= expression.references
    return frozenset(n for n, _ in compiled if n in needed)


def compile_side(
    columns: Sequence[tuple[str, str]], where: str | None, schema: dict[str, SqlType]
) -> Derivation | None:
    """A join side's derived ``columns`` (name, Spark SQL; in order) and ``where`` over
    input columns of ``schema``; ``None`` when it has neither. :class:`ExpressionError`
    names the part that cannot be evaluated (``columns['x']: …``, ``where: …``) and a
    ``where`` that is no condition."""
    if not columns and where is None:
        return None
    compiled, condition = _columns_and_where(columns, where, dict(schema))
    return Derivation(tuple(compiled), condition, _before_where(compiled, condition))


def _columns_and_where(
    columns: Sequence[tuple[str, str]], where: str | None, known: dict[str, SqlType]
) -> tuple[list[tuple[str, Compiled]], Compiled | None]:
    """Derived ``columns`` (in order, each over ``known`` and the ones before it; added
    to ``known``) and ``where`` over them all, compiled — an aggregation's or a join
    side's. :class:`ExpressionError` names the part (``columns['x']: …``, ``where:
    …``), a derived column with a field's name, and a ``where`` that is no condition."""
    compiled: list[tuple[str, Compiled]] = []
    for name, text in columns:
        if name in known:
            raise ExpressionError(
                f"columns[{name!r}] is the name of one of the events' fields; give the "
                "derived column a name of its own"
            )
        try:
            compiled.append((name, compile_expression(text, known)))
        except ExpressionError as exc:
            raise ExpressionError(f"columns[{name!r}]: {exc}") from None
        known[name] = compiled[-1][1].type
    if where is None:
        return compiled, None
    try:
        condition = compile_expression(where, known)
    except ExpressionError as exc:
        raise ExpressionError(f"where: {exc}") from None
    if condition.type != BOOLEAN:
        raise ExpressionError(f"where: {where!r} is {condition.type}, not a condition (boolean)")
    return compiled, condition


@functools.lru_cache(maxsize=32)
def _side_cached(
    columns: tuple[tuple[str, str], ...], where: str | None, schema: tuple[tuple[str, SqlType], ...]
) -> Derivation | None:
    return compile_side(columns, where, dict(schema))


def side_derivation(
    columns: Sequence[tuple[str, str]], where: str | None, arrow_schema: pa.Schema
) -> Derivation | None:
    """:func:`compile_side` for batches of ``arrow_schema``, compiled once per process."""
    return _side_cached(tuple(columns), where, tuple(input_types(arrow_schema).items()))


def _lookup_columns(
    spec: Aggregation, schema: dict[str, SqlType], lookup_schemas: Sequence[pa.Schema]
) -> dict[str, SqlType]:
    """The columns the lookups add, with their types; each lookup's key checked against
    the events' column it joins on."""
    if len(lookup_schemas) != len(spec.lookups):
        raise ExpressionError(
            f"aggregation {spec.name!r}: {len(spec.lookups)} lookup(s) but "
            f"{len(lookup_schemas)} table(s) to join with"
        )
    added: dict[str, SqlType] = {}
    for lookup, table in zip(spec.lookups, lookup_schemas, strict=True):
        what = f"aggregation {spec.name!r}, lookup {lookup.label}"
        on = lookup.event_column
        if on not in schema:
            raise ExpressionError(
                f"{what}: on={on!r} is not a field of the events ({', '.join(schema)}); a "
                "lookup joins on a field the events have"
            )
        key_type = spark_type(table.field(lookup.table_column).type)
        if key_type is None or not key_types_match(schema[on], key_type):
            raise ExpressionError(
                f"{what}: the events' {on!r} is {schema[on]} but the table's "
                f"{lookup.table_column!r} is {key_type}: a key must be the same type on "
                "both sides (integers of any width match)"
            )
        for f in table:
            if f.name == lookup.table_column:
                continue
            if f.name in schema or f.name in added:
                raise ExpressionError(
                    f"{what}: column {f.name!r} is already "
                    + ("a field of the events" if f.name in schema else "another lookup's")
                    + '; rename it with columns={"new_name": "'
                    + f.name
                    + '"}'
                )
            t = spark_type(f.type)
            assert t is not None  # lookups.normalized carries only these
            added[f.name] = t
    return added


def column_types(
    spec: Aggregation, arrow_schema: pa.Schema, lookup_schemas: Sequence[pa.Schema] = ()
) -> dict[str, SqlType]:
    """The Spark SQL types of the events' fields, the lookups' columns and the spec's
    derived columns."""
    types = input_types(arrow_schema)
    derived = compile_for(spec, types, lookup_schemas)
    if derived is None:
        return types
    return types | dict(derived.lookup_types) | derived.types


def input_types(arrow_schema: pa.Schema) -> dict[str, SqlType]:
    """The Spark SQL types of a batch's columns that expressions can use."""
    out = {}
    for f in arrow_schema:
        t = spark_type(f.type)
        if t is not None and not f.name.startswith("_"):
            out[f.name] = t
    return out


@functools.lru_cache(maxsize=64)
def _cached(
    spec: Aggregation,
    schema: tuple[tuple[str, SqlType], ...],
    lookup_schemas: tuple[pa.Schema, ...],
) -> Derivation | None:
    return compile_for(spec, dict(schema), lookup_schemas)


def derivation(
    spec: Aggregation, arrow_schema: pa.Schema, tables: Sequence[pa.Table] = ()
) -> Derivation | None:
    """:func:`compile_for` for a batch's schema and the lookups' snapshots ``tables``,
    compiled once per process."""
    return _cached(spec, tuple(input_types(arrow_schema).items()), tuple(t.schema for t in tables))


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
    fields += [StructField(name, spark(t)) for name, t in derived.lookup_types]
    fields += [StructField(name, spark(c.type)) for name, c in derived.columns]
    if derived.key_parts:
        fields.append(StructField(KEY, StringType()))
    if "_error" not in given.fieldNames():
        fields.append(StructField("_error", StringType()))
    flags = [StructField(KEPT, BooleanType(), False)]
    if derived.lookups:
        flags.append(StructField(UNMATCHED, BooleanType(), False))
    return StructType([*fields, *flags])


def map_in_arrow(spec: Aggregation, checkpoint: str = "", lookups: Sequence[str] = ()) -> Any:
    """The DataFrame path's ``mapInArrow`` function: each batch joined with the
    snapshots ``lookups`` of ``checkpoint``'s lookup tables, with the derived columns,
    :data:`KEPT`, :data:`UNMATCHED` (with lookups) and the failures in ``_error``
    (beside the source's own)."""
    from riverbed.stream.lookups import tables as snapshot_tables

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = snapshot_tables(checkpoint, lookups) if lookups else ()
        for batch in batches:
            derived = derivation(spec, batch.schema, tables)
            assert derived is not None  # only a spec that derives something maps
            table, why, kept, unmatched = derived.apply(batch, tables)
            if "_error" in table.column_names:
                at = table.schema.get_field_index("_error")
                table = table.set_column(at, "_error", pc.coalesce(table.column("_error"), why))
            else:
                table = table.append_column("_error", why)
            table = table.append_column(KEPT, kept)
            if spec.lookups:
                assert unmatched is not None
                table = table.append_column(UNMATCHED, unmatched)
            yield from table.to_batches()

    return run
