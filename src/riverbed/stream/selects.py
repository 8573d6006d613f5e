"""A :class:`Select`: one stream's events filtered and projected, with no state (light:
no Arrow, no Spark, like :mod:`riverbed.stream.joins`). It runs as a one-sided join
(:attr:`Select.join`: each output column a derived column of its source's side), the
way a lookup join's events are (:mod:`riverbed.stream.lookupjoin`: plan, tasks in the
driver's threads or a Spark job, the output's batch file, the topic, the batch record),
on the log-native path and, for ``Frame(df)``, the DataFrame path
(:mod:`riverbed.stream.joinframes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from riverbed.stream.errors import StreamValueError
from riverbed.stream.joins import _NAME, Join, _side, named_expressions

__all__ = ["Select"]


@dataclass(frozen=True)
class _Topic:
    """A Select's source given as a spec file's ``{"topic": ..., "schema": ...}``."""

    name: str
    log: str | None
    options: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Select:
    """One stream's events filtered and projected — SQL's ``SELECT … FROM topic WHERE
    …`` — appended exactly once to its output (and ``topic``), with no state::

        Select(name="big_bids", source="bids", where="price > 10000",
               columns={"auction": "auction", "dollars": "price * 0.908",
                        "domain": "regexp_extract(url, '^https?://([^/]+)', 1)"})

    ``source``: a topic's name (the configured log), ``{"topic": …, "schema": …}`` (a
    topic's reader options, ``log`` among them), ``Topic(name, log=…)`` (a Kafka topic
    too) or ``Frame(df)`` (a streaming DataFrame). ``columns``: the output's
    columns in order, each a Spark SQL expression over the source's fields (``{"price":
    "price * 0.908"}`` replaces a field as ``SELECT price * 0.908 AS price`` does), or a
    list of field names; ``None``: every field. ``where``: a Spark SQL condition over the
    source's fields — an event it does not keep (false or NULL) is counted as filtered,
    and no column is evaluated for it (it cannot fail). A row an expression fails for
    (Spark's ANSI errors) goes to ``<name>.dlq`` with the reason. Values are Spark's,
    decimals included (:mod:`riverbed.stream.expressions`). ``time``: the event-time
    column (``"timestamp"``: the record's own time) — status shows the newest; an event
    without one is malformed. ``topic``: a topic the rows are appended to, keyed by the
    output column ``key``, in ``partitions`` partitions when riverbed creates it."""

    name: str
    source: Any
    columns: Mapping[str, str] | Sequence[str] | None = None
    where: str | None = None
    time: str = "timestamp"
    topic: str | None = None
    key: str | None = None
    partitions: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise StreamValueError(
                f"select name {self.name!r}: letters, digits, '_' (max 64), starting with a letter"
            )
        columns = self.columns
        if isinstance(columns, tuple) and all(isinstance(p, tuple) for p in columns):
            columns = dict(columns)  # (the form it is kept in: dataclasses.replace)
        if isinstance(columns, list | tuple) and all(isinstance(c, str) for c in columns):
            columns = {c: f"`{c}`" for c in columns}
        example = "e.g. {'auction': 'auction', 'dollars': 'price * 0.908'}, or ['auction', 'price']"
        if columns is not None and not named_expressions(columns):
            raise StreamValueError(
                f"select {self.name}: columns={self.columns!r} maps each output column's name "
                f"(letters, digits, '_') to a Spark SQL expression, {example}"
            )
        if columns is not None:
            if "batch_id" in columns:
                raise StreamValueError(
                    f"select {self.name}: the output column 'batch_id' is riverbed's (each "
                    "row's batch); name yours otherwise"
                )
            object.__setattr__(self, "columns", tuple(columns.items()))
        if self.where is not None and (not isinstance(self.where, str) or not self.where.strip()):
            raise StreamValueError(
                f"select {self.name}: where={self.where!r} is a Spark SQL condition, e.g. "
                "\"price > 100 AND channel <> 'spam'\""
            )
        if not isinstance(self.time, str) or not self.time:
            raise StreamValueError(f"select {self.name}: time={self.time!r} names a column")
        if self.topic is not None:
            if not isinstance(self.topic, str) or not self.topic:
                raise StreamValueError(f"select {self.name}: topic={self.topic!r}: a topic's name")
            if not isinstance(self.key, str) or not self.key:
                raise StreamValueError(
                    f"select {self.name}: topic={self.topic!r} needs key= — the output column "
                    "its records are keyed by (a topic places records by key)"
                )
            if columns is not None and self.key not in columns:
                raise StreamValueError(
                    f"select {self.name}: key={self.key!r} is not one of its columns "
                    f"({', '.join(columns)}); name one of them"
                )
        elif self.key is not None:
            raise StreamValueError(
                f"select {self.name}: key= keys the records of its topic; give topic= too"
            )
        parts = self.partitions
        if not isinstance(parts, int) or isinstance(parts, bool) or parts < 1:
            raise StreamValueError(f"select partitions={parts!r}: a whole number, at least 1")
        source = self.source
        if isinstance(source, Mapping) and not (
            isinstance(source.get("topic"), str) and source["topic"]
        ):
            raise StreamValueError(
                f"select {self.name}: source={source!r} names its topic: "
                '{"topic": "bids", "schema": "auction long, price long, ts timestamp"}'
            )
        if not isinstance(source, Mapping):
            try:
                _side(source, "left")
            except StreamValueError:
                raise StreamValueError(
                    f"select {self.name}: source={source!r} is a topic's name, "
                    '{"topic": ..., "schema": ...}, Topic(name, log=...) (a Kafka topic: '
                    'Topic("bids", log="kafka://host:9092")), or Frame(df) (a streaming '
                    "DataFrame)"
                ) from None

    @property
    def join(self) -> Join:
        """The one-sided join that runs it: each output column a derived column of the
        source's side (named ``rb__<i>``, never a field's name), ``where`` that side's."""
        given: Any = self.columns
        derived = {f"rb__{i}": text for i, (_, text) in enumerate(given or ())}
        source = self.source
        if isinstance(source, Mapping):  # {"topic": ..., "schema": ..., "log": ...}
            options = tuple(
                (str(k), str(v)) for k, v in source.items() if k not in ("topic", "log")
            )
            source = _Topic(str(source.get("topic", "")), source.get("log"), options)
        return Join(
            name=self.name,
            left=source,
            right=None,
            on=self.key,  # (a Select's: its topic's key column, an output column)
            time=self.time,
            idle_timeout=None,
            state_partitions=self.partitions,
            topic=self.topic,
            where=None if self.where is None else {"left": self.where},
            columns={"left": derived} if derived else None,
            select=tuple((name, f"rb__{i}") for i, (name, _) in enumerate(given or ())),
        )

    def __hash__(self) -> int:
        return hash((self.name, self.columns, self.where, self.time, self.topic, self.key))
