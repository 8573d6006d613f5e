"""Lakehouse tables: how riverbed names and reaches a Delta or Iceberg table, and a
table whose partitions are replaced whole, each by a fenced writer.

(Over 600 lines: the two formats' partition tables side by side, on the naming and
reaching they share, so that each fencing rule is written once for both and read in
one place. Split the partition tables out when a third format comes.)

**Naming** (the one owner of the spelling; ``stream run --table`` and a time-range
job's ``tables=`` both read it)::

    delta:PATH_OR_URL                                a directory, file:///path, s3://bucket/prefix
    iceberg:CATALOG#namespace.table[@WAREHOUSE]      a SQL catalog (sqlite:///catalog.db,
                                                     postgresql://…) or a REST one (http(s)://…)

**Reaching** it: delta-rs's object-store options and pyiceberg's file IO come from
riverbed's own bucket settings (the AWS chain); neither is ever printed.

**Partitions replaced whole** (:class:`PartitionTable`): a time-range job's chunk is one
partition (column ``chunk``, the chunk's label) of a table per dataset. Publishing a
chunk is one table commit that replaces its partition (Delta: an overwrite with the
predicate ``chunk = '<label>'``, Spark's ``replaceWhere``; Iceberg: an overwrite
filtered to it) and records, in the same commit, the *version* the writer publishes —
the revision of the chunk's record in the control plane, which only grows. A writer
finds the version the table holds first and commits nothing when it is as new as its
own or newer, so a re-publication after a crash writes nothing and a paused driver that
wakes up after a newer run of the chunk cannot put its older rows back. Two writers
racing lose or win the table's optimistic check; the loser reads again and decides
again. (Delta keeps the version as an application transaction, ``txn`` with ``appId`` =
``riverbed:<owner>:<partition>``; Iceberg as a table property
``riverbed.partition.<owner>.<partition>``, set in the commit that replaces the rows —
properties outlive snapshot expiry, where a snapshot summary would not.)

A partition's version fences stale writers for :data:`VERSION_RETENTION_HOURS` after
its last commit, then goes, so a table written a partition a minute does not keep a
version for each for ever (Delta: the table property
``delta.setTransactionRetentionDuration``, set by riverbed's first commit — or its
next one, on a table made before — and each ``txn`` stamped with its time; Iceberg:
beside each version, ``riverbed.partition-at.<owner>.<partition>``, the time of its
commit, and a commit removes the versions whose time is that old). A version written
without a time (by a riverbed before 2026-12-07) stays.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from riverbed.errors import InvalidValueError, RiverbedError
from riverbed.iceberg import (
    expire_iceberg_history,
    iceberg_history_ms,
    iceberg_transaction,
    new_iceberg_table,
)
from riverbed.locations import shown

log = logging.getLogger(__name__)

__all__ = [
    "FILE_RETENTION_HOURS",
    "PARTITION",
    "SPELLINGS",
    "VERSION_RETENTION_HOURS",
    "PartitionTable",
    "TableError",
    "TableName",
    "delta_interval",
    "delta_options",
    "expired_versions",
    "iceberg_catalog",
    "parse_table",
    "partition_table",
    "read_files_with_spark",
    "read_with_spark",
    "upkeep",
    "vacuum_delta",
]

PARTITION = "chunk"  # the partition column of a table whose partitions are chunks
ICEBERG_VERSION = "riverbed.partition"  # .<owner>.<partition>: a partition's version
ICEBERG_AT = "riverbed.partition-at"  # .<owner>.<partition>: its commit's time, ms
COMMIT_TRIES = 8  # a writer that keeps losing the table's optimistic check gives up
PARTITION_HISTORY = 100  # snapshots a partition table keeps at least, unless told more
# a data file no version of a Delta or Iceberg table riverbed writes names any more stays
# this long (readers in flight of an older version), then compaction or vacuum deletes it
FILE_RETENTION_HOURS = 168
# a partition's version refuses a stale writer (one paused since before the newest
# commit of the partition) this long after that commit, then it is forgotten: the
# horizon of stale writers the files' retention assumes too
VERSION_RETENTION_HOURS = FILE_RETENTION_HOURS
DELTA_TXN_RETENTION = "delta.setTransactionRetentionDuration"


class TableError(RiverbedError):
    """A Delta or Iceberg table riverbed cannot reach or write."""


class TableNameError(TableError, InvalidValueError):
    """A table spelled in none of the ways riverbed reads."""


SPELLINGS = (
    "delta:PATH (a directory, file:///path or s3://bucket/prefix) or "
    "iceberg:CATALOG#namespace.table[@WAREHOUSE] (a SQL catalog: sqlite:///catalog.db, "
    "its files beside it unless @WAREHOUSE names a directory or s3://bucket/prefix)"
)


@dataclass(frozen=True)
class TableName:
    """A table as the user named it: ``kind`` delta (``where``: its location) or iceberg
    (``where``: the catalog URL; ``table``: ``namespace.table``)."""

    kind: str
    where: str
    table: str = ""
    warehouse: str | None = None

    def __repr__(self) -> str:  # a catalog URL may hold a password
        return f"TableName({self.kind}:{shown(self.where)}{'#' + self.table if self.table else ''})"


def parse_table(text: str, what: str = "--table") -> TableName:
    """``delta:PATH_OR_URL`` or ``iceberg:CATALOG_URL#namespace.table[@WAREHOUSE]``."""
    kind, sep, where = str(text).partition(":")
    if sep and where and kind == "delta":
        return TableName("delta", where)
    catalog, hash_, table = where.rpartition("#")
    table, at, warehouse = table.partition("@")
    if sep and kind == "iceberg" and hash_ and catalog and table and (warehouse or not at):
        return TableName("iceberg", catalog, table, warehouse or None)
    raise TableNameError(f"{what} {shown(str(text).split('@')[-1])!r}: write {SPELLINGS}")


