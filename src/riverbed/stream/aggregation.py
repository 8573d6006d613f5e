"""The declarative aggregation spec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from riverbed.durations import duration_ms
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joins import Lookup
from riverbed.stream.metrics import Metric, where_column
from riverbed.windows import WINDOWS, Session, Window

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# version N >= 2 of aggregation <name>, which riverbed computes beside it under this name
# (riverbed.stream.versions): '-' is in no name a user gives, so none can collide
_VERSIONED = re.compile(r"^(?P<base>[A-Za-z][A-Za-z0-9_]{0,63})-v(?P<n>[1-9][0-9]*)$")


def version_name(name: str, number: int) -> str:
    """The aggregation that computes version ``number`` of ``name`` (1: ``name``)."""
    if number < 1:
        raise StreamValueError(f"a version number starts at 1, not {number}")
    return name if number == 1 else f"{name}-v{number}"


def base_of(aggregation: str) -> tuple[str, int]:
    """``(name, number)`` of a version's aggregation: ``flags-v3`` → ``("flags", 3)``;
    an aggregation that names no version is version 1 of itself (``flags-v1`` too: a
    reader may name version 1 so)."""
    found = _VERSIONED.match(aggregation)
    return (found["base"], int(found["n"])) if found else (aggregation, 1)


def is_version_name(aggregation: str) -> bool:
    """Whether ``aggregation`` is the name version 2 or later runs under."""
    found = _VERSIONED.match(aggregation)
    return found is not None and int(found["n"]) >= 2


KEY = "_key"  # a composite key's column in a batch: its parts' values as JSON text
DELETED = "deleted"  # a session's tombstone in the results (riverbed.stream.sessions)
# the result table's own columns (riverbed.stream.results): no metric or key part's name
RESERVED = ("window_start", "window_end", "key", DELETED, "batch_id")


@dataclass(frozen=True)
class Aggregation:
    """What to compute, e.g. hourly unique users per feature flag::

        Aggregation(
            name="flags_hourly", key="flag", time="timestamp", window=Tumbling("1h"),
            watermark="10m", metrics={"users": Distinct("user_id"), "events": Count()},
        )

    ``state_partitions`` is recorded when the query first runs; changing it later
    moves the state to the new count at the next start (:mod:`riverbed.stream.rescale`).
    ``riverbed stream plan`` says which changes of a running aggregation are applied and
    which refused (:mod:`riverbed.stream.changes`). ``output``: ``update`` emits every
    window a batch changed; ``final`` emits a window once, when the watermark closes it.

    ``lookups`` enrich each event from tables keyed by one of its columns
    (:class:`~riverbed.stream.lookups.Lookup`); their columns are there for everything
    below as the events' own fields are.

    ``columns`` derives columns from each event and ``where`` keeps the events it is
    true for, both in Spark SQL (``columns={"dollars": "price * 0.908"}``,
    ``where="price > 100 AND channel <> 'spam'"``); derived columns are evaluated in
    order (each may use the ones before it), then ``where``, and the key, the time and
    the metrics may read them (:mod:`riverbed.stream.derive`).
    """

    name: str
    key: str | tuple[str, ...]  # one column, or several: key=["channel", "auction_mod"]
    window: Window
    metrics: Mapping[str, Metric]
    time: str = "timestamp"
    watermark: str = "0s"
    output: Literal["update", "final"] = "update"
    state_partitions: int = 8
    keep_closed: str = "0s"  # keep closed windows this long past the watermark (queries)
    where: str | None = None  # Spark SQL: the events to count
    columns: Mapping[str, str] = field(default_factory=dict)  # name -> Spark SQL expression
    # tables each event is enriched from before anything else (riverbed.stream.lookups)
    lookups: tuple[Lookup, ...] = ()
    # the result types (Spark DDL names) of the columns whose values results carry —
    # a composite key's parts, the values First/Last/ArgMax/ArgMin return — resolved at
    # start from the source's schema (riverbed.stream.keys.resolved); "string" until then
    column_types: Mapping[str, str] = field(default_factory=dict)
    # metrics backfilled after retention had deleted events the aggregation counted:
    # per metric, the newest event time those events can have (ms) — resolved at start
    # from the checkpoint (riverbed.stream.backfill.since); results then carry
    # `<metric>_since` on the windows that may miss some (riverbed.stream.results)
    since: Mapping[str, int] = field(default_factory=dict)
    # how state holds a hopping or sliding window: "panes" (one value per hop-long pane
    # and key, each window's value the merge of its panes' — riverbed.stream.panes) or
    # "windows" (one value per window and key: a checkpoint an older riverbed started).
    # Resolved at start from the checkpoint (riverbed.stream.specrecord.layout)
    state_layout: Literal["panes", "windows"] = "panes"

    def __post_init__(self) -> None:
        if isinstance(self.key, list | tuple):
            parts = tuple(self.key)
            if not parts or not all(isinstance(p, str) and p for p in parts):
                raise StreamValueError(f"key must be a column or a list of columns: {self.key!r}")
            if len(set(parts)) != len(parts):
                raise StreamValueError(f"key names a column twice: {list(parts)}")
            object.__setattr__(self, "key", parts[0] if len(parts) == 1 else parts)
        elif not isinstance(self.key, str) or not self.key:
            raise StreamValueError(f"key must be a column or a list of columns: {self.key!r}")
        if KEY in self.key_parts:
            raise StreamValueError(f"a key cannot be named {KEY!r} (riverbed's own column)")
        object.__setattr__(self, "column_types", dict(self.column_types))
        object.__setattr__(self, "since", {m: int(t) for m, t in self.since.items()})
        if not _NAME.match(self.name) and not is_version_name(self.name):
            raise StreamValueError(f"aggregation name {self.name!r}: letters, digits, '_' (max 64)")
        if not isinstance(self.window, WINDOWS):
            raise StreamValueError(
                f"window must be Tumbling, Hopping, Sliding or Session, not {self.window!r}"
            )
        if not self.metrics:
            raise StreamValueError("an aggregation needs at least one metric")
        for taken in [*self.metrics, *(self.key_parts if self.composite else ())]:
            if taken in RESERVED:
                raise StreamValueError(
                    f"{taken!r} names a column of riverbed's results ({', '.join(RESERVED)}): "
                    "choose another name"
                )
        for metric_name in self.metrics:
            if not _NAME.match(metric_name):
                raise StreamValueError(f"metric name {metric_name!r}: letters, digits, '_'")
        seen: dict[str, str] = {part: "the key" for part in self.key_parts if self.composite}
        for metric_name, metric in self.metrics.items():
            for suffix, _ in metric.outputs({}):  # (TopK, a picked row: several columns)
                column = metric_name + suffix
                if column in seen or (suffix and column in RESERVED):
                    raise StreamValueError(
                        f"metric {metric_name!r} and {seen.get(column, 'riverbed')} both "
                        f"name the result column {column!r}: rename one"
                    )
                seen[column] = f"metric {metric_name!r}"
        if self.output not in ("update", "final"):
            raise StreamValueError(f"output must be update or final, not {self.output!r}")
        if self.state_partitions < 1:
            raise StreamValueError("state_partitions must be at least 1")
        duration_ms(self.watermark)
        duration_ms(self.keep_closed)
        if self.state_layout not in ("panes", "windows"):
            raise StreamValueError(f"state_layout must be panes or windows: {self.state_layout!r}")
        if self.where is not None and (not isinstance(self.where, str) or not self.where.strip()):
            raise StreamValueError(f"where must be a Spark SQL condition, not {self.where!r}")
        if not isinstance(self.columns, Mapping):
            raise StreamValueError(
                'columns must map names to Spark SQL expressions, e.g. {"dollars": "price * 0.908"}'
            )
        for name, metric in self.metrics.items():
            where = getattr(metric, "where", None)
            if where is not None and (not isinstance(where, str) or not where.strip()):
                raise StreamValueError(f"metric {name!r}: where must be a Spark SQL condition")
        for name, text in self.columns.items():
            if not isinstance(name, str) or not _NAME.match(name):
                raise StreamValueError(f"derived column name {name!r}: letters, digits, '_'")
            if not isinstance(text, str) or not text.strip():
                raise StreamValueError(f"columns[{name!r}] must be a Spark SQL expression")
        if isinstance(self.lookups, Lookup):
            object.__setattr__(self, "lookups", (self.lookups,))
        if not isinstance(self.lookups, list | tuple) or not all(
            isinstance(x, Lookup) for x in self.lookups
        ):
            raise StreamValueError(
                "lookups must be a list of Lookup(...) (riverbed.stream.Lookup), not "
                f"{self.lookups!r}"
            )
        object.__setattr__(self, "lookups", tuple(self.lookups))
        object.__setattr__(self, "metrics", dict(self.metrics))  # a private copy
        object.__setattr__(self, "columns", dict(self.columns))

    @property
    def watermark_ms(self) -> int:
        return duration_ms(self.watermark)

    @property
    def keep_closed_ms(self) -> int:
        return duration_ms(self.keep_closed)

    def __hash__(self) -> int:  # metrics and columns are dicts: hash what names them
        return hash(
            (self.name, self.key, self.time, self.where, tuple(self.columns.items()), self.lookups)
        )

    @property
    def key_parts(self) -> tuple[str, ...]:
        """The key's columns: one, or a composite key's parts."""
        return self.key if isinstance(self.key, tuple) else (self.key,)

    @property
    def sessions(self) -> bool:
        """Whether the window is a :class:`~riverbed.windows.Session`."""
        return isinstance(self.window, Session)

    @property
    def pane_ms(self) -> int:
        """The length of the panes state holds (a hopping or sliding window's hop), or 0:
        state holds windows (tumbling, sessions, the ``"windows"`` layout)."""
        window = self.window
        if self.state_layout != "panes" or isinstance(window, Session):
            return 0
        return window.hop_ms if window.hop_ms < window.size_ms else 0

    @property
    def composite(self) -> bool:
        return isinstance(self.key, tuple)

    @property
    def key_column(self) -> str:
        """The column the engine groups by: the key itself, or for a composite key the
        column derived from its parts' values (:data:`KEY`: JSON text, as the result
        table's ``key`` shows it; riverbed.stream.keys)."""
        return KEY if isinstance(self.key, tuple) else self.key

    def reads(self) -> list[str]:
        """The columns the aggregation reads from each event (after ``columns`` are
        derived): the key, the time, and the metrics' columns."""
        cols = [self.key_column, self.time]
        for metric in self.metrics.values():
            read = getattr(metric, "column", None)
            read = read if isinstance(read, tuple) else (read,)  # (a picked row's columns)
            for column in (*read, getattr(metric, "by", None)):
                if column and column not in cols:  # (ArgMax/ArgMin compare by a column)
                    cols.append(column)
        cols += [where_column(name) for name, m in self.metrics.items() if m.where is not None]
        return cols

    @property
    def derives(self) -> bool:
        """Whether the spec has lookups, derived columns, a ``where``, a metric's ``where``, or a
        composite key (its column is derived from its parts)."""
        return (
            bool(self.columns)
            or bool(self.lookups)
            or self.where is not None
            or self.composite
            or any(m.where is not None for m in self.metrics.values())
        )
