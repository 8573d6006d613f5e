"""A time-range job's output: staged files, fenced publication, carried state.

The output is a location — a local directory or a bucket (``s3://bucket/prefix``) —
laid out the same way on both::

    <output>/rows/chunk=20260101T050000Z/part.parquet        one file per chunk
    <output>/windows_1h/chunk=20260101T050000Z/part.parquet  tumbling aggregates
    <output>/_riverbed/staging/<token>/<dataset>.parquet     a chunk's files before publication
    <output>/_riverbed/carry/<token>/<name>.parquet          state carried after that chunk
    <output>/_riverbed/spill/<token>/part-*.parquet          a batch's rows, as Spark wrote them

A chunk's files are written under its token first. Only once the progress marker names
that token (the control plane's compare-and-swap, which only the elected driver can
make) is each file *moved* into place (:meth:`ObjectStore.move`: one rename on a disk; a
server-side copy and a delete on a bucket, where nothing can be renamed). A reader sees
a chunk's old file or its new one, never a part and never both
(``read_parquet('<output>/rows/*/*.parquet')``). A staged file is moved by whoever gets
there first: a driver that takes over finishes the moves of the last published chunk,
and a paused driver that wakes up later finds its staged files gone. A driver that lost
its term never moves anything: its staged files are named by no record and the next
driver forgets them.

A batch's rows reach the driver through a **spill**: Spark's executors write them as
Parquet under ``_riverbed/spill/<token>/`` (each task its own file, side by side, no
copy of the result in the driver's JVM) and the driver reads them back, cuts them into
chunks and stages one file per chunk. A spill is nobody's once read: the driver deletes
it, and the next driver forgets any a crash left.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from riverbed.locations import is_local, location
from riverbed.parquetbytes import parquet_bytes, read_parquet_bytes
from riverbed.storage import ObjectNotFoundError, shared_store
from riverbed.timerange.errors import RangeError
from riverbed.timerange.plan import chunk_label

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa

    from riverbed.storage import ObjectStore
    from riverbed.tables import PartitionTable

__all__ = ["Output", "TimeRangeOutput"]

META = "_riverbed/"
STAGING = f"{META}staging/"
CARRY = f"{META}carry/"
SPILL = f"{META}spill/"
SUCCESS = "_SUCCESS"  # what Spark writes last, once a job's files are all in place
PART = "part.parquet"


class TimeRangeOutput:
    def __init__(self, root: str | Path) -> None:
        self.location = str(location(root))
        self._store: ObjectStore | None = None

    def __repr__(self) -> str:
        return f"TimeRangeOutput({self.location!r})"

    @property
    def local(self) -> bool:
        """Whether the output is a directory of this machine (executors elsewhere cannot
        reach it)."""
        return is_local(self.location)

    @property
    def store(self) -> ObjectStore:
        """The objects of the output (made on first use: reading makes no directory)."""
        if self._store is None:
            self._store = shared_store(self.location)
        return self._store

    # -- the layout ----------------------------------------------------------------
    @staticmethod
    def staged_key(token: str, dataset: str) -> str:
        return f"{STAGING}{token}/{dataset}.parquet"

    @staticmethod
    def carry_key(token: str, name: str) -> str:
        return f"{CARRY}{token}/{name}.parquet"

    @staticmethod
    def final_key(dataset: str, start: int) -> str:
        return f"{dataset}/chunk={chunk_label(start)}/{PART}"

    # -- writing -------------------------------------------------------------------
    def stage(self, token: str, dataset: str, table: pa.Table) -> None:
        """Write a chunk's ``dataset`` under its token (not yet visible to readers)."""
        self.store.put(self.staged_key(token, dataset), parquet_bytes(table))

    def stage_carry(self, token: str, name: str, table: pa.Table) -> None:
        """Write the state chunk ``token`` carries to the next one."""
        self.store.put(self.carry_key(token, name), parquet_bytes(table))

    def carried(self, token: str, name: str) -> pa.Table | None:
        """The state chunk ``token`` carried, or None if it carried no ``name``."""
        try:
            data = self.store.get(self.carry_key(token, name))
        except ObjectNotFoundError:
            return None
        return read_parquet_bytes(data)

    def spill_location(self, token: str) -> str:
        """Where Spark writes batch ``token``'s rows: a directory, or ``s3a://…``."""
        from riverbed.spark import s3a

        return s3a.to_s3a(self.store.locate(f"{SPILL}{token}"))

    def read_spill(self, token: str) -> pa.Table | None:
        """The rows Spark wrote to ``spill_location(token)``, as one table (no columns
        when Spark wrote no file: no rows); None when
        the spill is not whole (Spark's ``_SUCCESS`` is missing, a file vanished): only
        another driver, which forgets every spill when it takes over, removes it."""
        import pyarrow as pa

        try:
            listed = [i.key for i in self.store.list(f"{SPILL}{token}/")]
            if f"{SPILL}{token}/{SUCCESS}" not in listed:
                return None
            keys = [  # Spark's part files, not a task attempt's under _temporary/
                k for k in listed if k.endswith(".parquet") and k.count("/") == SPILL.count("/") + 1
            ]
            tables = [self._read(k) for k in sorted(keys)]
        except (FileNotFoundError, ObjectNotFoundError):
            return None
        return pa.concat_tables(tables) if tables else pa.table({})  # no file: no rows

    def _read(self, key: str) -> pa.Table:
        """A Parquet object's table: read in place on a directory (a spill may be
        large), else from its bytes."""
        import pyarrow.parquet as pq

        local = self.store.local_file(key)
        return (
            pq.read_table(local) if local is not None else read_parquet_bytes(self.store.get(key))
        )

    def spilled(self, token: str) -> bool:
        """Whether anything of spill ``token`` is there (a write cut short leaves some)."""
        return bool(self.store.list(f"{SPILL}{token}/"))

    def drop_spill(self, token: str) -> None:
        """Delete batch ``token``'s spill (read, or never to be)."""
        self._drop(SPILL, token)

    def publish(
        self,
        token: str,
        start: int,
        tables: Mapping[str, PartitionTable] | None = None,
        version: int = 0,
    ) -> int:
        """Move chunk ``start``'s staged files into place; returns how many were moved.

        Idempotent and race-free: each staged file is moved at most once by whoever gets
        there first; the others find it gone. A dataset with a table in ``tables`` has
        its chunk's partition replaced first, at ``version`` (the revision of the chunk's
        record: :mod:`riverbed.tables`), so a file that was moved had its table commit
        made: a publisher killed in between leaves the file staged, and the next one
        finds the commit made and moves it.
        """
        moved = 0
        for info in self.store.list(f"{STAGING}{token}/"):
            name = info.key.rsplit("/", 1)[1]
            if not name.endswith(".parquet"):
                continue
            dataset = name[: -len(".parquet")]
            table = (tables or {}).get(dataset)
            try:
                if table is not None:
                    self._replace(table, dataset, start, self._read(info.key), version)
                self.store.move(info.key, self.final_key(dataset, start))
            except (FileNotFoundError, ObjectNotFoundError):  # moved by another publisher
                continue
            moved += 1
        return moved

    def _replace(
        self, table: PartitionTable, dataset: str, start: int, rows: pa.Table, version: int
    ) -> None:
        partition = chunk_label(start)
        if table.replace(partition, rows, version):
            return
        held = table.version(partition)
        if held is not None and held > version:
            # a staged file is the chunk's newest run (a newer one moves it first), so
            # the table was written under another control plane, or before a reset
            raise RangeError(
                f"table {table!r} holds chunk {partition} of dataset {dataset!r} at revision "
                f"{held}, newer than this control plane's record of it ({version}): it was "
                "written under another control plane. Point RIVERBED_CONTROL at that one, "
                "or start over with riverbed timerange reset SPEC --output (it empties the "
                "tables too)"
            )

    def discard(self, token: str) -> None:
        """Delete the staged files and carried state of a token that was never published."""
        for kind in (STAGING, CARRY):
            self._drop(kind, token)

    def forget(self, keep: set[str], pending: str | None) -> int:
        """Delete staged and carried files of tokens no chunk record names; returns how
        many tokens were forgotten."""
        removed = 0
        for kind in (STAGING, CARRY, SPILL):
            gone = [
                t
                for t in self.store.entries(kind, with_partial=True)  # a killed write's too
                if t != pending and not (kind == CARRY and t in keep)
            ]
            for token in gone:
                self._drop(kind, token)
                removed += 1
        return removed

    def _drop(self, kind: str, token: str) -> None:
        """Delete everything a token has under ``kind`` (staging, carry or spill: in a
        directory Spark's own files too, ``_SUCCESS`` and ``.crc``)."""
        self.store.delete_prefix(f"{kind}{token}/")

    def remove(self) -> None:
        """Delete the whole output (``riverbed timerange reset --output``)."""
        self.store.delete_prefix("")

    # -- reading -------------------------------------------------------------------
    def datasets(self) -> list[str]:
        return [n for n in self.store.entries("") if n != META.rstrip("/")]

    def read(self, dataset: str = "rows") -> pa.Table:
        """Every published chunk of ``dataset`` as one table (tests, status, the demo)."""
        import pyarrow as pa

        keys = [
            i.key
            for i in self.store.list(f"{dataset}/chunk=")
            if i.key.endswith(f"/{PART}") and i.key.count("/") == 2
        ]
        if not keys:
            return pa.table({})
        tables = [read_parquet_bytes(self.store.get(k)) for k in keys]
        return pa.concat_tables(tables, promote_options="default")


Output = TimeRangeOutput  # the name it had (riverbed.timerange.Output)
