"""Durable storage for changelogs and snapshots.

:class:`DurableStorage` is the small set of operations the state layer needs from a
place that outlives machines: atomic whole-object writes, reads, listings, deletes,
and directory upload/download where the upload becomes visible all at once. The
file implementation maps them to a directory tree (a local disk, NFS, a mounted
bucket); :mod:`riverbed.state.objects` implements them on an object store (S3), where
objects are written whole and a snapshot counts only once its manifest object exists.
"""

from __future__ import annotations

import builtins
import fnmatch
import json
import os
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from riverbed.checksum import crc32
from riverbed.files import fsync_dir
from riverbed.state.errors import CorruptStateError, StateError, StateValueError

MANIFEST = "MANIFEST.riverbed.json"


class DurableStorage(ABC):
    url: str

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Write object ``name`` whole: readers see the old content or the new, never a part."""

    @abstractmethod
    def read(self, name: str) -> bytes: ...

    @abstractmethod
    def read_ends(self, name: str, head: int, tail: int) -> tuple[bytes, bytes]:
        """The first ``head`` and last ``tail`` bytes of an object (a ranged read)."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names of the entries directly under ``prefix`` (a "directory")."""

    def complete_snapshots(self, prefix: str) -> builtins.list[str]:
        """The names under ``prefix`` that are complete uploaded directories (they have
        their manifest); backends with a cheaper way than a listing each override it."""
        return [n for n in self.list(prefix) if MANIFEST in self.list(f"{prefix}/{n}")]

    @abstractmethod
    def delete(self, name: str) -> None:
        """Delete an object or a whole "directory"; missing is fine."""

    @abstractmethod
    def upload_dir(self, local: Path, name: str) -> None:
        """Copy a local directory to ``name``; it appears whole (with a manifest) or not at all."""

    @abstractmethod
    def download_dir(self, name: str, local: Path) -> None:
        """Copy a complete uploaded directory to ``local`` (which must not exist)."""

    @abstractmethod
    def verify_dir(self, name: str) -> builtins.list[str]:
        """What is wrong with an uploaded directory (missing manifest, a file of the wrong
        size or checksum), without downloading it; empty when it is whole."""

    @abstractmethod
    def quarantine(self, name: str) -> str:
        """Move an object or directory aside where listings do not see it; returns the
        new name. Nothing is deleted."""

    @abstractmethod
    def sweep(self, prefix: str, older_than: float) -> int:
        """Remove leftovers of interrupted writes under ``prefix`` older than ``older_than``
        seconds (younger ones may belong to a writer still at work); returns how many."""


class FileStorage(DurableStorage):
    """Durable storage in a directory. ``fsync`` on every write: it is the source of truth."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        self._folder(root)

    def _folder(self, path: Path) -> None:
        """Make directory ``path``; a file in the way is the user's to move, said so."""
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            in_the_way = next((p for p in (path, *path.parents) if p.is_file()), path)
            raise StateValueError(
                f"durable state location {self.url}: {in_the_way} is a file where a "
                "directory goes; point the state's durable location at a directory, or "
                "move the file"
            ) from None

    def _path(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, data: bytes) -> None:
        path = self._path(name)
        self._folder(path.parent)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def read(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise StateError(f"{self.url}/{name} does not exist") from None

    def read_ends(self, name: str, head: int, tail: int) -> tuple[bytes, bytes]:
        try:
            with open(self._path(name), "rb") as f:
                first = f.read(head)
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - tail))
                return first, f.read(tail)
        except FileNotFoundError:
            raise StateError(f"{self.url}/{name} does not exist") from None

    def list(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        if not path.is_dir():
            return []
        return sorted(p.name for p in path.iterdir() if not p.name.startswith("."))

    def delete(self, name: str) -> None:
        path = self._path(name)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def upload_dir(self, local: Path, name: str) -> None:
        """1. copy files into a hidden temp dir; 2. fsync them and write the manifest;
        3. rename the temp dir into place (an existing complete copy wins)."""
        final = self._path(name)
        self._folder(final.parent)
        tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex}")
        shutil.copytree(local, tmp)
        files, crcs = {}, {}
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    crcs[str(f.relative_to(tmp))] = file_crc(fh)
                    os.fsync(fh.fileno())
                files[str(f.relative_to(tmp))] = f.stat().st_size
        manifest = tmp / MANIFEST
        manifest.write_text(json.dumps({"files": files, "crc32": crcs}), encoding="utf-8")
        with open(manifest, "rb") as fh:
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        if (final / MANIFEST).exists():
            shutil.rmtree(tmp)
            return
        if final.exists():
            shutil.rmtree(final)  # an incomplete leftover
        os.replace(tmp, final)
        fsync_dir(final.parent)

    def _manifest(self, name: str) -> dict[str, Any]:
        src = self._path(name)
        try:
            manifest: dict[str, Any] = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
            if not isinstance(manifest.get("files"), dict):
                raise ValueError("no file list")
        except (OSError, ValueError) as exc:
            raise CorruptStateError(f"snapshot {src} has no valid manifest ({exc})") from exc
        return manifest

    @staticmethod
    def _check(root: Path, rel: str, manifest: dict[str, Any]) -> str | None:
        path = root / rel
        size = path.stat().st_size if path.exists() else -1
        if size != manifest["files"][rel]:
            return f"{rel} is {size} bytes, expected {manifest['files'][rel]}"
        expected = manifest.get("crc32", {}).get(rel)  # older snapshots: sizes only
        if expected is not None:
            with open(path, "rb") as fh:
                if file_crc(fh) != expected:
                    return f"{rel} fails its checksum"
        return None

    def download_dir(self, name: str, local: Path) -> None:
        src = self._path(name)
        manifest = self._manifest(name)
        shutil.copytree(src, local, ignore=shutil.ignore_patterns(MANIFEST))
        for rel in manifest["files"]:
            problem = self._check(local, rel, manifest)
            if problem is not None:
                raise CorruptStateError(f"snapshot {src}: {problem}")

    def verify_dir(self, name: str) -> builtins.list[str]:
        try:
            manifest = self._manifest(name)
        except CorruptStateError as exc:
            return [str(exc)]
        src = self._path(name)
        problems = (self._check(src, rel, manifest) for rel in manifest["files"])
        return [f"snapshot {src}: {p}" for p in problems if p is not None]

    def quarantine(self, name: str) -> str:
        path = self._path(name)
        aside = path.with_name(f".{path.name}.corrupt-{int(time.time())}")
        os.replace(path, aside)
        fsync_dir(path.parent)
        return str(aside.relative_to(self.root))

    def sweep(self, prefix: str, older_than: float) -> int:
        root = self._path(prefix)
        if not root.is_dir():
            return 0
        cutoff = time.time() - older_than
        removed = 0
        # beside writes under way: a temporary file or directory may be renamed into
        # place (or a directory vanish) between the listing and the look at it —
        # os.walk skips what it cannot list, and a vanished entry is a finished write
        for parent, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                if not fnmatch.fnmatch(name, ".*.tmp-*"):
                    continue
                entry = Path(parent) / name
                try:
                    stale = entry.stat().st_mtime < cutoff
                except FileNotFoundError:
                    continue
                if stale:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                    removed += 1
        return removed


def file_crc(fh: Any) -> int:
    """CRC-32 of an open file, read in 1 MiB pieces."""
    crc = 0
    while chunk := fh.read(1 << 20):
        crc = crc32(chunk, crc)
    return crc
