"""A stream-stream join's start (:mod:`riverbed.stream.streamjoin`'s configuration):
both sides checked — their topics, or their streaming DataFrames — before the checkpoint
records anything, and the joined rows' columns decided."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa

from riverbed.spark.offsets import source_limits
from riverbed.spark.source import META_NAMES, open_log
from riverbed.state import StateConfig
from riverbed.stream.derive import compile_side, input_types
from riverbed.stream.errors import StreamValueError
from riverbed.stream.expressions import ExpressionError, arrow_type
from riverbed.stream.joins import Join
from riverbed.stream.nativeconfig import JOIN_DRIVER_BATCH_RECORDS, count_option
from riverbed.stream.streamjoin import (
    PREFIX,
    SIDES,
    WINDOW_START,
    JoinConfig,
    JoinSide,
)


def prepare(
    join: Join,
    *,
    checkpoint: str,
    output: str,
    state: StateConfig,
    log_url: str | None,
    term: int | None = None,
) -> JoinConfig:
    """Check both sides against their topics (on the driver, with a Spark session:
    DDL schemas are parsed by it), or as streaming DataFrames when they are ``Frame(df)``
    (the DataFrame path, :mod:`riverbed.stream.joinframes`), and decide the output's
    columns."""
    from riverbed.spark.source import reader_schema

    if join.frames:
        return _prepare_frames(join, checkpoint, output, state, log_url, term)

    sides = []
    limits: list[int] = []  # each side's maxRecordsPerBatch, if it has one
    in_driver: list[int] = []  # each side's driverBatchRecords (its default if not given)
    for which, (topic, side_log, reader) in zip(SIDES, join.sides, strict=False):
        url = side_log or log_url
        if url is None:
            raise StreamValueError(
                f"{join.noun} {join.name}: the {which} side's topic {topic!r} needs a log: "
                "configure one (riverbed.toml's log) or give Topic(name, log=...)"
            )
        options = {**reader, "topic": topic, "log": url}
        lowered = {k.lower(): v for k, v in options.items()}
        limit, _ = source_limits(lowered)
        limits += [limit] if limit is not None else []
        in_driver.append(count_option(lowered, "driverBatchRecords", JOIN_DRIVER_BATCH_RECORDS))
        opened = open_log(options)
        try:
            if topic not in opened.topics():
                raise StreamValueError(
                    f"{join.noun} {join.name}: the {which} side's topic {topic!r} does not "
                    f"exist in {url}; create it with `riverbed topic create {topic} --partitions "
                    f"{join.state_partitions}`"
                )
        finally:
            opened.close()
        schema = reader_schema(lowered)
        sides.append(
            _side(join, which, schema, options, f"side's topic {topic!r}", "give the topic "
                  "a schema option")
        )  # fmt: skip
    table = _with_table(join, sides, checkpoint, log_url)
    # the smaller of the two: a side may raise the default as well as lower it
    cfg = _config(join, sides, checkpoint, output, state, log_url, term, limits,
                  min(in_driver))  # fmt: skip
    return cfg if table is None else replace(cfg, lookup_schema=table)


def _prepare_frames(
    join: Join, checkpoint: str, output: str, state: StateConfig, log_url: str | None,
    term: int | None,
) -> JoinConfig:  # fmt: skip
    """:func:`prepare` for a join with a side given as ``Frame(df)``: both must be (a
    lookup join's left side: its right side is its table)."""
    frames = join.frames
    sides = []
    for which in SIDES[: len(join.sides)]:
        if which not in frames:
            raise StreamValueError(
                f"{join.noun} {join.name}: one side is a DataFrame, the {which} side is not; give "
                "both as Frame(df) (a riverbed topic reads as one through "
                'spark.readStream.format("riverbed").option("topic", …)), or both as topics'
            )
        df = frames[which]
        if not getattr(df, "isStreaming", False):
            raise StreamValueError(
                f"{join.noun} {join.name}: the {which} side's DataFrame is not a streaming one "
                "(spark.readStream…)"
            )
        sides.append(_side(join, which, df.schema, {}, "side's DataFrame", "select it first"))
    table = _with_table(join, sides, checkpoint, log_url)
    cfg = _config(join, sides, checkpoint, output, state, log_url, term, [],
                  JOIN_DRIVER_BATCH_RECORDS)  # fmt: skip
    return cfg if table is None else replace(cfg, lookup_schema=table)


def _with_table(
    join: Join, sides: list[JoinSide], checkpoint: str, log_url: str | None
) -> pa.Schema | None:
    """A lookup join's right side, its table, added to ``sides`` from its columns as
    they are now (:func:`riverbed.stream.lookups.at_start`); returns their schema (None:
    not a lookup join)."""
    if join.lookup is None:
        return None
    from riverbed.stream import lookupjoin, lookups

    schema = lookups.at_start([join.lookup], checkpoint, log_url)[0]
    sides.append(lookupjoin.table_side(join, sides[0], schema))
    return schema


def _side(
    join: Join, which: str, schema: Any, options: dict[str, str], what_side: str, fix: str
) -> JoinSide:
    """A side from its Spark schema: its key and time columns checked, the columns it
    keeps and which of them are times."""
    from pyspark.sql.pandas.types import to_arrow_schema

    key, time_column = join.keys[SIDES.index(which)], join.times[SIDES.index(which)]
    arrow = to_arrow_schema(schema, timezone="UTC")
    derived = join.derived[SIDES.index(which)]
    where = join.conditions[SIDES.index(which)]
    try:  # refused now, not by the first task
        compiled = compile_side(derived, where, input_types(arrow))
    except ExpressionError as exc:
        if join.select is not None:
            raise ExpressionError(f"select {join.name}: {join.named(str(exc))}") from None
        raise ExpressionError(f"{join.noun} {join.name}, the {which} side's {exc}") from None
    added = [pa.field(n, arrow_type(c.type)) for n, c in (compiled.columns if compiled else ())]
    for f in added:
        arrow = arrow.append(f)
    fields = [f.name for f in schema.fields if f.name not in META_NAMES] + [f.name for f in added]
    if join.select is not None:  # its rows: the output's columns, as Spark gives them
        given = [f.name for f in schema.fields if f.name not in META_NAMES]
        kept = [internal for _, internal in join.select] or given
        if time_column not in schema.names:  # (the record's timestamp among them)
            raise StreamValueError(
                f"select {join.name}: time={time_column!r} is not a field of its "
                f"{what_side} (its fields: {', '.join(given) or 'none'}); name one of "
                f"them, or {fix}"
            )
        return JoinSide(options, schema, key, time_column, tuple(kept), (), where, derived,
                        tuple(added))  # fmt: skip
    for what, column in (("on", key), ("time", time_column)):
        if column not in fields and not (what == "time" and column == "timestamp"):
            raise StreamValueError(
                f"{join.noun} {join.name}: {what}={column!r} is not a field of the {which} "
                f"{what_side} (its fields: {', '.join(fields) or 'none'}); "
                f"name one of them, or {fix}"
            )
    kept = fields + ([time_column] if time_column not in fields else [])
    # timestamps, and a time column of text (ISO 8601, parsed): kept as ms, given back
    # as times
    times = tuple(c for c in kept if pa.types.is_timestamp(arrow.field(c).type) or c == time_column)
    if which == "left" and join.until is not None:
        found = join.until in fields
        if not found or not pa.types.is_timestamp(arrow.field(join.until).type):
            raise StreamValueError(
                f"{join.noun} {join.name}: until={join.until!r} is "
                + ("not a timestamp" if found else "not a field")
                + f" of the left {what_side} (its fields: {', '.join(fields) or 'none'}); name "
                f"a timestamp column of it, or {fix}"
            )
    return JoinSide(options, schema, key, time_column, tuple(kept), times, where, derived,
                    tuple(added))  # fmt: skip


def _config(
    join: Join, sides: list[JoinSide], checkpoint: str, output: str, state: StateConfig,
    log_url: str | None, term: int | None, limits: list[int], in_driver_up_to: int,
) -> JoinConfig:  # fmt: skip
    names, out_schema = _output(join, sides)
    if join.select is not None:  # one side: the right one reads nothing
        sides = [sides[0], JoinSide({}, None, "", "", (), ())]
    return JoinConfig(
        join=join,
        sides=(sides[0], sides[1]),
        state=state,
        checkpoint=checkpoint,
        output=output,
        log_url=log_url,
        names=tuple(names),
        output_schema=out_schema,
        term=term,
        max_records=min(limits) if limits else None,
        driver_records=in_driver_up_to,
    )


def _output(join: Join, sides: list[JoinSide]) -> tuple[list[tuple[str, str]], pa.Schema]:
    """(internal, output) column names and the output's Arrow schema: the window's start
    (window joins), the left side's columns, the right side's (one named like a left
    column gets ``right_``; the right key, when it has the left key's name, is left out:
    it is the same value), ``batch_id``."""
    names: list[tuple[str, str]] = []
    types: list[pa.Field] = []
    if join.select is not None:
        return _selected(join, sides[0])
    if join.window is not None:
        names.append((WINDOW_START, WINDOW_START))
        types.append(pa.field(WINDOW_START, pa.timestamp("us", tz="UTC")))
    taken = {WINDOW_START, "batch_id"}
    for which, side in zip(SIDES, sides, strict=True):
        arrow = side.arrow
        for c in side.columns:
            if which == "right" and c == side.key == sides[0].key:
                continue
            if which == "left" and c in taken:
                raise StreamValueError(
                    f"{join.noun} {join.name}: the left side's column {c!r} has the name of a "
                    "column riverbed adds to the joined rows; rename it (a schema option on the "
                    "topic)"
                )
            name = c if c not in taken else f"right_{c}"
            if name in taken:
                raise StreamValueError(
                    f"{join.noun} {join.name}: both sides have a column {c!r} and the right side "
                    f"also has {name!r}; rename one (a schema option on the topic)"
                )
            taken.add(name)
            kind = arrow.field(c).type
            if c in side.times:
                kind = pa.timestamp("us", tz="UTC")
            elif pa.types.is_decimal(kind):
                kind = pa.float64()  # as aggregations compute with them
            names.append((PREFIX[which] + c, name))
            types.append(pa.field(name, kind))
    types.append(pa.field("batch_id", pa.int64()))
    return names, pa.schema(types)


def _selected(join: Join, side: JoinSide) -> tuple[list[tuple[str, str]], pa.Schema]:
    """:func:`_output` of a Select: its columns in order (every field when it names
    none) with the types Spark gives them — decimals and timestamps as they are —
    then ``batch_id``."""
    arrow = side.arrow
    pairs = list(join.select or ()) or [(c, c) for c in side.columns]
    if "batch_id" in (name for name, _ in pairs):
        raise StreamValueError(
            f"select {join.name}: its source has a field 'batch_id', the name of the column "
            "riverbed adds to each row; select its columns by name (columns=[...]) without it"
        )
    names = [(PREFIX["left"] + internal, name) for name, internal in pairs]
    types = [pa.field(name, arrow.field(internal).type) for name, internal in pairs]
    if join.on is not None and join.on not in {name for name, _ in pairs}:
        raise StreamValueError(
            f"select {join.name}: key={join.on!r} is not one of its columns "
            f"({', '.join(n for n, _ in pairs)}); name one of them"
        )
    return names, pa.schema([*types, pa.field("batch_id", pa.int64())])


__all__ = ["prepare"]
