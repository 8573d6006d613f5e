"""Publication of a chunk's output to an object store (``s3://bucket/prefix``), where
nothing can be renamed: the bucket counterpart of :mod:`riverbed.jobs.publication`,
with the same guarantees, decided by create-only writes alone.

Layout under the store (``<location>/jobs/output``; names owned by
:mod:`riverbed.jobs.publication`)::

    <job>/.attempts/chunk=<chunk>-<attempt>/<file>   an attempt's files (immutable)
    <job>/.published/chunk=<chunk>/<attempt:020d>    its publication marker: created
                                                     once (If-None-Match: *), after
                                                     every file; the body lists them

**What is published** is the attempt of the *highest* marker of a chunk. Publishing
uploads the staged files, then creates the marker: a reader that finds a marker finds
every file it names. A zombie (an older attempt, reclaimed while it was stopped) that
publishes after a newer attempt creates a marker that never becomes current, and it
removes its own objects when it sees that; one that publishes first is replaced when the
newer attempt does. :meth:`retract` (a fenced or failed attempt) deletes the markers of
its own and older attempts, never a newer one's. :meth:`sweep` deletes objects of
attempts that are not current and older than the current one. Publishing is
idempotent: any number of callers may publish the same attempt at once.

Not wired into the worker yet (issue 30): it runs its contract beside the directory
implementation's in ``tests/jobs/test_publication_contract.py``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from riverbed.jobs.publication import (
    ATTEMPTS,
    PUBLISHED,
    attempt_name,
    chunk_name,
    parse_attempt_name,
    staging_dir,
)
from riverbed.storage import ObjectNotFoundError, ObjectStore

__all__ = ["ObjectPublication"]

log = logging.getLogger(__name__)


class ObjectPublication:
    """Chunk outputs of every job in ``store``; attempts stage locally under ``home``."""

    def __init__(self, store: ObjectStore, home: Path) -> None:
        self.store = store
        self.home = home

    # -- names ------------------------------------------------------------------------

    def _attempt_prefix(self, job: str, chunk_id: int, attempt: int) -> str:
        return f"{job}/{ATTEMPTS}/{attempt_name(chunk_id, attempt)}/"

    def _markers_prefix(self, job: str, chunk_id: int) -> str:
        return f"{job}/{PUBLISHED}/{chunk_name(chunk_id)}/"

    def _marker(self, job: str, chunk_id: int, attempt: int) -> str:
        return f"{self._markers_prefix(job, chunk_id)}{attempt:020d}"

    def _published(self, job: str, chunk_id: int) -> list[int]:
        """The attempts with a marker, oldest first."""
        prefix = self._markers_prefix(job, chunk_id)
        names = (info.key[len(prefix) :] for info in self.store.list(prefix))
        return sorted(int(n) for n in names if n.isdigit())

    # -- readers ----------------------------------------------------------------------

    def published_attempt(self, job: str, chunk_id: int) -> int | None:
        """The attempt whose output is the chunk's now, or None (nothing published)."""
        published = self._published(job, chunk_id)
        return published[-1] if published else None

    def published_files(self, job: str, chunk_id: int) -> list[str]:
        """The URLs of the chunk's published files (sorted), [] when none is published."""
        attempt = self.published_attempt(job, chunk_id)
        if attempt is None:
            return []
        try:
            body = json.loads(self.store.get(self._marker(job, chunk_id, attempt)))
        except ObjectNotFoundError:  # retracted meanwhile
            return []
        prefix = self._attempt_prefix(job, chunk_id, attempt)
        return [f"{self.store.url}/{prefix}{name}" for name in sorted(body["files"])]

    # -- writers ----------------------------------------------------------------------

    def publish(self, job: str, chunk_id: int, attempt: int) -> bool:
        """Make attempt ``attempt``'s staged output the chunk's published output. True if
        it is the published one when this returns; False if it staged nothing or a newer
        attempt published first (then its own objects are removed)."""
        current = self.published_attempt(job, chunk_id)
        if current is not None and current >= attempt:
            if current > attempt:
                self._discard(job, chunk_id, attempt, current)
            return current == attempt
        staged = staging_dir(self.home, chunk_id, attempt)
        prefix = self._attempt_prefix(job, chunk_id, attempt)
        files = sorted(p for p in staged.rglob("*") if p.is_file()) if staged.is_dir() else []
        if not files:
            return self.published_attempt(job, chunk_id) == attempt
        names = []
        try:
            for path in files:
                name = path.relative_to(staged).as_posix()
                self.store.put_file(prefix + name, path)  # multipart when large
                names.append(name)
        except FileNotFoundError:  # a concurrent publisher of this attempt moved on
            return self.published_attempt(job, chunk_id) == attempt
        body = json.dumps({"files": names}).encode()
        self.store.put_if_absent(self._marker(job, chunk_id, attempt), body)
        shutil.rmtree(staged, ignore_errors=True)
        published = self._published(job, chunk_id)
        current = published[-1] if published else None
        if current != attempt:  # a newer attempt published first (or retracted this one)
            if current is not None and current > attempt:
                self._discard(job, chunk_id, attempt, current)
            return False
        for older in published[:-1]:  # replaced outputs, now unseen
            self._drop(job, chunk_id, older)
        return True

    def retract(self, job: str, chunk_id: int, attempt: int) -> None:
        """Unpublish the chunk's output if it is of attempt ``attempt`` or older (an
        attempt fenced or failed); a newer attempt's output stays."""
        for older in self._published(job, chunk_id):
            if older > attempt:
                break
            self._drop(job, chunk_id, older)
            log.info("chunk %s: retracted the output of attempt %s", chunk_id, older)
        shutil.rmtree(staging_dir(self.home, chunk_id, attempt), ignore_errors=True)

    def sweep(self, job: str) -> int:
        """Delete the objects of attempts older than their chunk's published attempt
        (replaced outputs, zombies' uploads); returns how many objects went. Attempts
        newer than the published one may be uploading now and are left alone."""
        prefix = f"{job}/{ATTEMPTS}/"
        current: dict[int, int | None] = {}
        doomed = []
        for info in self.store.list(prefix):
            parsed = parse_attempt_name(info.key[len(prefix) :].split("/", 1)[0])
            if parsed is None:
                continue
            chunk, number = parsed
            if chunk not in current:
                current[chunk] = self.published_attempt(job, chunk)
            published = current[chunk]
            if published is not None and number < published:
                doomed.append(info.key)
        for chunk_id, published in current.items():
            doomed += [
                self._marker(job, chunk_id, a)
                for a in self._published(job, chunk_id)
                if published is not None and a < published
            ]
        self.store.delete_many(doomed)
        return len(doomed)

    def _discard(self, job: str, chunk_id: int, attempt: int, current: int) -> None:
        log.warning(
            "chunk %s attempt %s: attempt %s published first; this output is discarded",
            chunk_id,
            attempt,
            current,
        )
        self._drop(job, chunk_id, attempt)
        shutil.rmtree(staging_dir(self.home, chunk_id, attempt), ignore_errors=True)

    def _drop(self, job: str, chunk_id: int, attempt: int) -> None:
        """Delete an attempt's marker, then its objects."""
        self.store.delete(self._marker(job, chunk_id, attempt))
        prefix = self._attempt_prefix(job, chunk_id, attempt)
        self.store.delete_many([info.key for info in self.store.list(prefix)])