def delta_location(location: str | Path) -> str:
    """What delta-rs opens: a path as given, ``file://`` dropped."""
    text = str(location)
    return text[len("file://") :] if text.startswith("file://") else text


def open_delta(uri: str, options: dict[str, str] | None) -> Any:
    """The Delta table at ``uri`` (delta-rs), or None when there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None


def delta_options(uri: str) -> dict[str, str] | None:
    """delta-rs's object-store settings for a bucket, from riverbed's (the AWS chain):
    the endpoint, the keys, and plain HTTP for a server on loopback. Conditional puts
    (``If-None-Match``) make a commit create-only, as riverbed's own checkpoint writes
    are, so no lock service is needed."""
    if not uri.startswith("s3://"):
        return None
    from riverbed.storage import storage_environment

    env = storage_environment()
    out = {k: v for k, v in env.items() if k.startswith("AWS_")}
    endpoint = out.get("AWS_ENDPOINT_URL_S3") or out.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    out.setdefault("AWS_REGION", out.get("AWS_DEFAULT_REGION", "us-east-1"))
    out["conditional_put"] = "etag"
    return out


def iceberg_io(warehouse: str) -> dict[str, str]:
    """pyiceberg's file-IO settings for a warehouse in a bucket, from riverbed's AWS
    settings chain (endpoint, region, addressing, keys); none for a directory. Held by
    the catalog object only: never printed."""
    if not warehouse.startswith("s3://"):
        return {}
    from riverbed.storage.awschain import checksums_when_required, settings_from_env

    s = settings_from_env()
    checksums_when_required(s)  # pyarrow's S3 client, under pyiceberg
    out = {
        "s3.region": s.region,
        "s3.force-virtual-addressing": str(not s.path_style).lower(),
    }
    if s.endpoint:
        out["s3.endpoint"] = s.endpoint
    if s.anonymous:
        out["s3.anonymous"] = "true"
    for key, value in (
        ("s3.access-key-id", s.access_key),
        ("s3.secret-access-key", s.secret_key),
        ("s3.session-token", s.session_token),
    ):
        if value:
            out[key] = value
    return out


def iceberg_catalog(catalog: str, warehouse: str | Path | None, error: type[Exception]) -> Any:
    """pyiceberg's catalog object for ``catalog``: a SQL catalog (SQLite, its warehouse
    beside it by default, or PostgreSQL) or a REST catalog (it places the files). Wrong
    arguments raise ``error`` naming the fix; a credential is never shown."""
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError:
        raise error("Iceberg tables need pyiceberg: pip install 'riverbed[iceberg]'") from None
    uri = catalog
    if uri.startswith(("http://", "https://")):  # a REST catalog: it places the files
        if "@" in uri.split("://", 1)[1].split("/", 1)[0]:
            raise error(
                "an Iceberg REST catalog's URL carries no credentials: give its token "
                "as PYICEBERG_CATALOG__RIVERBED__TOKEN (pyiceberg's setting, never printed)"
            )
        where = None if warehouse is None else str(warehouse)
        props = {"type": "rest", "uri": uri}
        if where is not None:  # the warehouse the catalog serves (some serve several)
            props |= {"warehouse": where, **iceberg_io(where)}
        # pyiceberg adds its PYICEBERG_CATALOG__RIVERBED__* settings (a token, S3 IO)
        return load_catalog("riverbed", **props)
    if uri.startswith(("postgresql://", "postgres://")):
        uri = "postgresql+psycopg://" + uri.split("://", 1)[1]
    if warehouse is None:
        if not uri.startswith("sqlite:///"):
            raise error(
                f"Iceberg catalog {shown(catalog)!r}: give warehouse=, where the "
                "table's files go (beside a SQLite catalog by default)"
            )
        warehouse = Path(uri[len("sqlite:///") :]).resolve().parent / "warehouse"
    where = str(warehouse)
    if "://" not in where:
        where = f"file://{Path(where).resolve()}"
    return SqlCatalog("riverbed", uri=uri, warehouse=where, **iceberg_io(where))


# -- partitions replaced whole ---------------------------------------------------------


class PartitionTable(Protocol):
    """A table whose partitions (column :data:`PARTITION`) are each replaced whole by
    one fenced commit (this module's docstring)."""

    def version(self, partition: str) -> int | None:
        """The version partition ``partition`` was last replaced at (None: never)."""
        ...

    def replace(self, partition: str, rows: pa.Table, version: int) -> bool:
        """Make ``rows`` partition ``partition``'s rows at ``version`` in one commit;
        False (nothing written) when the table holds that version or a newer one."""
        ...

    def read(self) -> pa.Table:
        """Every row of the table (tests, status)."""
        ...

    def drop(self) -> None:
        """Delete the table, its files too (``riverbed timerange reset --output``)."""
        ...

    def files(self) -> tuple[str, list[str]]:
        """The table's root and the Parquet files of its current rows, whole files (the
        commits are copy-on-write), for readers with no table connector
        (:func:`read_with_spark`)."""
        ...


def partition_table(text: str, owner: str) -> PartitionTable:
    """The table ``text`` names (:func:`parse_table`), its partitions written by
    ``owner`` (a time-range job's name)."""
    name = parse_table(text, "table")
    if name.kind == "delta":
        return DeltaPartitions(name.where, owner)
    return IcebergPartitions(name.where, name.table, name.warehouse, owner)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _decided(
    attempt: Callable[[], bool],
    conflicts: tuple[type[Exception], ...],
    table: str,
    partition: str,
) -> bool:
    """``attempt()`` (read the table, decide, commit) until it does not lose the table's
    optimistic check to another writer: then it reads again and decides again."""
    for _ in range(COMMIT_TRIES):
        try:
            return attempt()
        except conflicts as exc:
            log.info("%s: partition %s: %s; reading again", table, partition, exc)
    raise TableError(
        f"{table}: partition {partition} lost the table's concurrency check "
        f"{COMMIT_TRIES} times in a row; is another job writing it?"
    )


def _with_partition(rows: pa.Table, partition: str) -> pa.Table:
    if PARTITION in rows.column_names:
        raise TableError(
            f"the rows have a column named {PARTITION!r}, the table's partition column: "
            "rename it in the job"
        )
    return rows.append_column(
        pa.field(PARTITION, pa.string(), nullable=False),
        pa.array([partition] * rows.num_rows, pa.string()),
    )


def upkeep(what: str, work: Callable[[], None], expected: tuple[type[Exception], ...] = ()) -> bool:
    """Run a table's upkeep — a vacuum, a snapshot expiry, a compaction — after a commit
    that already succeeded; whether it ran. Whatever it raises is logged and left to its
    next turn, never the commit's failure: a bucket's hiccup in a vacuum must not stop
    a stream, or publish a chunk once more. ``expected`` (another writer's commit came
    first) is said quietly; anything else as a warning."""
    try:
        work()
    except expected as exc:
        log.info("%s deferred: %s", what, exc)
        return False
    except Exception as exc:
        log.warning("%s failed and is left to its next turn: %s: %s", what, type(exc).__name__, exc)
        return False
    return True


def vacuum_delta(table: Any, retention_hours: float) -> None:
    """Delete the files of a Delta ``table`` that no version younger than
    ``retention_hours`` names — also those no commit ever named (a writer killed between
    its files and its commit), once that old, which delta-rs's default vacuum keeps for
    ever. Younger ones may be a commit's in flight, or an older version's a reader is on."""
    table.vacuum(
        retention_hours=retention_hours,
        dry_run=False,
        enforce_retention_duration=False,
        full=True,
    )


def delta_interval(hours: float) -> str:
    """``hours`` as a Delta table property's interval (``interval 168 hours``)."""
    if hours == int(hours):
        return f"interval {int(hours)} hours"
    return f"interval {round(hours * 3600)} seconds"


def expired_versions(
    properties: dict[str, str], owner: str, now_ms: int, retention_ms: int
) -> list[str]:
    """The properties of ``owner``'s partitions (their version and its time) to remove
    from an Iceberg partition table at ``now_ms``: those whose commit is more than
    ``retention_ms`` old. A version with no time beside it (written before there was
    one) stays."""
    at_prefix = f"{ICEBERG_AT}.{owner}."
    doomed = []
    for key, value in properties.items():
        if not key.startswith(at_prefix):
            continue
        try:
            at = int(value)
        except ValueError:
            continue  # not riverbed's spelling: not riverbed's to remove
        if now_ms - at > retention_ms:
            doomed += [key, f"{ICEBERG_VERSION}.{owner}.{key[len(at_prefix) :]}"]
    return sorted(doomed)


def _literal(partition: str) -> str:
    if "'" in partition:
        raise TableError(f"partition {partition!r}: a quote cannot be part of its name")
    return f"{PARTITION} = '{partition}'"


class DeltaPartitions:
    """A Delta table partitioned by :data:`PARTITION` (made by its first commit)."""

    def __init__(self, location: str | Path, owner: str) -> None:
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise TableError(
                "Delta tables need the deltalake package: pip install 'riverbed[delta]'"
            ) from None
        self.uri = delta_location(location)
        self.options = delta_options(self.uri)
        self.owner = owner

    def __repr__(self) -> str:
        return f"DeltaPartitions({shown(self.uri)!r})"

    def _app(self, partition: str) -> str:
        return f"riverbed:{self.owner}:{partition}"

    def _table(self) -> Any:
        return open_delta(self.uri, self.options)

    def version(self, partition: str, table: Any = None) -> int | None:
        table = self._table() if table is None else table
        if table is None:
            return None
        found = table.transaction_version(self._app(partition))
        return None if found is None else int(found)

    def replace(self, partition: str, rows: pa.Table, version: int) -> bool:
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        data = _with_partition(rows, partition)
        retention = delta_interval(VERSION_RETENTION_HOURS)

        read: list[int] = []

        def attempt() -> bool:
            table = self._table()
            held = self.version(partition, table)
            if held is not None and held >= version:
                return False
            if table is not None and DELTA_TXN_RETENTION not in table.metadata().configuration:
                # a table made before versions expired (one the user set is theirs)
                table.alter.set_table_properties({DELTA_TXN_RETENTION: retention})
                table = self._table()
            read.append(-1 if table is None else int(table.version()))
            stamp = Transaction(self._app(partition), version, last_updated=_now_ms())
            write_deltalake(
                self.uri if table is None else table,  # its version: what it read
                data,
                partition_by=[PARTITION],
                mode="overwrite",
                predicate=_literal(partition),
                schema_mode="merge" if table is not None else None,
                configuration={DELTA_TXN_RETENTION: retention} if table is None else None,
                storage_options=self.options,
                commit_properties=CommitProperties(app_transactions=[stamp]),
            )
            return True

        name = f"Delta table {shown(self.uri)}"
        if not _decided(attempt, (CommitFailedError,), name, partition):
            return False
        made = read[-1] + 1  # the version this commit made (a vacuum's commits count too)
        if made > 0 and made % PARTITION_HISTORY == 0:
            self._vacuum()
        return True

    def _vacuum(self) -> None:
        """Every replacement leaves the partition's old files in the table's directory
        (the log only stops naming them: a chunk a minute, 10,000 dead files a week);
        a commit that makes a multiple of :data:`PARTITION_HISTORY` its version (a
        vacuum's own two commits count) deletes those no version younger than
        :data:`FILE_RETENTION_HOURS` names, and those no commit ever named (a writer
        killed between its files and its commit) once that old. The log itself is
        Delta's to bound (checkpoints, ``delta.logRetentionDuration``)."""
        from deltalake.exceptions import CommitFailedError

        upkeep(
            f"Delta table {shown(self.uri)}: vacuum",
            lambda: vacuum_delta(self._table(), FILE_RETENTION_HOURS),
            (CommitFailedError,),
        )

    def read(self) -> pa.Table:
        table = self._table()
        return pa.table({}) if table is None else table.to_pyarrow_table()

    def files(self) -> tuple[str, list[str]]:
        table = self._table()
        if table is None:
            raise TableError(f"no Delta table at {shown(self.uri)}")
        if "deletionVectors" in set(table.protocol().writer_features or []):
            raise TableError(f"Delta table {shown(self.uri)} uses deletion vectors")
        return self.uri, [str(u) for u in table.file_uris()]

    def drop(self) -> None:
        from riverbed.storage import open_store

        open_store(self.uri).delete_prefix("")


class IcebergPartitions:
    """An Iceberg table partitioned by :data:`PARTITION` (identity), made on first use."""

    def __init__(self, catalog: str, identifier: str, warehouse: str | None, owner: str) -> None:
        namespace, dot, table = identifier.rpartition(".")
        if not dot or not namespace or not table:
            raise TableNameError(
                f"Iceberg table {identifier!r}: name it namespace.table, e.g. results.clicks"
            )
        self.catalog = iceberg_catalog(catalog, warehouse, TableError)
        self.identifier = identifier
        self.namespace = namespace
        self.owner = owner

    def __repr__(self) -> str:
        return f"IcebergPartitions({self.identifier!r})"

    def _key(self, partition: str) -> str:
        return f"{ICEBERG_VERSION}.{self.owner}.{partition}"

    def _at(self, partition: str) -> str:
        return f"{ICEBERG_AT}.{self.owner}.{partition}"

    def _table(self, schema: pa.Schema | None = None) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            if schema is None:
                return None
            self.catalog.create_namespace_if_not_exists(self.namespace)
            table = self.catalog.create_table_if_not_exists(
                self.identifier, schema=schema, properties=new_iceberg_table(self.catalog)
            )
        if schema is not None and not any(
            table.schema().find_field(f.source_id).name == PARTITION for f in table.spec().fields
        ):  # its own commit, before any rows (a writer killed in between finds it undone)
            with table.update_spec() as update:
                update.add_identity(PARTITION)
            table = table.refresh()
        return table

    def version(self, partition: str, table: Any = None) -> int | None:
        table = self._table() if table is None else table
        if table is None:
            return None
        found = table.properties.get(self._key(partition))
        return None if found is None else int(found)

    def replace(self, partition: str, rows: pa.Table, version: int) -> bool:
        import importlib

        from pyiceberg.exceptions import CommitFailedException, ValidationException

        ex: Any = importlib.import_module("pyiceberg.expressions")  # pydantic-typed: loose here

        _literal(partition)
        data = _with_partition(rows, partition)

        committed: list[tuple[Any, int | None]] = []

        def attempt() -> bool:
            table = self._table(data.schema)
            held = self.version(partition, table)
            if held is not None and held >= version:
                return False
            # a bad history setting is refused before anything is written
            history_ms = iceberg_history_ms(table, TableError, self.identifier)
            known = {f.name for f in table.schema().fields}
            new = [f for f in data.schema if f.name not in known]
            if new:  # a column a later version of the job adds: its own commit first
                with table.update_schema() as update:
                    update.union_by_name(pa.schema(new))
                table = table.refresh()
            with warnings.catch_warnings(), iceberg_transaction(table) as tx:
                # a partition replaced for the first time: "did not match any records"
                warnings.simplefilter("ignore", UserWarning)
                now = _now_ms()
                retention_ms = round(VERSION_RETENTION_HOURS * 3_600_000)
                stale = expired_versions(table.properties, self.owner, now, retention_ms)
                stale = [k for k in stale if k not in (self._key(partition), self._at(partition))]
                if stale:
                    tx.remove_properties(*stale)
                tx.set_properties(
                    {self._key(partition): str(version), self._at(partition): str(now)}
                )
                tx.overwrite(
                    _as_table_columns(data, table.schema().as_arrow()),
                    overwrite_filter=ex.EqualTo(PARTITION, partition),
                )
            committed.append((table, history_ms))
            return True

        conflicts = (CommitFailedException, ValidationException)
        if not _decided(attempt, conflicts, f"Iceberg table {self.identifier}", partition):
            return False
        table, history_ms = committed[-1]
        self._bound_history(table, history_ms, conflicts)
        return True

    def _bound_history(
        self, table: Any, history_ms: int | None, conflicts: tuple[type[Exception], ...]
    ) -> None:
        """Every commit adds a snapshot (a chunk a minute: 10,000 a week), and each
        commit's cost grows with them: past twice :data:`PARTITION_HISTORY`, expire all
        but the newest of them (or what the table's ``history.expire.max-snapshot-age-ms``
        keeps). The partitions' versions are table properties, which expiry leaves."""
        snapshots = sorted(s.timestamp_ms for s in table.snapshots())
        if len(snapshots) <= 2 * PARTITION_HISTORY:
            return
        upkeep(
            f"Iceberg table {self.identifier}: snapshot expiry",
            lambda: expire_iceberg_history(
                table, snapshots[-PARTITION_HISTORY], history_ms, FILE_RETENTION_HOURS
            ),
            conflicts,
        )

    def read(self) -> pa.Table:
        table = self._table()
        return pa.table({}) if table is None else table.scan().to_arrow()

    def files(self) -> tuple[str, list[str]]:
        table = self._table()
        if table is None:
            raise TableError(f"no Iceberg table {self.identifier}")
        tasks = list(table.scan().plan_files())
        if any(t.delete_files for t in tasks):
            raise TableError(f"Iceberg table {self.identifier} has delete files")
        return f"{table.location().rstrip('/')}/data", [str(t.file.file_path) for t in tasks]

    def drop(self) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        with contextlib.suppress(NoSuchTableError):
            self.catalog.purge_table(self.identifier)


def read_with_spark(spark: Any, table: PartitionTable) -> Any:
    """A partitioned table as a Spark DataFrame, read by Spark's own Parquet reader from
    the files the table names as current (no Delta or Iceberg connector is published
    for this Spark yet: docs/stream.md, "Results as tables"). Delta keeps a partition's
    value in the files' folder names (``chunk=…/``), which Spark reads from below the
    table's root; Iceberg's files hold it."""
    root, files = table.files()
    if not files:
        raise TableError(f"{table!r} has no rows yet")
    return read_files_with_spark(spark, files, root if isinstance(table, DeltaPartitions) else None)


def read_files_with_spark(spark: Any, files: list[str], base: str | None = None) -> Any:
    """A table's current Parquet ``files`` (paths or URLs) as one Spark DataFrame, by
    Spark's own reader through s3a for a bucket; columns a later commit added are null
    in the files written before (``mergeSchema``); ``base``: the root below which the
    files' folder names are partition values."""
    from riverbed.spark.s3a import configure_for, to_s3a

    def url(where: str) -> str:
        return to_s3a(where if "://" in where else f"file://{where}")

    configure_for(spark, files[0])
    reader = spark.read.option("mergeSchema", "true")
    if base is not None:
        reader = reader.option("basePath", url(base))
    return reader.parquet(*(url(f) for f in files))


def _as_table_columns(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` with the table's columns in its order (one the rows lack: null)."""
    for f in target:
        if f.name not in rows.column_names:
            rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
    return rows.select([f.name for f in target]).cast(target)
