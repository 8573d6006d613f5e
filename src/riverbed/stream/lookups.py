"""Lookup joins: each event enriched from a table keyed by one of its columns.

::

    Aggregation(
        name="clicks_by_owner", key="owner", time="ts", window=Tumbling("1h"),
        lookups=[Lookup("campaigns.parquet", on="campaign_id", columns=["owner"])],
        metrics={"clicks": Count()},
    )

A table is a Parquet file or directory (a path, ``file://`` or ``s3://``), a table of
a SQL database (``sqlite:///path.db`` or ``postgresql://…``, with ``table=``), or a
keyed topic (``topic=``: riverbed's or Kafka's, its newest value per key). It is
keyed: one row per key (a table with a key twice is refused — at start, and at a
refresh, where the stream keeps joining with the version before and says why).

**As of the batch.** Whenever the driver plans a batch it decides which version of each
table the batch joins with, and records it in the batch's plan: a *snapshot*, the
table's key and columns as one immutable object in the checkpoint
(``riverbed/lookups/<content hash>.arrow``), written once per content. A batch run
again after a crash reads the snapshot its plan names, so it joins with the same rows
and gives the same answer — however the table changed meanwhile. ``refresh`` says how
often the table is read again: ``"batch"`` (every batch; an unchanged table costs a read
and no write) or a duration (``"5m"``: at most every five minutes).

The join is an equi-join on one column (the events' ``on``; the table's column of that
name, or ``on=("event_column", "table_column")``): ``how="left"`` keeps an event without
a row (the table's columns NULL), ``how="inner"`` drops it (counted as filtered). Both
count such events as ``unmatched`` in the batch record. A NULL key matches nothing, as
in SQL. The table's columns are there for the derived columns, ``where``, the key and
the metrics, like the events' own fields (:mod:`riverbed.stream.derive` joins first).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from riverbed.arrowbytes import ipc_bytes, read_ipc_bytes
from riverbed.parquetbytes import read_parquet_bytes
from riverbed.stream import lookupparts
from riverbed.stream.errors import StreamError
from riverbed.stream.expressions import SqlType
from riverbed.stream.joins import SQL_SCHEMES, Lookup
from riverbed.stream.layout import LOOKUPS, checkpoint_store
from riverbed.stream.lookupindex import join_with

if TYPE_CHECKING:
    from riverbed.storage import ObjectStore
    from riverbed.stream.batchlog import Batches, BatchRecord
    from riverbed.stream.engine import EngineConfig

log = logging.getLogger(__name__)

__all__ = [
    "Lookup",
    "LookupTableError",
    "Snapshot",
    "added_columns",
    "at_start",
    "join",
    "plan_record",
    "plan_snapshots",
    "planned",
    "prune_snapshots",
    "read_table",
    "recorded",
    "running",
    "start_schemas",
    "tables",
]


class LookupTableError(StreamError):
    """A lookup table that cannot be read or is not keyed as declared."""


# -- reading a table ----------------------------------------------------------------------


def read_table(lookup: Lookup, log_url: str | None = None) -> pa.Table:
    """The table as it is now: its key (named as the table names it) and the columns
    the lookup adds (under their new names), normalized (:func:`normalized`) and
    checked to be keyed. ``log_url``: the aggregation's log, for a topic without a
    location. :class:`LookupTableError` names what is wrong."""
    try:
        if lookup.topic is not None:
            raw = _read_topic(lookup, lookup.location or log_url)
        elif urlsplit(str(lookup.location)).scheme in SQL_SCHEMES:
            raw = _read_sql(lookup)
        else:
            raw = _read_parquet(lookup)
    except LookupTableError:
        raise
    except Exception as exc:  # a table away or unreadable: named, never a deep traceback
        raise LookupTableError(
            f"lookup {lookup.label}: cannot read the table ({_short(exc)})"
        ) from None
    return normalized(lookup, raw)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split("@")[-1] if "://" in text else text


def _read_topic(lookup: Lookup, log_url: str | None) -> pa.Table:
    """A topic as a table (a compacted topic's reading): for each key, the newest value
    — records in offset order, a key's records in one partition as producers keyed by it
    place them; a record without a value (a tombstone) deletes its key. The key is the
    value's field ``on`` names (the table's side), else the record's key as text."""
    import riverbed.log

    if log_url is None:
        raise LookupTableError(f"lookup {lookup.label}: no log to read it from (location=)")
    assert lookup.topic is not None
    key = lookup.table_column
    newest: dict[tuple[str, Any], dict[str, Any]] = {}
    log = riverbed.log.open(log_url)
    try:
        if lookup.topic not in log.topics():
            raise LookupTableError(f"lookup {lookup.label}: no such topic in the log")
        for part in log.offsets(lookup.topic):
            offset = part.start
            while offset < part.end:
                records = log.read(lookup.topic, part.partition, offset, 10_000)
                if not records:
                    break
                for r in records:
                    value = r.value
                    text = r.key.decode("utf-8", "replace") if r.key is not None else None
                    if value is None:  # a tombstone: compaction's delete of its record key
                        newest.pop(("record", text), None)
                        continue
                    if not isinstance(value, Mapping):
                        raise LookupTableError(
                            f"lookup {lookup.label}: record {part.partition}@{r.offset} is "
                            "not an object of fields (JSON or a typed topic)"
                        )
                    row = dict(value)
                    if row.get(key) is None:
                        row[key] = text
                    # compacted by the record's key, as Kafka compacts; by the field
                    # for records without one
                    slot = ("record", text) if text is not None else ("field", row[key])
                    newest.pop(slot, None)  # the newest goes last
                    newest[slot] = row
                offset = records[-1].offset + 1
    finally:
        log.close()
    rows = list(newest.values())
    names = list(dict.fromkeys(n for row in rows for n in row)) or [key]
    return pa.table({n: pa.array([row.get(n) for row in rows]) for n in names})


