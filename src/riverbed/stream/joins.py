"""The declarative joins (light: no Arrow, no Spark, so a spec file and Spark's source
process import it cheaply): a :class:`Lookup` enriches an aggregation's events from a
table (read, snapshotted and joined by :mod:`riverbed.stream.lookups`); a :class:`Join`
pairs the events of two streams in a window or an interval (the pairing rules:
:mod:`riverbed.stream.pairing`; run by :mod:`riverbed.stream.streamjoin`) — or, built
by a :class:`~riverbed.stream.selects.Select`, filters and projects one stream's
events."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard
from urllib.parse import urlsplit

from riverbed.durations import duration_ms
from riverbed.errors import DurationError
from riverbed.locations import shown, shown_repr
from riverbed.stream.errors import StreamValueError

__all__ = ["DATAFRAME", "SQL_SCHEMES", "Join", "Lookup"]

DATAFRAME = "(a DataFrame)"  # what a side given as Frame(df) shows for its topic

SQL_SCHEMES = ("sqlite", "postgresql", "postgres")  # a lookup table in a SQL database
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Lookup:
    """A table each event is enriched from (see the module doc).

    ``location``: a Parquet file or directory (path, ``file://``, ``s3://``), a SQL
    database URL (``sqlite:///x.db``, ``postgresql://user@host/db``) with ``table``, or
    with ``topic`` a log's URL (``None``: the aggregation's log; ``kafka://…`` for a
    Kafka topic), whose newest value per key is the table.
    ``on``: the events' column, or ``(events' column, table's column)``. ``columns``:
    the table's columns to add (all but the key when ``None``), or ``{"new name":
    "table column"}``. ``how``: ``"left"`` or ``"inner"``. ``refresh``: ``"batch"`` or
    a duration. ``parts``: how many parts its snapshots are held in, each task reading
    only the parts its events' keys need (``None``: whole up to 64 MiB, in parts above;
    1: always whole) — :mod:`riverbed.stream.lookupparts`."""

    location: str | None = None
    on: str | tuple[str, str] = ""
    columns: Sequence[str] | Mapping[str, str] | None = None
    how: Literal["left", "inner"] = "left"
    refresh: str = "batch"
    table: str | None = None
    topic: str | None = None
    parts: int | None = None

    def __repr__(self) -> str:
        return shown_repr(self, "location")

    def __post_init__(self) -> None:
        if self.topic is not None:
            if not isinstance(self.topic, str) or not self.topic:
                raise StreamValueError(f"lookup topic={self.topic!r}: a topic's name")
            if self.location is not None and urlsplit(str(self.location)).scheme in SQL_SCHEMES:
                raise StreamValueError(
                    f"lookup topic={self.topic!r}: the location is a log's URL (or none: "
                    "the aggregation's log), not a SQL database"
                )
        elif not isinstance(self.location, str | Path) or not str(self.location).strip():
            raise StreamValueError(
                f"a lookup needs a table's location (or topic=), not {self.location!r}"
            )
        if self.location is not None:
            object.__setattr__(self, "location", str(self.location))
        on = self.on
        if isinstance(on, list | tuple):
            if len(on) != 2 or not all(isinstance(c, str) and c for c in on):
                raise StreamValueError(
                    f"lookup on={on!r}: name one column, or (events' column, table's column)"
                )
            on = (on[0], on[1]) if on[0] != on[1] else on[0]
        elif not isinstance(on, str) or not on:  # (its default only keeps the order)
            raise StreamValueError(
                f"lookup on={on!r}: name one column, or (events' column, table's column)"
            )
        object.__setattr__(self, "on", on)
        if self.how not in ("left", "inner"):
            raise StreamValueError(f"lookup how={self.how!r}: 'left' or 'inner'")
        if self.parts is not None and (
            isinstance(self.parts, bool) or not isinstance(self.parts, int) or self.parts < 1
        ):
            raise StreamValueError(
                f"lookup parts={self.parts!r}: how many parts its table is held in (a "
                "positive number; 1: whole), or None to hold tables over 64 MiB in parts"
            )
        if self.refresh != "batch":
            try:
                if duration_ms(self.refresh) <= 0:
                    raise DurationError("not positive")
            except (DurationError, TypeError):
                raise StreamValueError(
                    f"lookup refresh={self.refresh!r}: 'batch' (read the table for every "
                    "batch) or a duration such as '5m'"
                ) from None
        sql = self.location is not None and urlsplit(self.location).scheme in SQL_SCHEMES
        if sql and not self.table:
            raise StreamValueError(
                f"lookup {self.label}: a SQL database needs table=, the table to read"
            )
        if sql and not _TABLE.match(str(self.table)):
            raise StreamValueError(
                f"lookup table={self.table!r}: a SQL table's name (letters, digits, '_')"
            )
        if not sql and self.table:
            raise StreamValueError(
                f"lookup {self.label}: table= names a SQL table; a Parquet location is "
                "read whole, a topic is topic="
            )
        columns = self.columns
        if columns is not None:
            if isinstance(columns, str):
                raise StreamValueError(
                    f"lookup {self.label}: columns is a list of the table's columns, not "
                    f"{columns!r}"
                )
            pairs = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
            if not pairs or not all(isinstance(k, str) and k for k in pairs):
                raise StreamValueError(
                    f"lookup {self.label}: columns must name at least one of the table's columns"
                )
            object.__setattr__(self, "columns", pairs)

    @property
    def label(self) -> str:
        """The table, as errors and status name it (never a password)."""
        if self.topic is not None:
            return f"topic {self.topic}"
        assert self.location is not None
        where = shown(self.location)
        return f"{where}#{self.table}" if self.table else where

    @property
    def event_column(self) -> str:
        return self.on if isinstance(self.on, str) else self.on[0]

    @property
    def table_column(self) -> str:
        return self.on if isinstance(self.on, str) else self.on[1]

    @property
    def refresh_ms(self) -> int:
        """How old a snapshot may get before the table is read again (0: every batch)."""
        return 0 if self.refresh == "batch" else duration_ms(self.refresh)

    def __hash__(self) -> int:
        return hash((self.location, self.on, self.how, self.refresh, self.table, self.topic))


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_SIDES = ("left", "right")


def named_expressions(value: Any) -> TypeGuard[Mapping[str, str]]:
    """Whether ``value`` maps names (letters, digits, '_') to Spark SQL texts, one at
    least: a side's derived columns, a Select's columns."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(k, str) and _NAME.match(k) for k in value)
        and all(isinstance(v, str) and v.strip() for v in value.values())
    )


