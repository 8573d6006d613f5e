"""Results as a Delta Lake table: one commit per batch that upserts by (window, key).

Readers see one row per window and key — no de-duplication by ``batch_id`` as the
Parquet result table asks of them. Each batch is one ``MERGE`` (delta-rs, through the
``deltalake`` package) that inserts new (window, key) rows, replaces the ones the batch
changed, and deletes a session merged away (its tombstone row). The commit carries the
batch id as the aggregation's *application transaction* (Delta's ``txn`` action:
``appId`` = ``riverbed:<name>``, ``version`` = the batch id), in the same atomic commit
as the rows, so a batch run again after a crash finds its commit and writes nothing,
and a stale driver's older batch is never committed over a newer one. (The engine's
fence stops a replaced driver before each write; this is the table's own guard. A
driver paused *inside* a write can wake to finish its data file, whose commit is then
refused: a file no version names, which readers never see and the compaction deletes
once a week old.)

Maintenance: :meth:`DeltaSink.compact` (delta-rs ``optimize``, then ``vacuum`` of the
files no version of the last week needs), every 100th batch right after its commit — by
the one writer, so it never races a batch's ``MERGE`` for the table's concurrency check.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.iceberg import (
    expire_iceberg_history,
    iceberg_history_ms,
    iceberg_transaction,
    new_iceberg_table,
)
from riverbed.stream.aggregation import DELETED
from riverbed.stream.errors import StreamError
from riverbed.tables import (
    FILE_RETENTION_HOURS,
    TableError,
    delta_location,
    delta_options,
    iceberg_catalog,
    open_delta,
    read_files_with_spark,
    vacuum_delta,
)

log = logging.getLogger(__name__)

__all__ = ["DeltaSink", "IcebergSink", "TableSinkError", "app_id", "read_with_spark"]


class TableSinkError(StreamError, TableError):
    """A Delta or Iceberg table riverbed cannot write its results to."""


def app_id(name: str) -> str:
    """The application id an aggregation's commits carry (Delta's ``txn.appId``)."""
    return f"riverbed:{name}"


class DeltaSink:
    """The Delta table at ``location`` (a path, ``file://`` or ``s3://``)."""

    def __init__(self, location: str | Path) -> None:
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise TableSinkError(
                "Delta tables need the deltalake package: pip install 'riverbed[delta]'"
            ) from None
        self.uri = delta_location(location)
        self.options = delta_options(self.uri)

    def _table(self) -> Any:
        return open_delta(self.uri, self.options)

    def committed(self, name: str, table: Any = None) -> int | None:
        """The newest batch id of aggregation ``name`` the table holds (None: none);
        ``table``: the table already opened (one open a batch)."""
        table = self._table() if table is None else table
        if table is None:
            return None
        version = table.transaction_version(app_id(name))
        return None if version is None else int(version)

    def write(self, name: str, batch_id: int, rows: pd.DataFrame, schema: pa.Schema) -> bool:
        """Commit batch ``batch_id``'s rows (``schema``: the result table's, from the
        spec, so a first commit of no rows still types every column). Whether this call
        committed: False when the table already holds this batch or a newer one."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        table = self._table()
        done = self.committed(name, table)
        if done is not None and done >= batch_id:
            log.info("delta %s: batch %s of %s already committed", self.uri, batch_id, name)
            return False
        gone = (
            rows[DELETED].fillna(False).astype(bool).to_numpy() if DELETED in rows.columns else None
        )
        columns = [f.name for f in schema if f.name != DELETED]
        kept = rows if gone is None else rows[~gone]
        source = pa.Table.from_pandas(
            kept[columns],
            schema=pa.schema([schema.field(c) for c in columns]),
            preserve_index=False,
        )
        commit = CommitProperties(app_transactions=[Transaction(app_id(name), batch_id)])
        if table is None:  # the first commit creates the table
            write_deltalake(
                self.uri,
                source,
                mode="append",
                storage_options=self.options,
                commit_properties=commit,
            )
            return True
        deleted = None
        if gone is not None and gone.any():
            deleted = pa.Table.from_pandas(
                rows[gone][["window_start", "key"]],
                schema=pa.schema([schema.field("window_start"), schema.field("key")]),
                preserve_index=False,
            )
        # a column the spec no longer has is null in the rows written from now on
        target = pa.schema(table.schema().to_arrow())
        grows = bool(_added(source, target))
        source = _with_table_columns(source, target)
        columns = source.column_names
        # one MERGE: the batch's rows (a tombstone's too, flagged) against the table
        merged = source.append_column(DELETED, pa.repeat(pa.scalar(False), source.num_rows))
        if deleted is not None:
            filler = {
                c: pa.nulls(deleted.num_rows, source.schema.field(c).type)
                for c in columns
                if c not in ("window_start", "key")
            }
            tomb = pa.table(
                {
                    **{c: deleted.column(c) for c in ("window_start", "key")},
                    **filler,
                    DELETED: pa.repeat(pa.scalar(True), deleted.num_rows),
                }
            ).select([*columns, DELETED])
            merged = pa.concat_tables([merged, tomb.cast(merged.schema)])
        updates = {c: f"s.`{c}`" for c in columns}
        (
            table.merge(
                merged,
                predicate="t.window_start = s.window_start AND t.key = s.key",
                source_alias="s",
                target_alias="t",
                merge_schema=grows,
                commit_properties=commit,
            )
            .when_matched_delete(predicate=f"s.`{DELETED}` = true")
            .when_matched_update(updates=updates, predicate=f"s.`{DELETED}` = false")
            .when_not_matched_insert(updates=updates, predicate=f"s.`{DELETED}` = false")
            .execute()
        )
        return True

    def read(self) -> pd.DataFrame:
        """The table's rows (tests and ``riverbed query``'s readers use their own)."""
        table = self._table()
        if table is None:
            raise TableSinkError(f"no Delta table at {self.uri}")
        return table.to_pyarrow_table().to_pandas()

    def data_files(self) -> list[str]:
        """The Parquet files holding the table's current rows, as its log lists them —
        whole files, nothing in them deleted since (riverbed's tables are written
        copy-on-write: no deletion vectors, no partitions, no column mapping; a table
        with any of those is refused, naming it)."""
        table = self._table()
        if table is None:
            raise TableSinkError(f"no Delta table at {self.uri}")
        features = set(table.protocol().writer_features or [])
        config = table.metadata().configuration
        problems = [
            *(["deletion vectors"] if "deletionVectors" in features else []),
            *(["partition columns"] if table.metadata().partition_columns else []),
            *(
                ["column mapping"]
                if config.get("delta.columnMapping.mode", "none") != "none"
                else []
            ),
        ]
        if problems:
            raise TableSinkError(
                f"Delta table {self.uri} uses {', '.join(problems)}: its rows are not whole "
                "Parquet files; read it with a Delta reader (deltalake, Polars, DuckDB)"
            )
        return [str(uri) for uri in table.file_uris()]

    def compact(self, retention_hours: int = FILE_RETENTION_HOURS) -> None:
        """Rewrite small files into fewer (``optimize``), then delete the files no
        version younger than ``retention_hours`` needs (``vacuum``) — also those no
        commit ever named, once that old: a writer's data files whose commit never came
        (a driver killed, or a replaced one that woke mid-write and was refused), which
        delta-rs's default vacuum keeps for ever. Younger ones may be a commit's in
        flight and stay."""
        table = self._table()
        if table is None:
            return
        table.optimize.compact()
        vacuum_delta(table, retention_hours)


def _with_table_columns(source: pa.Table, target: pa.Schema) -> pa.Table:
    """``source`` with every column of the table, in the table's order, then the ones
    the table lacks (a metric added: :func:`_added`): one the spec no longer has (a
    metric removed from a running aggregation, stream/changes.py) is null in the new
    rows, as in the Parquet result table (Iceberg's upsert wants the table's columns;
    Delta's MERGE would leave it stale)."""
    for f in target:
        if f.name not in source.column_names:
            source = source.append_column(f, pa.nulls(source.num_rows, f.type))
    known = {f.name for f in target}
    order = [f.name for f in target] + [c for c in source.column_names if c not in known]
    return source.select(order)


def _added(source: pa.Table, target: pa.Schema) -> list[pa.Field]:
    """The columns of ``source`` the table does not have yet (a metric added to the
    running aggregation and backfilled: stream/backfill.py) — the table's schema grows
    by them, as the Parquet result table's files do."""
    known = {f.name for f in target}
    return [f for f in source.schema if f.name not in known]


# -- Apache Iceberg ---------------------------------------------------------------------


class IcebergSink:
    """The Iceberg table ``identifier`` (``namespace.table``) of a SQL catalog
    (pyiceberg's: SQLite, ``sqlite:///catalog.db``, or PostgreSQL), its files under
    ``warehouse`` (a directory or ``file://``; beside a SQLite catalog by default) — or
    of a REST catalog (``http(s)://host:port[/prefix]``), which places the files itself.

    Each batch is one catalog commit (a pyiceberg transaction: the sessions merged away
    deleted, then an upsert by (window_start, key)) whose snapshots carry the batch id
    in their summary (``riverbed.batch.<name>``): a re-run batch, or an older one, finds
    it and commits nothing. Two writers of one table lose or win the catalog's
    optimistic check, never both commit."""

    def __init__(self, catalog: str, identifier: str, warehouse: str | Path | None = None):
        namespace, dot, table = identifier.rpartition(".")
        if not dot or not namespace or not table:
            raise TableSinkError(
                f"Iceberg table {identifier!r}: name it namespace.table, e.g. results.clicks"
            )
        self.identifier = identifier
        self.namespace = namespace
        self.catalog = iceberg_catalog(catalog, warehouse, TableSinkError)

    def _table(self, schema: pa.Schema | None = None) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        if schema is None:
            try:
                return self.catalog.load_table(self.identifier)
            except NoSuchTableError:
                return None
        self.catalog.create_namespace_if_not_exists(self.namespace)
        return self.catalog.create_table_if_not_exists(
            self.identifier, schema=schema, properties=new_iceberg_table(self.catalog)
        )

    def committed(self, name: str, table: Any = None) -> int | None:
        """The newest batch id of aggregation ``name`` the table holds (None: none);
        ``table``: the table already loaded (one load a batch)."""
        table = self._table() if table is None else table
        if table is None:
            return None
        found = _batch_ids(table).get(f"{_BATCH}{name}")
        return None if found is None else int(found)

    def compact(self, retention_hours: int = FILE_RETENTION_HOURS) -> None:
        """Rewrite the table's current rows into as few files as one write makes (each
        batch adds files, and its delete rewrites the files holding the rows it
        replaces); expire the snapshots before the rewrite's — or, when the table sets
        Iceberg's ``history.expire.max-snapshot-age-ms``, those older than that — and
        delete the data files older than ``retention_hours`` which no snapshot left
        refers to (pyiceberg's expiry leaves them; a reader still on an expired snapshot
        finds its files for that long).

        The snapshot history is bounded because every commit's cost grows with it
        (pyiceberg copies the table's metadata, snapshots and all, many times a commit;
        a batch is two snapshots): a week of it at one batch a second is a million
        snapshots. Time travel reaches back to the last compaction by default. The
        rewrite's snapshot carries every aggregation's newest batch id, so the lineage
        that :meth:`committed` walks never loses one."""
        table = self._table()
        if table is None:
            return
        history_ms = iceberg_history_ms(table, TableSinkError, self.identifier)
        props = _batch_ids(table)
        table.overwrite(table.scan().to_arrow(), snapshot_properties=props)
        table = table.refresh()
        current = table.current_snapshot()
        if current is not None:  # every snapshot before the rewrite's expires
            expire_iceberg_history(table, current.timestamp_ms, history_ms, retention_hours)

    def write(self, name: str, batch_id: int, rows: pd.DataFrame, schema: pa.Schema) -> bool:
        """Commit batch ``batch_id``'s rows; whether this call committed."""
        import importlib

        ex: Any = importlib.import_module("pyiceberg.expressions")  # pydantic-typed: loose here

        table = self._table()
        done = self.committed(name, table)
        if done is not None and done >= batch_id:
            return False
        columns = [f.name for f in schema if f.name != DELETED]
        typed = pa.schema([schema.field(c) for c in columns])
        gone = (
            rows[DELETED].fillna(False).astype(bool).to_numpy() if DELETED in rows.columns else None
        )
        kept = rows if gone is None else rows[~gone]
        source = pa.Table.from_pandas(kept[columns], schema=typed, preserve_index=False)
        if table is None:  # the first batch creates it
            table = self._table(typed)
        else:
            new = _added(source, table.schema().as_arrow())
            if new:  # its own commits before the batch's (a re-run finds them made)
                with table.update_schema() as update:
                    update.union_by_name(pa.schema(new))
                table = table.refresh()
            snapshot = table.current_snapshot()
            if snapshot is not None and snapshot.schema_id != table.schema().schema_id:
                # a snapshot of the new schema: pyiceberg's upsert reads the rows it
                # updates with the schema of the branch's snapshot (0.12), which would
                # still be the old one
                table.append(table.schema().as_arrow().empty_table())
                table = table.refresh()
            source = _with_table_columns(source, table.schema().as_arrow())
        props = {f"{_BATCH}{name}": str(batch_id)}
        with iceberg_transaction(table) as tx:
            # an upsert as a delete of every (window, key) the batch touches — its rows
            # and its sessions merged away — then an append of its rows: one commit.
            # (pyiceberg's own upsert joins the batch with the table in Python: 4 s a
            # batch of 2,000 rows on a 31,000-row table; benchmarks/table_sinks.py)
            if len(rows):
                with warnings.catch_warnings():  # new windows: "did not match any records"
                    warnings.simplefilter("ignore", UserWarning)
                    tx.delete(_pairs_filter(ex, rows), snapshot_properties=props)
            tx.append(source, snapshot_properties=props)  # (none: the batch id, still)
        return True

    def read(self) -> pd.DataFrame:
        table = self._table()
        if table is None:
            raise TableSinkError(f"no Iceberg table {self.identifier}")
        return table.scan().to_arrow().to_pandas()

    def data_files(self) -> list[str]:
        """The Parquet files holding the table's current snapshot's rows — whole files:
        riverbed's commits are copy-on-write; a file a delete file applies to is refused."""
        table = self._table()
        if table is None:
            raise TableSinkError(f"no Iceberg table {self.identifier}")
        files = []
        for task in table.scan().plan_files():
            if task.delete_files:
                raise TableSinkError(
                    f"Iceberg table {self.identifier} has delete files: its rows are not "
                    "whole Parquet files; read it with an Iceberg reader (pyiceberg, Polars)"
                )
            files.append(str(task.file.file_path))
        return files


_BATCH = "riverbed.batch."  # a snapshot summary's key: + the aggregation's name


def _batch_ids(table: Any) -> dict[str, str]:
    """Each aggregation's newest batch id in the table (its summary key → the id), the
    first found walking the current snapshot's lineage back."""
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    found: dict[str, str] = {}
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary  # (its Mapping iteration is broken in pyiceberg 0.12)
        for key, value in (summary.additional_properties if summary is not None else {}).items():
            if key.startswith(_BATCH):
                found.setdefault(key, value)
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None
    return found


def _pairs_filter(ex: Any, rows: pd.DataFrame) -> Any:
    """An Iceberg row filter matching exactly the (window_start, key) pairs of ``rows``:
    grouped by whichever of the two has fewer distinct values (a batch of an hourly
    aggregation touches a few windows; of sessions, fewer keys than sessions), each
    group an ``In`` of the other, the groups or-ed as a balanced tree."""
    starts = pd.to_datetime(rows["window_start"], utc=True).map(lambda t: t.isoformat())
    keys = rows["key"].astype(str)
    by_window = starts.nunique() <= keys.nunique()
    outer, inner = ("window_start", "key") if by_window else ("key", "window_start")
    groups = pd.DataFrame({"o": starts if by_window else keys, "i": keys if by_window else starts})
    terms = [
        ex.And(ex.EqualTo(outer, value), ex.In(inner, sorted(set(members))))
        for value, members in groups.groupby("o")["i"]
    ]
    while len(terms) > 1:
        terms = [
            ex.Or(*terms[i : i + 2]) if i + 1 < len(terms) else terms[i]
            for i in range(0, len(terms), 2)
        ]
    return terms[0]


def read_with_spark(spark: Any, table: DeltaSink | IcebergSink) -> Any:
    """A riverbed Delta or Iceberg table as a Spark DataFrame, read by Spark's own Parquet
    reader from the files the table's log names as current — for a Spark that has no
    Delta or Iceberg connector made for it (none is published for Spark 4.3 yet:
    docs/stream.md, "Results as tables"). Columns a later batch added are null in the
    files written before (``mergeSchema``)."""
    files = table.data_files()
    if not files:
        raise TableSinkError("the table has no rows yet")
    return read_files_with_spark(spark, files)
