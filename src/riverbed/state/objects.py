"""Durable state in an object store (a directory, ``s3://bucket/prefix``,
``memory://name``): the
:class:`~riverbed.state.durable.DurableStorage` operations on a
:class:`riverbed.storage.ObjectStore`, with **incremental snapshots**.

A changelog is one object per version. A snapshot is a manifest object
(``<partition>/snapshot/<version>-<tag>/MANIFEST.riverbed.json``) listing the snapshot's
files, each stored once per partition under
``<partition>/shared/<file name>.<crc32>.<size>`` — named by its content, as RocksDB's
own BackupEngine names shared files. RocksDB never changes an SST file once written,
so consecutive snapshots share almost all of them: a snapshot uploads only the files
the previous ones did not, and the manifest, written last (create-only: an existing
complete copy wins), makes it count. A restore downloads the files in parallel and
checks each one's size and CRC.

:meth:`ObjectStorage.sweep` deletes shared files no manifest refers to any more (the
snapshots :meth:`~riverbed.state.StateProvider.purge` deleted), once they are older
than the sweep's age — younger ones may belong to an upload whose manifest is not
written yet.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from riverbed.checksum import crc32
from riverbed.formats import CURRENT, check
from riverbed.state.durable import MANIFEST, DurableStorage, file_crc
from riverbed.state.errors import CorruptStateError, StateError, StateValueError
from riverbed.storage import ObjectNotFoundError, ObjectStore, StorageValueError

SHARED = "shared"
ENDS_GUESS = 256 << 10  # read_ends reads this much in its first request
THREADS = 8  # parallel uploads and downloads of a snapshot's files


@dataclass
class TransferStats:
    """What snapshots moved, for benchmarks and the console."""

    uploaded_files: int = 0
    uploaded_bytes: int = 0
    reused_files: int = 0
    reused_bytes: int = 0
    downloaded_bytes: int = 0


def _partition_of(name: str) -> str:
    """``ns/p`` of ``ns/p/snapshot/<version>-<tag>``."""
    parts = name.split("/")
    if len(parts) < 4 or parts[-2] != "snapshot":
        raise StateError(f"{name!r} is not a snapshot name (<ns>/<partition>/snapshot/<id>)")
    return "/".join(parts[:-2])


@contextlib.contextmanager
def _named(url: str) -> Iterator[None]:
    """A location that cannot take a write (a file where a directory goes) is the
    user's to fix: said as a state error naming the durable location."""
    try:
        yield
    except StorageValueError as exc:
        raise StateValueError(f"durable state location {url}: {exc}") from None


