"""The state provider: load any version of any partition, anywhere.

Durable layout under the checkpoint location::

    <namespace>/<partition>/changelog/<version:020d>.rbcl   one per committed version
    <namespace>/<partition>/snapshot/<version:020d>/        RocksDB checkpoint + manifest
    <namespace>/<partition>/meta.json                       {"purged_through": S}

Local layout: ``<local_dir>/<namespace>/<partition>/`` is the engine's database;
``<local_dir>/.private/<pid>-<id>/<namespace>/<partition>/`` a private copy of one
that another process held too long (:data:`PRIVATE`); ``.restore/`` snapshots being
downloaded, ``.snapshots/`` checkpoints being uploaded.

Load protocol (:meth:`StateProvider.load`):

1. open the local database (waiting while another process holds it; after
   ``private_after``, an empty private copy instead, deleted when the store ends);
2. list the durable versions; the target is the newest version <= the requested one;
3. walk the target's changelog base pointers back until reaching the local database
   (same version *and* same tag, i.e. the same history), a snapshot of the same
   history, or the empty state; start from that and apply the changelogs forward.

Every version carries a *tag*, the checksum of its changelog, kept in the local
database's version marker and in the snapshot's name. The same changelog committed
again (a retried task, a zombie resumed) writes nothing (``write_once``); re-committing
an old version never deletes newer versions (a late zombie retry destroys no work), and
versions rebuilt along base pointers rebuild one on an older history as committed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from riverbed.state import openpool, uploads
from riverbed.state.base import Engine, LocalDB, Op
from riverbed.state.changelog import HEAD_SIZE, TAIL_SIZE, Changelog, Header, peek
from riverbed.state.durable import DurableStorage
from riverbed.state.errors import (
    CorruptStateError,
    PartitionBusyError,
    StateError,
    StateValueError,
    VersionNotFoundError,
)
from riverbed.state.location import open_storage
from riverbed.state.store import StateStore

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SUFFIX = ".rbcl"
STAGING = ".snapshots"  # under local_dir: checkpoints of snapshots being uploaded
PRIVATE = ".private"  # under local_dir: private copies of partitions another process holds
RESTORE = ".restore"  # under local_dir: snapshots being downloaded


@dataclass(frozen=True)
class StateConfig:
    """Where state lives and how often it is compacted into snapshots."""

    local_dir: Path
    durable: str | Path
    engine: str = "rocksdb"
    snapshot_every: int = 10  # versions between snapshots
    retain_versions: int = 100  # versions kept loadable by maintain()
    lock_timeout: float = 30.0  # seconds to wait for a partition held by another process
    # ... or, after this many seconds of it, load into a private copy rebuilt from the
    # durable tier (a paused process on this machine can hold a partition for good);
    # None: wait lock_timeout, then fail
    private_after: float | None = 2.0
    # RocksDB's memory in each process (block cache and memtables of every database it
    # opens), MiB; None: RocksDB's defaults for each database (riverbed.state.rocksdb)
    memory_mb: int | None = None

    def __post_init__(self) -> None:
        mb = self.memory_mb
        if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb < 8):
            raise StateValueError(
                f"state memory_mb must be a whole number of MiB, at least 8, not {mb!r} "
                "(or leave it unset for RocksDB's own defaults per database)"
            )


def local_root(config: StateConfig, namespace: str) -> Path:
    """Where a namespace's local partitions are (``<local_dir>/<namespace>/<p>``)."""
    return Path(config.local_dir) / namespace


@dataclass(frozen=True)
class StateDamage:
    kind: str  # "changelog" | "snapshot"
    name: str
    problem: str
    moved_to: str | None = None


@dataclass(frozen=True)
class PartitionIndex:
    changelogs: list[int]
    snapshots: dict[int, int]  # version -> tag of the changelog it was taken at
    purged_through: int

    @property
    def versions(self) -> list[int]:
        return sorted(set(self.changelogs) | set(self.snapshots))

    @property
    def latest(self) -> int:
        return max(self.versions, default=0)