def _read_parquet(lookup: Lookup) -> pa.Table:
    """The one object the location names (``….parquet``), or every ``.parquet`` object
    under it (a directory or a bucket prefix; hidden and underscore-prefixed files,
    such as Spark's ``_SUCCESS``, left out)."""
    from riverbed.storage import open_store

    assert lookup.location is not None
    parent, _, name = lookup.location.rstrip("/").rpartition("/")
    if name.endswith(".parquet"):
        folder = open_store(parent or ".")
        if folder.head(name) is not None:
            return read_parquet_bytes(folder.get(name))
    store = open_store(lookup.location)
    keys = [
        i.key
        for i in store.list()
        if i.key.endswith(".parquet")
        and not any(part.startswith((".", "_")) for part in i.key.split("/"))
    ]
    if not keys:
        raise LookupTableError(
            f"lookup {lookup.label}: no such file or directory, or no .parquet files there"
        )
    parts = [read_parquet_bytes(store.get(k)) for k in keys]
    return pa.concat_tables(parts, promote_options="permissive")


def _read_sql(lookup: Lookup) -> pa.Table:
    from riverbed.stream.sinks import _ident

    assert lookup.table is not None and lookup.location is not None
    query = f"SELECT * FROM {_ident(lookup.table)}"  # noqa: S608 - a validated name, quoted
    parts = urlsplit(lookup.location)
    if parts.scheme == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or not Path(path).is_file():
            raise LookupTableError(f"lookup {lookup.label}: no SQLite database at {path!r}")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            cur = conn.execute(query)
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        finally:
            conn.close()
    else:
        import psycopg
        from psycopg import sql

        dsn = lookup.location.replace("postgres://", "postgresql://", 1)
        select = sql.SQL("SELECT * FROM {}").format(sql.Identifier(lookup.table))
        with psycopg.connect(dsn, connect_timeout=10) as pg, pg.cursor() as pcur:
            pcur.execute(select)
            assert pcur.description is not None
            names = [d.name for d in pcur.description]
            rows = pcur.fetchall()
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    return pa.table({n: pa.array(list(c)) for n, c in zip(names, columns, strict=True)})