class ObjectStorage(DurableStorage):
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.url = store.url
        self.stats = TransferStats()

    # -- objects ------------------------------------------------------------------------

    def write(self, name: str, data: bytes) -> None:
        with _named(self.url):
            self.store.put(name, data)

    def write_once(self, name: str, data: bytes) -> bool:
        with _named(self.url):
            return self.store.write_once(name, data)

    def read(self, name: str) -> bytes:
        try:
            return self.store.get(name)
        except ObjectNotFoundError:
            raise StateError(f"{self.url}/{name} does not exist") from None

    def read_ends(self, name: str, head: int, tail: int) -> tuple[bytes, bytes]:
        """One request for an object up to ``ENDS_GUESS`` bytes (a batch's changelog
        usually is): its start, which tells its size; a second for the tail otherwise."""
        try:
            first, size = self.store.get_prefix(name, max(head, ENDS_GUESS))
        except ObjectNotFoundError:
            raise StateError(f"{self.url}/{name} does not exist") from None
        if size <= len(first):
            return first[:head], first[max(0, size - tail) :]
        return first[:head], self.store.get_range(name, max(0, size - tail), size)

    def complete_snapshots(self, prefix: str) -> builtins.list[str]:
        """One LIST for every snapshot under ``prefix`` and which have their manifest."""
        base = f"{prefix.strip('/')}/"
        names = set()
        for info in self.store.list(base):
            parts = info.key[len(base) :].split("/")
            if len(parts) == 2 and parts[1] == MANIFEST and not parts[0].startswith("."):
                names.add(parts[0])
        return sorted(names)

    def list(self, prefix: str) -> builtins.list[str]:
        return self.store.entries(f"{prefix.strip('/')}/" if prefix else "")

    def delete(self, name: str) -> None:
        self.store.delete_many([o.key for o in self.store.list(f"{name}/")])
        self.store.delete(name)

    # -- snapshots ----------------------------------------------------------------------

    def upload_dir(self, local: Path, name: str) -> None:
        shared = f"{_partition_of(name)}/{SHARED}"
        present = {o.key: o.size for o in self.store.list(f"{shared}/")}
        files: dict[str, int] = {}
        crcs: dict[str, int] = {}
        objects: dict[str, str] = {}
        todo: builtins.list[tuple[str, Path, int]] = []
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            size = path.stat().st_size
            with open(path, "rb") as fh:
                crc = file_crc(fh)
            key = f"{shared}/{path.name}.{crc:08x}.{size}"
            files[rel], crcs[rel], objects[rel] = size, crc, key
            if present.get(key) == size:
                self.stats.reused_files += 1
                self.stats.reused_bytes += size
            else:
                todo.append((key, path, size))
                present[key] = size  # two files of equal content: uploaded once
        with _named(self.url), ThreadPoolExecutor(THREADS) as pool:
            for _ in pool.map(lambda t: self.store.put_file(t[0], t[1]), todo):
                pass
        self.stats.uploaded_files += len(todo)
        self.stats.uploaded_bytes += sum(size for _, _, size in todo)
        manifest = {
            "format": CURRENT["state snapshot"],
            "files": files,
            "crc32": crcs,
            "objects": objects,
        }
        # create-only: a complete snapshot of this name that exists already wins
        self.store.put_if_absent(f"{name}/{MANIFEST}", json.dumps(manifest).encode())

    def _manifest(self, name: str) -> dict[str, Any]:
        problem = ""
        try:
            manifest: Any = json.loads(self.store.get(f"{name}/{MANIFEST}"))
        except (ObjectNotFoundError, ValueError) as exc:
            problem = str(exc)
        else:
            if isinstance(manifest, dict):
                check("state snapshot", manifest.get("format"), f"snapshot {self.url}/{name}")
            if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
                problem = "no file list"
            elif "objects" not in manifest:  # a full copy, from before shared files
                manifest["objects"] = {rel: f"{name}/{rel}" for rel in manifest["files"]}
            elif not isinstance(manifest.get("objects"), dict):
                problem = "no object list"
        if problem:
            raise CorruptStateError(f"snapshot {self.url}/{name} has no valid manifest ({problem})")
        result: dict[str, Any] = manifest
        return result

    @staticmethod
    def _problem(manifest: dict[str, Any], rel: str, size: int, crc: int) -> str | None:
        """What is wrong with a snapshot file of ``size`` and ``crc``, or None."""
        if size != manifest["files"][rel]:
            return f"{rel} is {size} bytes, expected {manifest['files'][rel]}"
        expected = manifest.get("crc32", {}).get(rel)  # the oldest snapshots: sizes only
        if expected is not None and crc != expected:
            return f"{rel} fails its checksum"
        return None

    def _fetch(self, manifest: dict[str, Any], rel: str, target: Path) -> str | None:
        """Download one file of a snapshot and check it; what is wrong, or None."""
        try:
            self.store.get_file(manifest["objects"][rel], target)
        except ObjectNotFoundError:
            return f"{rel} is missing ({manifest['objects'][rel]})"
        with open(target, "rb") as fh:
            return self._problem(manifest, rel, target.stat().st_size, file_crc(fh))

    def download_dir(self, name: str, local: Path) -> None:
        manifest = self._manifest(name)
        local.mkdir(parents=True)
        rels = sorted(manifest["files"])
        for rel in rels:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(THREADS) as pool:
            problems = builtins.list(pool.map(lambda r: self._fetch(manifest, r, local / r), rels))
        self.stats.downloaded_bytes += sum(manifest["files"].values())
        for problem in problems:
            if problem is not None:
                raise CorruptStateError(f"snapshot {self.url}/{name}: {problem}")

    def verify_dir(self, name: str) -> builtins.list[str]:
        try:
            manifest = self._manifest(name)
        except CorruptStateError as exc:
            return [str(exc)]
        found = []
        for rel in sorted(manifest["files"]):
            try:
                data = self.store.get(manifest["objects"][rel])
            except ObjectNotFoundError:
                problem: str | None = f"{rel} is missing"
            else:
                problem = self._problem(manifest, rel, len(data), crc32(data))
            if problem is not None:
                found.append(f"snapshot {self.url}/{name}: {problem}")
        return found

    def quarantine(self, name: str) -> str:
        """Objects cannot be renamed: the manifest is copied under a hidden name and the
        original deleted, so listings no longer see the snapshot; its files stay (a
        quarantined manifest still refers to them, and :meth:`sweep` keeps them)."""
        parent, _, leaf = name.rpartition("/")
        aside = f"{parent}/.{leaf}.corrupt-{int(time.time())}"
        try:
            data = self.store.get(f"{name}/{MANIFEST}")
        except ObjectNotFoundError:
            data = b"{}"
        self.store.put(f"{aside}/{MANIFEST}", data)
        self.store.delete(f"{name}/{MANIFEST}")
        return aside

    def sweep(self, prefix: str, older_than: float) -> int:
        """Delete shared files under ``prefix`` that no manifest (quarantined ones
        included) refers to and that are older than ``older_than`` seconds."""
        partial = self.store.sweep_partial(prefix.strip("/"), older_than)
        shared = f"{prefix.strip('/')}/{SHARED}/"
        files = self.store.list(shared)
        if not files:
            return partial
        referenced: set[str] = set()
        for info in self.store.list(f"{prefix.strip('/')}/snapshot/"):
            if info.key.endswith(f"/{MANIFEST}"):
                try:
                    manifest = json.loads(self.store.get(info.key))
                except (ObjectNotFoundError, ValueError):
                    continue  # deleted meanwhile, or unreadable: its files age out below
                # a newer riverbed's snapshot may name its files otherwise: sweep nothing
                check("state snapshot", manifest.get("format"), f"snapshot {info.key}")
                referenced.update(manifest.get("objects", {}).values())
        cutoff = time.time() - older_than
        garbage = [o.key for o in files if o.key not in referenced and o.modified < cutoff]
        self.store.delete_many(garbage)
        return partial + len(garbage)


__all__ = ["ObjectStorage", "TransferStats"]
