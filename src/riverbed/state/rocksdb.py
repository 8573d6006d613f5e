"""The RocksDB engine (``rocksdict``): one DB directory per (namespace, partition).

User keys live in the default column family, the version marker in a ``riverbed``
column family; one ``WriteBatch`` spans both, so data and version commit together
(RocksDB's WAL makes the batch all-or-nothing across a crash).

**Memory.** Left to its defaults, every open database has its own block cache and up to
two 64 MiB memtables, so a process's memory grows with the partitions it holds open.
With ``memory_mb`` (``StateConfig.memory_mb``; ``[state] memory_mb`` in riverbed.toml,
``RIVERBED_STATE_MEMORY_MB``) every database a process opens shares **one budget**, as
RocksDB documents it: one LRU block cache of that size (data, index and filter blocks),
and a write buffer manager that charges every memtable to the same cache and flushes
when memtables pass half of it.

**Holding a partition.** RocksDB's own ``LOCK`` file is inside the database's directory,
so it goes with the directory when a restore replaces it: between closing the old
database and opening the new one, another process could open the partition (a task of
a driver that lost its lead), and one that has it open while its directory is replaced
deletes files by name in the new one. So a partition is held by an exclusive ``flock``
on a file beside its directory (``<namespace>/.<partition>.lock``), taken before the
database opens and let go after it closes — and kept across
:meth:`RocksEngine.replace`, which swaps the directory under it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
)

from riverbed.state.base import Engine, LocalDB, Op
from riverbed.state.errors import PartitionBusyError, StateError

_META_CF = "riverbed"
_VERSION = b"version"


MiB = 2**20


class Budget:
    """One process's memory for every state database it opens: a shared block cache and
    a write buffer manager charging memtables to it."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.cache = Cache(memory_mb * MiB)
        self.memtables = WriteBufferManager.new_write_buffer_manager_with_cache(
            memory_mb * MiB // 2, False, self.cache
        )

    def apply(self, options: Options) -> None:
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(self.memtables)
        # a memtable well under the budget, so one database cannot hold all of it
        options.set_write_buffer_size(max(MiB, min(64 * MiB, self.memory_mb * MiB // 8)))


_BUDGETS: dict[int, Budget] = {}  # per process: every engine with the same cap shares it


def budget(memory_mb: int) -> Budget:
    """This process's shared budget of ``memory_mb`` MiB (made on first use)."""
    if memory_mb not in _BUDGETS:
        _BUDGETS[memory_mb] = Budget(memory_mb)
    return _BUDGETS[memory_mb]


KEPT_INFO_LOGS = 3  # RocksDB's old info logs (LOG.old.*) a partition's directory keeps


def _options(memory: Budget | None = None) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # zstd: the files a snapshot uploads are ~16% smaller than with Snappy (RocksDB's
    # default) at about its write time (benchmarks/compression.py). RocksDB's usual LZ4 +
    # zstd-for-the-bottommost-level measured as plain LZ4 here: the bottommost setting
    # did not take through rocksdict
    options.set_compression_type(DBCompressionType.zstd())
    # RocksDB starts an info log (LOG) at each open and keeps 1,000 old ones by default:
    # ~56 KB each, a partition opened every batch grew by ~45 MB in 1,000 batches while
    # its data stayed flat (a join's state, 2026-12-03); one held open grows its LOG by
    # its statistics dumps (~1.4 MB in 16 minutes): rolled at 1 MiB
    options.set_keep_log_file_num(KEPT_INFO_LOGS)
    options.set_max_log_file_size(MiB)
    # An open starts up to 16 threads (per column family) to open the table files; a
    # partition is opened every batch a Spark task merges it, with ~10 files: one
    # thread per core opens and closes it in 4.6 ms instead of 5.9 (median of 40 each)
    options.set_max_file_opening_threads(max(1, min(16, os.cpu_count() or 1)))
    if memory is not None:
        memory.apply(options)
    return options


def _busy(path: Path, elsewhere: bool = True) -> PartitionBusyError:
    if not elsewhere:
        return PartitionBusyError(
            f"state database {path} is already open in this process (one holder at a "
            "time): commit or abort the store that holds it first"
        )
    return PartitionBusyError(
        f"state database {path} is open in another process (one holder at a time); wait "
        "for that task to finish, or give each worker its own local directory",
        elsewhere=True,
    )


# the partitions this process holds: a second open of one is this process's own doing
_HELD_HERE: set[Path] = set()
_HELD_LOCK = threading.Lock()


class _PartitionLock:
    """An exclusive ``flock`` on the file beside a partition's directory: one holder per
    partition on this machine, this process's other opens included (each ``open`` of
    the file is a lock of its own; :data:`_HELD_HERE` tells which holder it is)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path.parent / f".{path.name}.lock"
        with _HELD_LOCK:
            if self.path in _HELD_HERE:
                raise _busy(path, elsewhere=False)
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _busy(path) from None
            _HELD_HERE.add(self.path)
        self._fd: int | None = fd

    def release(self) -> None:
        with _HELD_LOCK:
            if self._fd is not None:  # once: the number may be another file's afterwards
                os.close(self._fd)
                self._fd = None
                _HELD_HERE.discard(self.path)


class RocksLocalDB(LocalDB):
    def __init__(self, db: Rdict, lock: _PartitionLock) -> None:
        self._db = db
        self._meta = db.get_column_family(_META_CF)
        self._lock: _PartitionLock | None = lock
        self._closed = False

    @property
    def marker(self) -> tuple[int, int]:
        raw = self._meta.get(_VERSION)
        if raw is None:
            return (0, 0)
        version, _, tag = raw.partition(b":")
        return (int(version), int(tag or b"0"))

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        values = self._db.get(list(keys))
        assert values is not None
        return list(values)

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        # rocksdict's own iterator, bounded by RocksDB: ~2x a Python loop of seek, valid,
        # key, value and next calls (25,000 windows a scan when a batch closes them)
        bounded = ReadOptions()
        if end is not None:
            bounded.set_iterate_upper_bound(end)
        return self._db.items(from_key=start, read_opt=bounded)  # type: ignore[return-value]

    def last(self, start: bytes, end: bytes) -> bytes | None:
        it = self._db.iter()
        it.seek_for_prev(end)  # the greatest key <= end
        if it.valid() and it.key() >= end:
            it.prev()
        if not it.valid():
            return None
        key: bytes = it.key()
        return key if key >= start else None

    def apply(self, ops: Sequence[Op], version: int, tag: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for kind, a, b in ops:
            if kind == "put":
                batch.put(a, b)
            elif kind == "del":
                batch.delete(a)
            else:
                batch.delete_range(a, b)
        marker = f"{version}:{tag}".encode()
        batch.put(_VERSION, marker, self._db.get_column_family_handle(_META_CF))
        self._db.write(batch)

    def checkpoint(self, dest: Path) -> None:
        Checkpoint(self._db).create_checkpoint(str(dest))

    def close(self) -> None:
        lock = self._close_database()
        if lock is not None:
            lock.release()

    def _close_database(self) -> _PartitionLock | None:
        """Close the database; the partition's lock, still held, goes to the caller."""
        if self._closed:
            return None
        self._closed = True
        # The column-family handle holds the DB open too: close it first, or the LOCK
        # file stays held and the next open in this process fails.
        self._meta.close()
        self._db.close()
        lock, self._lock = self._lock, None
        return lock


class RocksEngine(Engine):
    name = "rocksdb"

    def __init__(self, memory_mb: int | None = None) -> None:
        self.memory = budget(memory_mb) if memory_mb is not None else None

    def open(self, path: Path) -> LocalDB:
        lock = _PartitionLock(path)
        try:
            return self._open(path, lock)
        except BaseException:
            lock.release()
            raise

    def _open(self, path: Path, lock: _PartitionLock) -> LocalDB:
        try:
            # Both column families named, never read back from the DB's OPTIONS file:
            # RocksDB writes that file *after* it records a new column family, so a
            # process killed in between leaves a DB whose latest OPTIONS file lacks
            # ``riverbed`` — and rocksdict, left to load the families itself, then
            # opens without it and RocksDB refuses ("Column families not opened").
            # Named, a new DB gets both in one open and an old one opens whatever its
            # OPTIONS files say.
            db = Rdict(
                str(path),
                _options(self.memory),
                column_families={_META_CF: _options(self.memory)},
            )
        except Exception as exc:  # rocksdict raises a bare Exception for I/O errors
            if "LOCK" in str(exc):
                raise _busy(path) from exc  # an opener that took no flock (not riverbed)
            raise StateError(f"cannot open state database {path}: {exc}") from exc
        return RocksLocalDB(db, lock)

    def replace(self, db: LocalDB, path: Path, checkpoint: Path | None) -> LocalDB:
        assert isinstance(db, RocksLocalDB)
        lock = db._close_database()
        if lock is None:
            raise StateError(f"state database {path} was closed before its restore")
        try:
            if path.exists():
                shutil.rmtree(path)
            if checkpoint is not None:
                shutil.move(str(checkpoint), str(path))
            return self._open(path, lock)
        except BaseException:
            lock.release()
            raise
