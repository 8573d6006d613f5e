"""Durable storage for changelogs and snapshots.

:class:`DurableStorage` is the small set of operations the state layer needs from a
place that outlives machines: atomic whole-object writes, reads, listings, deletes,
and directory upload/download where the upload becomes visible all at once.
:mod:`riverbed.state.objects` implements them on any :class:`riverbed.storage.ObjectStore`
— a directory tree (a local disk, NFS) or a bucket — where objects are written whole and
a snapshot counts only once its manifest object exists.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from riverbed.checksum import crc32

MANIFEST = "MANIFEST.riverbed.json"


class DurableStorage(ABC):
    url: str

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Write object ``name`` whole: readers see the old content or the new, never a part."""

    @abstractmethod
    def write_once(self, name: str, data: bytes) -> bool:
        """Write object ``name`` whole unless it holds ``data`` already; whether this
        wrote. A re-commit of a deterministic batch (a retried task, a driver that lost
        its lead while paused between its fence and its commit) writes nothing; other
        bytes replace the object, as :meth:`write`."""

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


def file_crc(fh: Any) -> int:
    """CRC-32 of an open file, read in 1 MiB pieces."""
    crc = 0
    while chunk := fh.read(1 << 20):
        crc = crc32(chunk, crc)
    return crc