# the Arrow types a lookup's columns are carried as (the types expressions read)
def _carried(t: pa.DataType) -> pa.DataType | None:
    if pa.types.is_boolean(t) or pa.types.is_int64(t) or pa.types.is_float64(t):
        return t
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return pa.int32()
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_dictionary(t):
        return _carried(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_decimal(t) and t.precision <= 38:
        return t
    if pa.types.is_null(t):
        return pa.string()  # a column of NULLs only (an empty SQL table's, say)
    return None


def normalized(lookup: Lookup, raw: pa.Table) -> pa.Table:
    """The key and the added columns of ``raw`` in the types riverbed carries, sorted by
    key (one content, one snapshot, whatever order the table was read in); rows with a
    NULL key dropped (they match nothing)."""
    key = lookup.table_column
    have = raw.column_names
    if key not in have:
        raise LookupTableError(
            f"lookup {lookup.label}: the table has no column {key!r} to join on (it has "
            f"{', '.join(have)})"
        )
    pairs: Mapping[str, str] = lookup.columns or {c: c for c in have if c != key}  # type: ignore[assignment]
    missing = [c for c in pairs.values() if c not in have]
    if missing:
        raise LookupTableError(
            f"lookup {lookup.label}: the table has no column(s) {missing} (it has "
            f"{', '.join(have)})"
        )
    out: dict[str, pa.ChunkedArray] = {}
    for name, source in [(key, key), *pairs.items()]:
        column = raw.column(source)
        carried = _carried(column.type)
        if carried is None:
            raise LookupTableError(
                f"lookup {lookup.label}: column {source!r} is {column.type}, which riverbed "
                "cannot carry (booleans, integers, doubles, decimals, strings and "
                "timestamps): leave it out with columns=[...]"
            )
        if pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = pc.assume_timezone(column, "UTC")
        out[name] = column.cast(carried) if column.type != carried else column
    table = pa.table(out)
    table = table.filter(pc.is_valid(table.column(key)))
    keys = table.column(key)
    if pc.count_distinct(keys).as_py() != len(keys):
        counts = pc.value_counts(keys)
        twice = [
            v.as_py()
            for v, n in zip(counts.field("values"), counts.field("counts"), strict=True)
            if n.as_py() > 1
        ]
        raise LookupTableError(
            f"lookup {lookup.label}: {len(twice)} key(s) of {key!r} have more than one row "
            f"(e.g. {twice[:3]}); a lookup table has one row per key"
        )
    return table.sort_by(key).combine_chunks()


# -- snapshots: the version of each table a batch joins with -------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One lookup's version for a batch, as its plan records it."""

    id: str  # the content hash: riverbed/lookups/<id>.arrow
    at_ms: int  # when the table was read (wall clock)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "at_ms": self.at_ms}

    @staticmethod
    def of(data: Mapping[str, Any]) -> Snapshot:
        return Snapshot(str(data["id"]), int(data["at_ms"]))


def due(lookup: Lookup, previous: Snapshot | None, now_ms: int) -> bool:
    """Whether a new batch reads the table again rather than keep ``previous``."""
    return previous is None or now_ms - previous.at_ms >= lookup.refresh_ms


def encoded(table: pa.Table) -> tuple[str, bytes]:
    """A snapshot's object: its content hash and bytes (an Arrow IPC stream)."""
    data = ipc_bytes(table)
    return hashlib.sha256(data).hexdigest()[:32], data


def plan_snapshots(
    lookups: Sequence[Lookup],
    previous: Sequence[Snapshot] | None,
    store: ObjectStore,
    now_ms: int | None = None,
    schemas: Sequence[pa.Schema] | None = None,
    log_url: str | None = None,
    partitions: int = 1,
) -> list[Snapshot]:
    """The snapshot of each lookup for a new batch: the previous batch's while it is
    fresh enough, else the table read now, written once per content (whole, or in
    parts: :func:`riverbed.stream.lookupparts.part_count` of the state's
    ``partitions``). A table that
    cannot be read, is no longer keyed, or whose columns are no longer ``schemas`` (the
    ones the spec was compiled against at start) keeps the previous snapshot, with a
    warning, when there is one; on a first batch it is :class:`LookupTableError`."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    before = list(previous or [])
    if len(before) != len(lookups):  # a first batch, or the lookups were changed
        before = [None] * len(lookups)  # type: ignore[list-item]
    out = []
    for lookup, was in zip(lookups, before, strict=True):
        if not due(lookup, was, now_ms):
            out.append(was)
            continue
        try:
            table = read_table(lookup, log_url)
            if schemas is not None and table.schema != schemas[len(out)]:
                raise LookupTableError(
                    f"lookup {lookup.label}: the table's columns changed since the stream "
                    f"started (now {_columns(table.schema)}, then "
                    f"{_columns(schemas[len(out)])}); restart the stream to join with them"
                )
        except LookupTableError as exc:
            if was is None:
                raise
            log.warning("%s; joining with the version read at %s ms", exc, was.at_ms)
            out.append(was)
            continue
        n = lookupparts.part_count(lookup, table, partitions)
        if n > 1:  # too big for a task's memory: in parts placed as the state is
            digest = lookupparts.store_parts(store, LOOKUPS, table, lookup.table_column, n)
        else:
            digest, data = encoded(table)
            store.put_if_absent(f"{LOOKUPS}{digest}.arrow", data)
        out.append(Snapshot(digest, now_ms))
    return out


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def prune_snapshots(store: ObjectStore, keep: set[str]) -> int:
    """Delete the snapshots no batch that can still run names (``keep``: the ids of the
    newest batches' plans); how many went."""
    gone = [  # (a snapshot in parts: the objects under <id>/)
        i.key
        for i in store.list(LOOKUPS)
        if i.key.endswith(".arrow")
        and i.key[len(LOOKUPS) :].split("/")[0].removesuffix(".arrow") not in keep
    ]
    store.delete_many(gone)
    return len(gone)


def tables(checkpoint: str, ids: Sequence[str]) -> tuple[Any, ...]:
    """The snapshots ``ids`` of a checkpoint's lookups, read once per process (a
    snapshot in parts: a :class:`~riverbed.stream.lookupparts.Parts`, read a part at a
    time)."""
    return tuple(_snapshot(checkpoint, i) for i in ids)


@functools.lru_cache(maxsize=16)
def _snapshot(checkpoint: str, snapshot_id: str) -> Any:
    if lookupparts.parted(snapshot_id):
        return lookupparts.Parts(checkpoint_store(checkpoint), LOOKUPS, snapshot_id)
    return read_ipc_bytes(checkpoint_store(checkpoint).get(f"{LOOKUPS}{snapshot_id}.arrow"))


# -- the driver's part: at start and for every batch -----------------------------------------


def start_schemas(
    lookups: Sequence[Lookup],
    checkpoint: str,
    recorded: Sequence[Snapshot] | None,
    log_url: str | None = None,
) -> tuple[pa.Schema, ...]:
    """The columns of each lookup's table, which the spec is compiled against at start:
    the table's as it is now, or, while it cannot be read, the newest batch's snapshot's
    (``recorded``) — a stream restarts on the version it last joined with. A table
    that cannot be read and has no snapshot is :class:`LookupTableError`."""
    out = []
    for at, lookup in enumerate(lookups):
        try:
            out.append(read_table(lookup, log_url).schema)
        except LookupTableError as exc:
            if not recorded or len(recorded) != len(lookups):
                raise
            log.warning("%s; starting with the version the last batch joined with", exc)
            out.append(_snapshot(checkpoint, recorded[at].id).schema)
    return tuple(out)


def at_start(
    lookups: Sequence[Lookup], checkpoint: str, log_url: str | None = None
) -> tuple[pa.Schema, ...]:
    """:func:`start_schemas`, with the newest batch's snapshots as the fallback."""
    if not lookups:
        return ()
    from riverbed.stream.batchlog import open_batches

    batches = open_batches(checkpoint)
    ids = batches.ids()
    newest = batches.get(ids[-1]) if ids else None
    before = recorded(newest.lookups) if newest else None
    return start_schemas(lookups, checkpoint, before, log_url)


def added_columns(schemas: Sequence[pa.Schema], lookups: Sequence[Lookup]) -> list[str]:
    """The names of the columns the lookups add to each event."""
    return [
        f.name
        for lookup, schema in zip(lookups, schemas, strict=True)
        for f in schema
        if f.name != lookup.table_column
    ]


def recorded(data: Sequence[Mapping[str, Any]] | None) -> list[Snapshot] | None:
    """A batch record's ``lookups`` as snapshots."""
    return None if data is None else [Snapshot.of(d) for d in data]


def planned(config: EngineConfig, previous: BatchRecord | None) -> list[dict[str, Any]] | None:
    """A new batch's ``lookups`` (its record's) for an aggregation: :func:`plan_record`."""
    if not config.spec.lookups:
        return None
    return plan_record(
        config.spec.lookups, config.checkpoint, previous, config.lookup_schemas or None,
        config.log_url, config.spec.state_partitions,
    )  # fmt: skip


def plan_record(
    lookups: Sequence[Lookup],
    checkpoint: str,
    previous: BatchRecord | None,
    schemas: Sequence[pa.Schema] | None,
    log_url: str | None,
    partitions: int = 1,
) -> list[dict[str, Any]]:
    """A new batch's ``lookups`` (its record's) — an aggregation's, or a lookup join's
    table: :func:`plan_snapshots` after the ``previous`` batch's; snapshots no batch
    that can still run names are pruned."""
    store = checkpoint_store(checkpoint)
    before = recorded(previous.lookups) if previous is not None else None
    snapshots = plan_snapshots(
        lookups, before, store, schemas=schemas, log_url=log_url, partitions=partitions
    )
    now = {s.id for s in snapshots}
    was = {s.id for s in before or ()}
    if now != was:  # only the newest batch can run again; the one before it is done
        prune_snapshots(store, now | was)
    return [s.to_json() for s in snapshots]


def running(
    config: EngineConfig, batches: Batches, batch_id: int, record: BatchRecord
) -> EngineConfig:
    """``config`` for running batch ``batch_id``: with the snapshots its plan names. A
    batch planned before the spec had these lookups (not done: nothing of it was
    written) is given them now, recorded before it runs."""
    lookups = config.spec.lookups
    if not lookups:
        return config
    if record.lookups is None or len(record.lookups) != len(lookups):
        record.lookups = planned(config, batches.previous(batch_id))
        batches.put(batch_id, record)
    assert record.lookups is not None
    return dataclasses.replace(config, lookups=tuple(str(d["id"]) for d in record.lookups))


# -- the join -------------------------------------------------------------------------------


def join(
    events: pa.Table, lookup: Lookup, table: pa.Table | lookupparts.Parts
) -> tuple[pa.Table, pa.Array]:
    """``events`` with the lookup's columns appended (row for row: the events' order and
    number are kept), and whether each event found a row (``table``: a snapshot, whole
    or in parts)."""
    if isinstance(table, lookupparts.Parts):
        return table.join(events, lookup)
    return join_with(events, lookup, table)


def key_types_match(event: SqlType, table: SqlType) -> bool:
    """Whether events' values of type ``event`` can be looked up in a table key of type
    ``table`` (integers of any width; otherwise one type)."""
    return (event.integral and table.integral) or event == table
