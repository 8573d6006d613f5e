"""The declarative joins of an aggregation's spec (light: no Arrow, no Spark, so a spec
file and Spark's source process import it cheaply). How a lookup is read, snapshotted
and joined: :mod:`riverbed.stream.lookups`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from riverbed.durations import duration_ms
from riverbed.errors import DurationError
from riverbed.locations import shown, shown_repr
from riverbed.stream.errors import StreamValueError

__all__ = ["SQL_SCHEMES", "Lookup"]

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
    a duration."""

    location: str | None = None
    on: str | tuple[str, str] = ""
    columns: Sequence[str] | Mapping[str, str] | None = None
    how: Literal["left", "inner"] = "left"
    refresh: str = "batch"
    table: str | None = None
    topic: str | None = None

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