def _pair(value: Any, what: str) -> tuple[str, str]:
    """One column name for both sides, or ``(left's, right's)``."""
    if isinstance(value, str) and value:
        return value, value
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(c, str) and c for c in value)
    ):
        return value[0], value[1]
    raise StreamValueError(f"join {what}={value!r}: name one column, or (left's, right's)")


def _frame(value: Any) -> Any:
    """The DataFrame of a side given as ``Frame(df)`` (:class:`riverbed.stream.doors.
    Frame`: anything holding a PySpark DataFrame in ``df``), else None. (Looked at, not
    imported: doors' sources import the aggregation spec, which imports this module.)"""
    if isinstance(value, str):
        return None
    df = getattr(value, "df", None)
    return df if type(df).__module__.startswith("pyspark.") else None


def _side(value: Any, which: str) -> tuple[str, str | None, dict[str, str]]:
    """(topic, log URL or None, reader options) of a side given as a topic's name or a
    ``Topic(name, log=…, options=…)``; a ``Frame(df)``: :data:`DATAFRAME`."""
    if isinstance(value, str) and value:
        return value, None, {}
    if _frame(value) is not None:
        return DATAFRAME, None, {}
    name, log, options = (getattr(value, a, None) for a in ("name", "log", "options"))
    if isinstance(name, str) and name and (log is None or isinstance(log, str)):
        return name, log, {str(k): str(v) for k, v in dict(options or {}).items()}
    raise StreamValueError(
        f"join {which}={value!r}: a topic's name, Topic(name, log=...) (a Kafka topic: "
        'Topic("orders", log="kafka://host:9092")), or Frame(df) (a streaming DataFrame)'
    )