def _engine(name: str, memory_mb: int | None = None) -> Engine:
    if name == "rocksdb":
        from riverbed.state.rocksdb import RocksEngine

        return RocksEngine(memory_mb)
    if name == "memory":
        from riverbed.state.memory import MemoryEngine

        return MemoryEngine()
    raise StateError(f"unknown state engine {name!r}; use 'rocksdb' or 'memory'")


def _check_name(namespace: str) -> None:
    if not _NAME.match(namespace):
        raise StateValueError(
            f"namespace {namespace!r} must be 1-128 letters, digits, '_', '.', '-' "
            "and start with a letter or digit"
        )


# the newest snapshot version of each (durable location, namespace, partition) this
# process has seen: commits list snapshots only when this says one may be due
_SNAPSHOTS_SEEN: dict[tuple[str, str, int], int] = {}


def _drop_private(path: Path, db: LocalDB) -> None:
    """The end of a load into a private copy: close it and delete it (the next load
    takes the shared copy again, if its holder let go)."""
    db.close()
    shutil.rmtree(path.parent.parent, ignore_errors=True)  # <PRIVATE>/<pid-id>/<ns>/<p>


class StateProvider:
    """Loads versioned partition state; see the module docstring for the protocols."""

    def __init__(self, config: StateConfig) -> None:
        self.config = config
        self.engine = _engine(config.engine, config.memory_mb)
        self.durable: DurableStorage = open_storage(config.durable)
        self.local_dir = Path(config.local_dir)
        if config.snapshot_every < 1 or config.retain_versions < 1:
            raise StateValueError("snapshot_every and retain_versions must be at least 1")

    # -- names ---------------------------------------------------------------------------
    @staticmethod
    def _base(namespace: str, partition: int) -> str:
        _check_name(namespace)
        if partition < 0:
            raise StateValueError(f"partition must be >= 0, got {partition}")
        return f"{namespace}/{partition}"

    def _changelog_name(self, namespace: str, partition: int, version: int) -> str:
        return f"{self._base(namespace, partition)}/changelog/{version:020d}{_SUFFIX}"

    def _snapshot_name(self, namespace: str, partition: int, version: int, tag: int) -> str:
        return f"{self._base(namespace, partition)}/snapshot/{version:020d}-{tag:08x}"

    def _local(self, namespace: str, partition: int) -> Path:
        return local_root(self.config, namespace) / str(partition)

    # -- listing -------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        return [n for n in self.durable.list("") if _NAME.match(n)]

    def partitions(self, namespace: str) -> list[int]:
        _check_name(namespace)
        return sorted(int(p) for p in self.durable.list(namespace) if p.isdigit())

    def index(self, namespace: str, partition: int, purged: bool = True) -> PartitionIndex:
        """What the durable tier holds of a partition; ``purged=False`` leaves
        ``purged_through`` unread (0) — a request saved where only the newest version
        matters, as it always survives a purge."""
        base = self._base(namespace, partition)
        changelogs = sorted(
            int(n[: -len(_SUFFIX)])
            for n in self.durable.list(f"{base}/changelog")
            if n.endswith(_SUFFIX)
        )
        snapshots = self._snapshots(base)
        return PartitionIndex(changelogs, snapshots, self._purged(base) if purged else 0)

    def _purged(self, base: str) -> int:
        with contextlib.suppress(StateError):
            return int(json.loads(self.durable.read(f"{base}/meta.json"))["purged_through"])
        return 0

    def _snapshots(self, base: str) -> dict[int, int]:
        """Complete snapshots of a partition: version -> tag."""
        snapshots: dict[int, int] = {}
        for n in self.durable.complete_snapshots(f"{base}/snapshot"):
            version, _, tag = n.partition("-")
            if version.isdigit() and tag:
                snapshots[int(version)] = int(tag, 16)
        return snapshots

    def versions(self, namespace: str, partition: int) -> list[int]:
        """Every loadable version of a partition."""
        index = self.index(namespace, partition)
        return [v for v in index.versions if v >= index.purged_through]

    def verify(self, namespace: str, partition: int, quarantine: bool = False) -> list[StateDamage]:
        """Check every changelog (its checksum) and every snapshot (each file's size and
        checksum) of a partition. ``quarantine`` moves damaged snapshots aside, so loads
        rebuild from an older snapshot and the changelogs; changelogs are never moved."""
        base = self._base(namespace, partition)
        found: list[StateDamage] = []
        for n in self.durable.list(f"{base}/changelog"):
            name = f"{base}/changelog/{n}"
            try:
                Changelog.decode(self.durable.read(name), name)
            except CorruptStateError as exc:
                found.append(StateDamage("changelog", name, str(exc)))
        for n in self.durable.list(f"{base}/snapshot"):
            name = f"{base}/snapshot/{n}"
            problems = self.durable.verify_dir(name)
            if problems:
                aside = self.durable.quarantine(name) if quarantine else None
                found.append(StateDamage("snapshot", name, "; ".join(problems), aside))
        return found

    # -- load ----------------------------------------------------------------------------
    def load(self, namespace: str, partition: int, version: int | None = None) -> StateStore:
        """The partition's state as of ``version`` (newest committed version <= it; default:
        the latest), ready for reads and staged writes."""
        path = self._local(namespace, partition)
        self._base(namespace, partition)  # validate names before touching disk
        db = openpool.take(path)
        release: Callable[[LocalDB], None] = functools.partial(openpool.give_back, path)
        private = None
        if db is None:
            db, private = self._open(path, namespace, partition)
            if private is not None:
                path, release = private, functools.partial(_drop_private, private)
        try:
            exact = version is not None and 0 < version == db.version
            if exact and self._local_is_durable(namespace, partition, db, version):  # type: ignore[arg-type]
                return StateStore(self._commit, namespace, partition, db, release)
            # Read the index only once we hold the partition: a commit by the previous
            # holder must be visible, or "latest" could be stale.
            index = self.index(namespace, partition, purged=False)
            self._saw_snapshot(namespace, partition, max(index.snapshots, default=0))
            target = self._resolve(namespace, partition, index, version)
            db = self._bring_to(namespace, partition, path, db, index, target)
        except BaseException:
            if private is not None:
                _drop_private(private, db)
            else:
                db.close()
            raise
        return StateStore(self._commit, namespace, partition, db, release)

    def _local_is_durable(self, namespace: str, partition: int, db: LocalDB, version: int) -> bool:
        """The fast path of a load of exactly the version the local copy holds (a
        stream's every batch): one read of that version's changelog header, no listing.
        The local copy is it when the durable changelog has the tag the copy was built
        from; anything else (no such changelog, another tag) takes the full path."""
        try:
            header = self._header(namespace, partition, version)
        except StateError:  # missing (a snapshot only) or damaged: the full path decides
            return False
        return header.tag == db.marker[1]

    def _saw_snapshot(self, namespace: str, partition: int, version: int) -> None:
        key = (self.durable.url, namespace, partition)
        _SNAPSHOTS_SEEN[key] = max(version, _SNAPSHOTS_SEEN.get(key, 0))

    def _resolve(
        self, namespace: str, partition: int, index: PartitionIndex, version: int | None
    ) -> int:
        if version is not None and version < 0:
            raise StateValueError(f"version must be >= 0, got {version}")
        candidates = [v for v in index.versions if version is None or v <= version]
        target = max(candidates, default=0)
        if target < index.latest and not index.purged_through:  # an older one: purged?
            index = replace(index, purged_through=self._purged(self._base(namespace, partition)))
        if index.purged_through and target < index.purged_through:
            raise VersionNotFoundError(
                f"version {version} of {namespace}/{partition} was purged (oldest kept: "
                f"{index.purged_through}); raise retain_versions to keep more history"
            )
        return target

    def _open(self, path: Path, namespace: str, partition: int) -> tuple[LocalDB, Path | None]:
        """The partition's local database at ``path`` — or, when another process on this
        machine has held it for ``private_after`` seconds, an empty private copy (and its
        path), which the load rebuilds from the durable tier like a new machine's."""
        began = time.monotonic()
        delay = 0.01
        while True:
            try:
                return self.engine.open(path), None
            except PartitionBusyError as exc:
                waited = time.monotonic() - began
                after = self.config.private_after
                if exc.elsewhere and after is not None and waited >= after:
                    return self._open_private(namespace, partition, waited)
                if waited >= self.config.lock_timeout:
                    raise
            time.sleep(delay)  # another process holds the RocksDB lock: nothing to wait on
            delay = min(delay * 2, 0.2)

    def _open_private(self, namespace: str, partition: int, waited: float) -> tuple[LocalDB, Path]:
        root = self.local_dir / PRIVATE / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path = root / namespace / str(partition)
        log.warning(
            "state %s/%s: another process on this machine has held it for %.1f s (a paused "
            "or stuck driver or task?); this load works on a private copy rebuilt from the "
            "durable tier (%s)",
            namespace,
            partition,
            waited,
            root,
        )
        try:
            return self.engine.open(path), path
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _changelog(self, namespace: str, partition: int, version: int) -> Changelog:
        name = self._changelog_name(namespace, partition, version)
        try:
            return Changelog.decode(self.durable.read(name), name)
        except CorruptStateError as exc:
            raise self._damaged(exc, namespace, partition, version) from None

    def _damaged(
        self, exc: CorruptStateError, namespace: str, partition: int, version: int
    ) -> CorruptStateError:
        return CorruptStateError(
            f"{self.durable.url}/{exc} — version {version} of {namespace}/{partition} and "
            "every version built on it cannot be rebuilt from this history. See what else "
            f"is damaged: `riverbed state verify {namespace}`; then restore the file from "
            "a backup, or rebuild the state by replaying its input (docs/stream.md, "
            "'Failure model')"
        )

    def _header(self, namespace: str, partition: int, version: int) -> Header:
        name = self._changelog_name(namespace, partition, version)
        head, tail = self.durable.read_ends(name, HEAD_SIZE, TAIL_SIZE)
        try:
            return peek(head, tail, name)
        except CorruptStateError as exc:
            raise self._damaged(exc, namespace, partition, version) from None

    def _plan(
        self,
        namespace: str,
        partition: int,
        index: PartitionIndex,
        target: int,
        local: tuple[int, int],
    ) -> tuple[str, int, list[Header]]:
        """How to build ``target``: ("local" | "snapshot" | "empty", start version, the
        changelogs to apply in order). Walks base pointers back from the target until it
        meets the local database, a snapshot of the same history, or the empty state."""
        chain: list[Header] = []
        changelogs = set(index.changelogs)
        current, expected = target, None  # expected: the tag the next-newer version was built on
        while current:
            changelog = (
                self._header(namespace, partition, current) if current in changelogs else None
            )
            if changelog is not None and expected is not None and changelog.tag != expected:
                raise CorruptStateError(
                    f"version {chain[-1].version} of {namespace}/{partition} was built on a "
                    f"version {current} that was later re-committed with other contents, so it "
                    "cannot be rebuilt; batches must be deterministic (re-run version "
                    f"{chain[-1].version} to repair it)"
                )
            tag = changelog.tag if changelog is not None else expected
            if tag is not None and local == (current, tag):
                return "local", current, chain[::-1]
            snap = index.snapshots.get(current)
            if snap is not None and (tag is None or snap == tag):
                return "snapshot", current, chain[::-1]
            if changelog is None:
                raise VersionNotFoundError(
                    f"version {current} of {namespace}/{partition} is needed to rebuild version "
                    f"{target} but was purged; load a newer version"
                )
            chain.append(changelog)
            current, expected = changelog.base, changelog.base_tag
        return "empty", 0, chain[::-1]

    def _download(
        self, namespace: str, partition: int, index: PartitionIndex, version: int, tmp: Path
    ) -> None:
        """Snapshot ``version`` of a partition into the local directory ``tmp``."""
        name = self._snapshot_name(namespace, partition, version, index.snapshots[version])
        try:
            self.durable.download_dir(name, tmp)
        except CorruptStateError as exc:
            raise CorruptStateError(
                f"{exc} — set it aside with `riverbed state verify {namespace} "
                "--quarantine` and the next load rebuilds from an older snapshot "
                "and the changelogs (docs/stream.md, 'Failure model')"
            ) from None

    def _bring_to(
        self,
        namespace: str,
        partition: int,
        path: Path,
        db: LocalDB,
        index: PartitionIndex,
        target: int,
    ) -> LocalDB:
        if target == 0 and db.version == 0:
            return db
        kind, start, chain = self._plan(namespace, partition, index, target, db.marker)
        if kind != "local":
            # the partition stays held from the download to the reopened database: no
            # other process (a task of a driver that lost its lead) opens it meanwhile
            tmp = self.local_dir / RESTORE / uuid.uuid4().hex
            try:
                if kind == "snapshot":
                    self._download(namespace, partition, index, start, tmp)
                db = self.engine.replace(db, path, tmp if kind == "snapshot" else None)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        try:
            if db.version != start:
                raise CorruptStateError(
                    f"{kind} state of {namespace}/{partition} holds version {db.version}, "
                    f"expected {start}"
                )
            for header in chain:
                changelog = self._changelog(namespace, partition, header.version)
                if changelog.tag != header.tag:
                    raise CorruptStateError(
                        f"changelog {header.version} of {namespace}/{partition} changed while "
                        "it was being replayed; retry the load"
                    )
                db.apply(changelog.ops, changelog.version, changelog.tag)
        except BaseException:
            if kind != "local":
                db.close()
            raise
        if kind != "local" or chain:
            log.info(
                "built %s/%s version %d from %s %d + %d changelog(s)",
                namespace,
                partition,
                target,
                kind,
                start,
                len(chain),
            )
        return db

    # -- commit (called by StateStore) --------------------------------------------------
    def _commit(
        self,
        namespace: str,
        partition: int,
        db: LocalDB,
        base: tuple[int, int],
        new: int,
        ops: Sequence[Op],
    ) -> None:
        changelog = Changelog(new, base[0], base[1], list(ops))
        self.durable.write_once(self._changelog_name(namespace, partition, new), changelog.encode())
        db.apply(ops, new, changelog.tag)
        # Is a snapshot due? The newest one this process saw says when one may be; only
        # then are the snapshots listed (a request, in a bucket) — another process may
        # have taken one meanwhile — and the listing decides.
        key = (self.durable.url, namespace, partition)
        if uploads.busy(key):  # its last snapshot is still on its way
            return
        last = _SNAPSHOTS_SEEN.get(key)
        if last is None or new - last >= self.config.snapshot_every:
            last = max(self._snapshots(self._base(namespace, partition)), default=0)
            self._saw_snapshot(namespace, partition, last)
        if new - last >= self.config.snapshot_every:
            self._snapshot(namespace, partition, db, background=uploads.active())

    def _snapshot(
        self, namespace: str, partition: int, db: LocalDB, background: bool = False
    ) -> None:
        """A checkpoint of ``db`` now, uploaded now or (``background``) by
        :mod:`riverbed.state.uploads`."""
        version, tag = db.marker
        tmp = self.local_dir / STAGING / uuid.uuid4().hex
        tmp.parent.mkdir(parents=True, exist_ok=True)
        name = self._snapshot_name(namespace, partition, version, tag)

        def upload() -> None:
            self.durable.upload_dir(tmp, name)
            self._saw_snapshot(namespace, partition, version)

        def done() -> None:
            shutil.rmtree(tmp, ignore_errors=True)

        try:
            db.checkpoint(tmp)
        except BaseException:
            done()
            raise
        key = (self.durable.url, namespace, partition)
        if background and uploads.submit(key, upload, done):
            # the next is due snapshot_every versions on, even if this upload fails
            self._saw_snapshot(namespace, partition, version)
            return
        try:
            upload()
        finally:
            done()

    # -- maintenance --------------------------------------------------------------------
    def maintain(self, namespace: str, partition: int, sweep_after: float = 3600.0) -> int:
        """Snapshot if due, purge what no retained version needs, and sweep leftovers of
        interrupted uploads older than ``sweep_after`` seconds. Returns the version
        everything before which was purged (0: nothing)."""
        index = self.index(namespace, partition)
        latest = index.latest
        if latest and latest - max(index.snapshots, default=0) >= self.config.snapshot_every:
            store = self.load(namespace, partition, latest)
            try:
                self._snapshot(namespace, partition, store._live())
            finally:
                store.abort()
        return self.purge(namespace, partition, sweep_after)

    def _sweep_staging(self, sweep_after: float) -> None:
        """Delete this machine's snapshot checkpoints, downloads and private copies older
        than ``sweep_after`` seconds: a process killed while it uploaded a snapshot leaves
        its checkpoint behind (hard links that would keep files compaction has replaced
        on disk for good), one killed in a restore or a load of a private copy leaves
        that. A live upload, download or load is younger."""
        cutoff = time.time() - sweep_after
        for folder in (STAGING, RESTORE, PRIVATE):
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.local_dir / folder):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            shutil.rmtree(entry.path, ignore_errors=True)

    def sweep(self, namespace: str, partition: int, older_than: float = 3600.0) -> None:
        """Delete leftovers of interrupted uploads older than ``older_than`` seconds (here
        and in this machine's :data:`STAGING`), and snapshot files no manifest names.
        Never while a snapshot of the partition is being written: one may reuse a file
        no manifest names yet (the stream engine sweeps between batches)."""
        self.durable.sweep(self._base(namespace, partition), older_than)
        self._sweep_staging(older_than)

    def drop(self, namespace: str) -> None:
        """Delete a whole namespace — every partition's changelogs, snapshots and shared
        files, and this machine's cache of it. Nothing may have it open (a savepoint's
        copy, an abandoned generation)."""
        _check_name(namespace)
        self.durable.delete(namespace)
        shutil.rmtree(self.local_dir / namespace, ignore_errors=True)

    def purge(self, namespace: str, partition: int, sweep_after: float | None = 3600.0) -> int:
        """The durable half of :meth:`maintain`: delete the snapshots and changelogs no
        retained version needs, and (unless ``sweep_after`` is None) :meth:`sweep`.
        Never opens the partition, so it is safe from any process while a writer commits
        (the stream engine runs it on the driver). Returns the version everything before
        which was purged (0: nothing)."""
        if sweep_after is not None:
            self.sweep(namespace, partition, sweep_after)
        index = self.index(namespace, partition)
        latest = index.latest
        keep_from = latest - self.config.retain_versions + 1
        base = max((s for s in index.snapshots if s <= keep_from), default=0)
        if base <= index.purged_through:
            return index.purged_through
        prefix = self._base(namespace, partition)
        # Record the purge first: a crash half-way leaves extra files, never a lie.
        self.durable.write(f"{prefix}/meta.json", json.dumps({"purged_through": base}).encode())
        for s, tag in index.snapshots.items():
            if s < base:
                self.durable.delete(self._snapshot_name(namespace, partition, s, tag))
        for v in index.changelogs:
            if v <= base:
                self.durable.delete(self._changelog_name(namespace, partition, v))
        return base
