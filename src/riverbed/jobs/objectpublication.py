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

Readers get local copies (:meth:`published_files`), cached under ``<home>/jobs/cache``
by attempt: an attempt's files never change, so a copy never goes stale. The contract
this shares with the directory implementation is ``tests/jobs/test_publication_contract.py``.
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
    cache_dir,
    chunk_name,
    matching,
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
        self._marker_files: dict[tuple[str, int, int], list[str]] = {}

    def __repr__(self) -> str:
        return f"ObjectPublication({self.store.url!r})"

    @property
    def location(self) -> str:
        return self.store.url

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

    def chunks(self, job: str) -> list[int]:
        """The chunks of ``job`` with a published output."""
        names = (n.removeprefix("chunk=") for n in self.store.entries(f"{job}/{PUBLISHED}/"))
        return [int(n) for n in names if n.isdigit()]

    def _current(self, job: str) -> dict[int, int]:
        """Every chunk of ``job`` with its published attempt (its highest marker), from
        one listing of the job's markers."""
        prefix = f"{job}/{PUBLISHED}/"
        current: dict[int, int] = {}
        for info in self.store.list(prefix):
            chunk, _, attempt = info.key[len(prefix) :].partition("/")
            number = chunk.removeprefix("chunk=")
            if number.isdigit() and attempt.isdigit():
                c = int(number)
                current[c] = max(current.get(c, -1), int(attempt))
        return current

    def _names(self, job: str, chunk_id: int, attempt: int) -> list[str] | None:
        """The files an attempt's marker lists (None: no such marker, retracted). A
        marker never changes, so each is read once per publication object."""
        key = (job, chunk_id, attempt)
        names = self._marker_files.get(key)
        if names is None:
            try:
                body = json.loads(self.store.get(self._marker(job, chunk_id, attempt)))
            except ObjectNotFoundError:
                return None
            names = self._marker_files[key] = sorted(body["files"])
        return names

    def _files(self, job: str, chunk_id: int) -> tuple[int, list[str]] | None:
        """The published attempt and its files' names, or None."""
        attempt = self.published_attempt(job, chunk_id)
        if attempt is None:
            return None
        names = self._names(job, chunk_id, attempt)
        return None if names is None else (attempt, names)

    def published_urls(self, job: str, chunk_id: int) -> list[str]:
        """The URLs of the chunk's published files (sorted), [] when none is published."""
        found = self._files(job, chunk_id)
        if found is None:
            return []
        prefix = self._attempt_prefix(job, chunk_id, found[0])
        return [f"{self.store.url}/{prefix}{name}" for name in found[1]]

    def published_files(self, job: str, chunk_id: int, pattern: str = "*") -> dict[str, Path]:
        """Local copies of the chunk's published files matching ``pattern``, downloaded
        once per attempt into ``<home>/jobs/cache`` (copies of the chunk's older
        attempts there are removed)."""
        found = self._files(job, chunk_id)
        if found is None:
            return {}
        copies = self._copies(job, chunk_id, *found, pattern)
        return self.published_files(job, chunk_id, pattern) if copies is None else copies

    def job_files(self, job: str, pattern: str = "*") -> dict[str, Path]:
        """See :class:`~riverbed.jobs.publication.Publication`: one LIST of the job's
        markers, one GET per published marker not read before, the matching files
        downloaded once per attempt."""
        found: dict[str, Path] = {}
        for chunk, attempt in sorted(self._current(job).items(), reverse=True):
            names = self._names(job, chunk, attempt)
            copies = None if names is None else self._copies(job, chunk, attempt, names, pattern)
            if copies is None:  # replaced or retracted since the listing: ask again
                copies = self.published_files(job, chunk, pattern)
            for name, path in copies.items():
                found.setdefault(name, path)
        return found

    def _copies(
        self, job: str, chunk_id: int, attempt: int, names: list[str], pattern: str
    ) -> dict[str, Path] | None:
        """Local copies of an attempt's files matching ``pattern``; None when one of
        them is gone (the attempt was replaced or retracted while we read)."""
        local = cache_dir(self.home, job, chunk_id, attempt)
        for other in local.parent.glob(f"{chunk_name(chunk_id)}-*"):
            if other != local:
                shutil.rmtree(other, ignore_errors=True)
        prefix = self._attempt_prefix(job, chunk_id, attempt)
        copies = {}
        for name in matching(names, pattern):
            path = local / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.store.get_file(prefix + name, path)
                except ObjectNotFoundError:  # replaced or retracted while we read
                    return None
            copies[name] = path
        return copies

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
        (replaced outputs, zombies' uploads and markers); returns how many objects went.
        Attempts newer than the published one may be uploading now and are left alone.
        Two listings, whatever the number of chunks."""
        markers: dict[int, list[int]] = {}
        prefix = f"{job}/{PUBLISHED}/"
        for info in self.store.list(prefix):
            chunk, _, number = info.key[len(prefix) :].partition("/")
            chunk = chunk.removeprefix("chunk=")
            if chunk.isdigit() and number.isdigit():
                markers.setdefault(int(chunk), []).append(int(number))
        current = {chunk: max(numbers) for chunk, numbers in markers.items()}
        doomed = [
            self._marker(job, chunk, a)
            for chunk, numbers in markers.items()
            for a in numbers
            if a < current[chunk]
        ]
        prefix = f"{job}/{ATTEMPTS}/"
        for info in self.store.list(prefix):
            parsed = parse_attempt_name(info.key[len(prefix) :].split("/", 1)[0])
            if parsed is not None and parsed[1] < current.get(parsed[0], -1):
                doomed.append(info.key)
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
