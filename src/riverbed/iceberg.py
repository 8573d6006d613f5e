"""pyiceberg as riverbed commits with it: a transaction that computes its staged
metadata once per state, the properties of the tables riverbed creates, and the bound on
a table's snapshot history (expiry, and the data files it leaves). The batch sink
(:mod:`riverbed.stream.lakehouse`) and the partition tables (:mod:`riverbed.tables`)
both use them."""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "ICEBERG_HISTORY",
    "expire_iceberg_history",
    "iceberg_history_ms",
    "iceberg_transaction",
    "new_iceberg_table",
]


def iceberg_transaction(table: Any) -> Any:
    """``table.transaction()``, whose staged metadata is computed once per state."""
    return _cached_transaction()(table)


@functools.cache
def _cached_transaction() -> Any:
    """A pyiceberg ``Transaction`` whose staged metadata is computed once per state.

    pyiceberg 0.12's ``Transaction.table_metadata`` replays the staged updates and deep
    copies the whole metadata (every snapshot) on each read, and a delete and an append
    read it dozens of times: most of a commit's time on a table of a few hundred
    snapshots (benchmarks/table_sinks.py: a batch sink's and a partition's). The same
    metadata is returned until an update is staged (``_updates`` is a tuple, rebound on
    each) or the table is refreshed — what apache/iceberg-python#3302 proposes upstream."""
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import update_table_metadata

    class CachedTransaction(Transaction):
        _cached: tuple[Any, Any, Any] | None = None

        @property
        def table_metadata(self) -> Any:
            base, updates = self._table.metadata, self._updates
            cached = self._cached
            if cached is None or cached[0] is not base or cached[1] is not updates:
                cached = (base, updates, update_table_metadata(base, updates))
                self._cached = cached
            return cached[2]

    return CachedTransaction


ICEBERG_HISTORY = "history.expire.max-snapshot-age-ms"  # Iceberg's table property


def new_iceberg_table(catalog: Any) -> dict[str, str]:
    """The properties of an Iceberg table riverbed creates in ``catalog``: with a SQL
    catalog (pyiceberg writes the metadata) the metadata files beyond Iceberg's
    ``write.metadata.previous-versions-max`` (100) are deleted after each commit — one
    per commit otherwise, forever. A REST catalog's server keeps its own policy."""
    from pyiceberg.catalog.sql import SqlCatalog

    if isinstance(catalog, SqlCatalog):
        return {"write.metadata.delete-after-commit.enabled": "true"}
    return {}


def iceberg_history_ms(table: Any, error: type[Exception], name: str) -> int | None:
    """The snapshot history ``table`` asks to keep (Iceberg's
    ``history.expire.max-snapshot-age-ms``, in ms), or None; a value that is not a
    number of milliseconds raises ``error`` naming the fix."""
    history = table.properties.get(ICEBERG_HISTORY)
    try:
        return None if history is None else int(history)
    except ValueError:
        raise error(
            f"Iceberg table {name}: {ICEBERG_HISTORY} is {history!r}, not a number of "
            "milliseconds; set it to one, e.g. 86400000 for a day of snapshots"
        ) from None


def expire_iceberg_history(
    table: Any,
    keep_from_ms: int,
    history_ms: int | None,
    retention_hours: float,
) -> Any:
    """Expire ``table``'s snapshots written before ``keep_from_ms`` — or before
    ``history_ms`` ago, when that is earlier (the table keeps more) — never the current
    one; delete the data files no snapshot left names that are older than
    ``retention_hours`` (riverbed's: :data:`riverbed.tables.FILE_RETENTION_HOURS`). The
    table after."""
    import time
    from datetime import UTC, datetime

    if history_ms is not None:
        keep_from_ms = min(keep_from_ms, int(time.time() * 1000) - history_ms)
    cutoff = datetime.fromtimestamp((keep_from_ms - 1) / 1000, UTC)
    table.maintenance.expire_snapshots().older_than(cutoff).commit()
    table = table.refresh()
    _delete_unreferenced(table, time.time() - retention_hours * 3600)
    return table


def _delete_unreferenced(table: Any, older_than: float) -> int:
    """Delete the table's files that no snapshot refers to and that were written before
    ``older_than`` (seconds since the epoch: a file younger than the retention may
    belong to a commit in flight, or be read by a reader of an expired snapshot): data
    and delete files under ``data/``, manifests and manifest lists under ``metadata/``
    (pyiceberg's expiry leaves them all). How many.

    Each manifest is read once, however many snapshots share it: planning every
    snapshot's files instead read each shared manifest once per snapshot (400 commits of
    a partition table: 20-33 s an expiry, against well under a second)."""
    from riverbed.storage import open_store

    io = table.io
    manifests: dict[str, Any] = {}
    named: set[str] = set()
    for snapshot in table.snapshots():
        named.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            manifests.setdefault(manifest.manifest_path, manifest)
    named.update(manifests)
    for manifest in manifests.values():
        named.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io))
    root = table.location().rstrip("/")
    deleted = 0
    for folder, suffix in (("data", ".parquet"), ("metadata", ".avro")):
        store = open_store(f"{root}/{folder}")
        gone = [
            info.key
            for info in store.list()
            if info.key.endswith(suffix)
            and f"{root}/{folder}/{info.key}" not in named
            and info.modified < older_than
        ]
        store.delete_many(gone)
        deleted += len(gone)
    return deleted