@dataclass(frozen=True)
class Join:
    """Two streams joined on a key, within a window or an interval of event time::

        Join(name="paid", left="orders", right="payments", on="order_id",
             within=("0s", "1h"), how="left", watermark="5m")

    or a stream's events enriched from a table, as of each batch — a *lookup join*,
    whose rows are the events with the table's columns (no window, no state)::

        Join(name="bids_named", left="bids",
             right=Lookup("sides.parquet", on="auction", columns=["name"]))

    ``left`` / ``right``: a topic's name (the configured log) or ``Topic(name, log=…)``
    (a Kafka topic too) — the log-native path — or both ``Frame(df)``: streaming
    DataFrames, joined through one Spark streaming query (the DataFrame path). ``on``:
    the key column of both, or ``(left's, right's)``;
    ``time``: the event-time column of both, or ``(left's, right's)`` (``"timestamp"``:
    the record's own time). Exactly one of ``window`` (both events in the same tumbling
    window of this size) or ``within=(before, after)`` (the right event's time is at
    most ``before`` earlier and ``after`` later than the left's; ``until``: a time
    column of the left side that ends each left event's interval sooner — an auction's
    ``expires`` — while ``after`` still bounds how long it is kept). ``how``: ``"inner"``,
    or ``"left"`` (a left event no right one matched is emitted once, with nulls, when
    the watermark passes its interval). ``watermark``: how late events may arrive
    (the join's watermark is the smaller of the sides' newest event times less it);
    ``idle_timeout``: a side with no new records for this long stops holding the
    watermark back. ``where``: a Spark SQL condition per side, ``{"right": "category =
    10"}`` — a side's events it does not keep (false or NULL) are never buffered nor
    paired, nor move the watermark (counted as filtered; a row it fails to evaluate is
    malformed); a change applies from the next batch. ``columns``: derived columns per
    side, Spark SQL over its fields, ``{"left": {"bucket": "auction % 10000"}}`` —
    evaluated in order before ``where``, each there for ``on``, ``time``, ``until``,
    ``where`` and the joined rows like a field (a row one fails to evaluate is
    malformed). ``topic``: a topic the joined rows
    are appended to, exactly once (an aggregation can read it). ``state_partitions``:
    fixed at the first start.

    A lookup join (``right`` a :class:`Lookup`): the table's key, columns and refresh
    are the Lookup's (``on`` of the Join, if given, must be the Lookup's events' column);
    ``how``: the Join's if given, else the Lookup's (``"left"``: an event without a row
    keeps NULLs, counted unmatched; ``"inner"``: it is dropped, counted unmatched);
    ``time`` only orders the rows and dates the side; no ``window``, ``within``,
    ``until`` nor a ``where`` of the right side (the Lookup's ``columns`` choose)."""

    name: str
    left: Any
    right: Any
    on: str | tuple[str, str] | None = None
    time: str | tuple[str, str] = "timestamp"
    window: str | None = None
    within: tuple[str, str] | None = None
    how: Literal["inner", "left"] | None = None
    watermark: str = "0s"
    idle_timeout: str | None = "1m"
    state_partitions: int = 4
    topic: str | None = None
    where: Mapping[str, str] | None = None
    until: str | None = None
    columns: Mapping[str, Mapping[str, str]] | None = None
    # a Select's output columns, (name, the left side's column it is), in order ((): every
    # field of the source); set by Select.join only — then there is no right side
    select: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise StreamValueError(f"join name {self.name!r}: letters, digits, '_' (max 64)")
        _side(self.left, "left")
        if self.select is not None:
            if self.right is not None or any(
                getattr(self, w) is not None for w in ("window", "within", "until", "how")
            ):
                raise StreamValueError(
                    f"select {self.name}: a Select has one source and no window, interval "
                    "or partner (build it with Select(...))"
                )
        elif isinstance(self.right, Lookup):
            self._lookup_join(self.right)
        else:
            _side(self.right, "right")
            if self.on is None:
                raise StreamValueError(
                    f"join {self.name}: on= names the key column of both sides, or (left's, "
                    "right's)"
                )
            _pair(self.on, "on")
            object.__setattr__(self, "how", "inner" if self.how is None else self.how)
        _pair(self.time, "time")
        if not self.stateless and (self.window is None) == (self.within is None):
            raise StreamValueError(
                f"join {self.name}: give window= (both events in the same window, e.g. "
                "'10s') or within=(before, after) (an interval around the left event's "
                "time, e.g. ('0s', '1h')), one of the two"
            )
        if self.window is not None and _ms(self.window, "window") <= 0:
            raise StreamValueError(f"join {self.name}: window={self.window!r} must be positive")
        if self.within is not None:
            if not isinstance(self.within, list | tuple) or len(self.within) != 2:
                raise StreamValueError(
                    f"join {self.name}: within={self.within!r} is (before, after), e.g. "
                    "('0s', '1h'): the right event at most 0s before and 1h after the left one"
                )
            object.__setattr__(self, "within", (self.within[0], self.within[1]))
            for d in self.within:
                _ms(d, "within")
        if self.select is None and self.how not in ("inner", "left"):
            raise StreamValueError(f"join how={self.how!r}: 'inner' or 'left'")
        if self.until is not None and not self.stateless:
            if not isinstance(self.until, str) or not self.until:
                raise StreamValueError(
                    f"join {self.name}: until={self.until!r} names a time column of the left "
                    "side (e.g. 'expires')"
                )
            if self.within is None:
                raise StreamValueError(
                    f"join {self.name}: until= ends an interval join's interval sooner; give "
                    "within=(before, after) too (after: the longest a left event waits)"
                )
        _ms(self.watermark, "watermark")
        if self.idle_timeout is not None and _ms(self.idle_timeout, "idle_timeout") <= 0:
            raise StreamValueError(
                f"join idle_timeout={self.idle_timeout!r}: a positive duration, or None "
                "(a side without new records holds the watermark back for good)"
            )
        parts = self.state_partitions
        if not isinstance(parts, int) or isinstance(parts, bool) or parts < 1:
            raise StreamValueError(f"join state_partitions={parts!r}: a whole number, at least 1")
        if self.topic is not None and (not isinstance(self.topic, str) or not self.topic):
            raise StreamValueError(f"join topic={self.topic!r}: a topic's name")
        if self.where is not None:
            where = self.where
            if isinstance(where, tuple) and all(
                isinstance(p, tuple) and len(p) == 2 for p in where
            ):
                where = dict(where)  # (the form it is kept in: dataclasses.replace)
            if (
                not isinstance(where, Mapping)
                or not set(where) <= set(_SIDES)
                or not all(isinstance(v, str) and v.strip() for v in where.values())
            ):
                raise StreamValueError(
                    f"join {self.name}: where={where!r} is a Spark SQL condition per side, "
                    "e.g. {'left': \"state IN ('OR', 'CA')\", 'right': 'category = 10'}"
                )
            # kept as (side, condition) pairs in the sides' order: a Join stays hashable
            if self.stateless and "right" in where:
                raise StreamValueError(
                    f"join {self.name}: the right side is a table (a Lookup): it has no "
                    "where; its columns= chooses what the events get"
                )
            pairs = tuple((s, where[s]) for s in _SIDES if s in where)
            object.__setattr__(self, "where", pairs or None)
        if self.columns is not None:
            self._check_columns(self.columns)

    def _check_columns(self, given: Any) -> None:
        """``columns``: {side: {name: Spark SQL}}, kept as pairs (a Join stays hashable)."""
        if isinstance(given, tuple):  # (the form it is kept in: dataclasses.replace)
            given = {side: dict(pairs) for side, pairs in given}
        example = "e.g. {'left': {'bucket': 'auction % 10000'}}"
        if not isinstance(given, Mapping) or not set(given) <= set(_SIDES):
            raise StreamValueError(
                f"join {self.name}: columns={given!r} is derived columns per side, {example}"
            )
        kept = []
        for side in _SIDES:
            if side not in given:
                continue
            if side == "right" and self.stateless:
                raise StreamValueError(
                    f"join {self.name}: the right side is a table (a Lookup): derive columns "
                    "of the left side, which the table's are joined to"
                )
            named = given[side]
            if not named_expressions(named):
                raise StreamValueError(
                    f"join {self.name}: columns[{side!r}]={named!r} maps each new column's "
                    f"name (letters, digits, '_') to a Spark SQL expression, {example}"
                )
            kept.append((side, tuple(named.items())))
        object.__setattr__(self, "columns", tuple(kept) or None)

    def _lookup_join(self, lookup: Lookup) -> None:
        """A lookup join's own rules (see the class doc): its key is the Lookup's."""
        if self.on is not None and _pair(self.on, "on")[0] != lookup.event_column:
            raise StreamValueError(
                f"join {self.name}: on={self.on!r}, but the Lookup joins on "
                f"{lookup.event_column!r}; name the key once, in Lookup(on=...)"
            )
        for what in ("window", "within", "until"):
            if getattr(self, what) is not None:
                raise StreamValueError(
                    f"join {self.name}: {what}= is a stream-stream join's; a lookup join "
                    "enriches each event with the table as of its batch (no window, no "
                    "interval)"
                )
        object.__setattr__(self, "on", lookup.event_column)
        object.__setattr__(self, "how", lookup.how if self.how is None else self.how)

    @property
    def lookup(self) -> Lookup | None:
        """The table of a lookup join (its right side), else None."""
        return self.right if isinstance(self.right, Lookup) else None

    @property
    def stateless(self) -> bool:
        """A lookup join or a Select: one stream, no state, no watermark (nothing of it
        waits for time)."""
        return self.lookup is not None or self.select is not None

    def named(self, text: str) -> str:
        """``text`` (an error, a dead letter's reason) with a Select's own names for its
        columns, not the derived columns that run them."""
        for name, internal in self.select or ():
            text = text.replace(f"columns[{internal!r}]", f"columns[{name!r}]")
        return text

    @property
    def noun(self) -> str:
        """How errors name it: ``select`` or ``join``."""
        return "join" if self.select is None else "select"

    @property
    def sides(self) -> tuple[tuple[str, str | None, dict[str, str]], ...]:
        """(topic, log or None, reader options) of the left, then the right side (of a
        lookup join and a Select: the left side only)."""
        if self.stateless:
            return (_side(self.left, "left"),)
        return _side(self.left, "left"), _side(self.right, "right")

    @property
    def frames(self) -> dict[str, Any]:
        """The DataFrame of each side given as ``Frame(df)``."""
        pairs = (("left", self.left), ("right", self.right))
        return {which: df for which, side in pairs if (df := _frame(side)) is not None}

    @property
    def conditions(self) -> tuple[str | None, str | None]:
        """The left side's ``where``, then the right side's (None: every event)."""
        given = dict(self.where or ())
        return given.get("left"), given.get("right")

    @property
    def derived(self) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        """The left side's derived columns (name, Spark SQL), in order, then the right's."""
        kept: Any = self.columns or ()  # (side, ((name, text), ...)) pairs, once checked
        given = dict(kept)
        return tuple(given.get("left", ())), tuple(given.get("right", ()))

    @property
    def keys(self) -> tuple[str, str]:
        if self.select is not None:  # rows keep their log order: by partition, offset
            return "partition", "partition"
        if self.lookup is not None:
            return self.lookup.event_column, self.lookup.table_column
        return _pair(self.on, "on")

    @property
    def times(self) -> tuple[str, str]:
        return _pair(self.time, "time")

    @property
    def watermark_ms(self) -> int:
        return _ms(self.watermark, "watermark")

    @property
    def idle_ms(self) -> int | None:
        return None if self.idle_timeout is None else _ms(self.idle_timeout, "idle_timeout")

    @property
    def window_ms(self) -> int | None:
        return None if self.window is None else _ms(self.window, "window")

    @property
    def bounds_ms(self) -> tuple[int, int]:
        """(lower, upper): a pair matches when right time - left time is in [lower, upper]
        (an interval join; a window join has none)."""
        if self.within is None:
            return 0, 0
        return -_ms(self.within[0], "within"), _ms(self.within[1], "within")


def _ms(value: Any, what: str) -> int:
    try:
        ms = duration_ms(value)
    except (DurationError, TypeError, AttributeError):
        raise StreamValueError(
            f"join {what}={value!r}: a duration such as '10s', '5m' or '1h'"
        ) from None
    if ms < 0:
        raise StreamValueError(f"join {what}={value!r}: not negative")
    return ms
