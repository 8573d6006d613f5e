"""Where a chunk's output lives, and how an attempt's output becomes *the* output.

The one owner of the output layout under ``<home>/jobs``::

    staging/<chunk>-<attempt>/              an attempt writes here while it runs (private)
    cache/<job>/chunk=<chunk>-<attempt>/    copies of outputs read from a bucket
    output/<job>/.attempts/chunk=<chunk>-<attempt>/   published attempts (immutable)
    output/<job>/chunk=<chunk>              → .attempts/chunk=<chunk>-<attempt> (symlink)

**The ordering guarantee.** A worker publishes an attempt's output *before* it records
the chunk DONE, so anyone who sees DONE (a dependent chunk, the CLI, the console) finds
the output in place. Publication cannot be fenced by the database (it is a file-system
step), so it is fenced by the attempt number instead, which only grows per chunk:

1. ``rename`` the staging directory to the attempt's own name under ``.attempts/`` —
   no other attempt ever writes there, so two writers never collide;
2. under the job's publication lock (``flock``), point ``chunk=<id>`` at it with one
   atomic ``rename`` of a new symlink, **unless a newer attempt is already there**;
3. ``fsync`` what was renamed, then the worker records DONE (fenced by its claim).

A zombie (an older attempt, reclaimed while it was stopped) may still publish before the
current attempt does; the current attempt then replaces it, and a zombie arriving after
the current attempt is refused at step 2. A fenced or failed attempt retracts what it
published (:func:`retract`). Publishing is idempotent: any number of callers may
publish the same attempt at once (the worker after a database error, an orchestrator
finishing a crashed worker's leftovers); each returns whether that attempt is published.

**Where outputs live** is decided once, by :mod:`riverbed.jobs.outputs`: under
``<home>/jobs`` (this module, :class:`DirectoryPublication`), or — when the
``checkpoints`` setting names a bucket — under ``<checkpoints>/jobs/output``
(:mod:`riverbed.jobs.objectpublication`, the same guarantees by create-only writes).
Workers, orchestrators and ``ctx.published`` go through the :class:`Publication` it opens.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from riverbed.files import flocked, fsync_dir, fsync_file
from riverbed.jobs.errors import JobsError

__all__ = [
    "ATTEMPTS",
    "PUBLISHED",
    "DirectoryPublication",
    "Publication",
    "attempt_dir",
    "attempt_name",
    "cache_dir",
    "chunk_name",
    "matching",
    "parse_attempt_name",
    "publish",
    "published_attempt",
    "published_dir",
    "retract",
    "staging_dir",
    "staging_root",
]

log = logging.getLogger(__name__)

ATTEMPTS = ".attempts"  # hidden: globs of chunk=*, Spark and DuckDB readers skip it
PUBLISHED = ".published"  # in a bucket: the create-only markers (objectpublication.py)


class Publication(Protocol):
    """Where chunk outputs are published, and the steps that publish them (the module
    doc). Attempts always stage under ``home`` on the worker's own disk."""

    home: Path

    @property
    def location(self) -> str:
        """Where the outputs are, for people: a directory or an ``s3://`` URL."""
        ...

    def publish(self, job: str, chunk_id: int, attempt: int) -> bool: ...
    def retract(self, job: str, chunk_id: int, attempt: int) -> None: ...
    def published_attempt(self, job: str, chunk_id: int) -> int | None: ...

    def chunks(self, job: str) -> list[int]:
        """The chunks of ``job`` with a published output, in no particular order."""
        ...

    def published_files(self, job: str, chunk_id: int, pattern: str = "*") -> dict[str, Path]:
        """The chunk's published files whose names (relative to its output) match the
        glob ``pattern``, as local paths to read: the files themselves on a directory,
        copies cached under ``home`` from a bucket (an attempt's files never change)."""
        ...

    def published_urls(self, job: str, chunk_id: int) -> list[str]:
        """Where the chunk's published files are (paths, or ``s3://`` URLs), sorted,
        without reading them; [] when nothing is published."""
        ...

    def job_files(self, job: str, pattern: str = "*") -> dict[str, Path]:
        """Every published file of ``job`` (all its chunks) matching ``pattern``, by
        name; a name published by several chunks: the newest chunk's file. What
        ``ctx.published`` reads: the job's published attempts found at once, not chunk
        by chunk."""
        ...

    def sweep(self, job: str) -> int:
        """Delete what attempts older than their chunk's published one left (a crash
        between steps, a zombie's upload); returns how many went."""
        ...


def matching(names: list[str], pattern: str) -> list[str]:
    """The relative names a glob ``pattern`` matches, as ``Path.glob`` would (``*``
    stays within one directory level)."""
    return [
        n for n in names if n.count("/") == pattern.count("/") and fnmatch.fnmatchcase(n, pattern)
    ]


def chunk_name(chunk_id: int) -> str:
    """The published name of a chunk's output: ``chunk=<id>``."""
    return f"chunk={chunk_id}"


def attempt_name(chunk_id: int, attempt: int) -> str:
    """The name of an attempt's output under ``.attempts/``: ``chunk=<id>-<attempt>``."""
    return f"chunk={chunk_id}-{attempt}"


def parse_attempt_name(name: str) -> tuple[int, int] | None:
    """``(chunk id, attempt)`` of an :func:`attempt_name`, or None for another name."""
    chunk, _, attempt = name.removeprefix("chunk=").rpartition("-")
    if not (name.startswith("chunk=") and chunk.isdigit() and attempt.isdigit()):
        return None
    return int(chunk), int(attempt)


def staging_root(home: Path) -> Path:
    """Where running attempts stage their output, one directory each."""
    return home / "jobs" / "staging"


def staging_dir(home: Path, chunk_id: int, attempt: int) -> Path:
    """Where attempt ``attempt`` of chunk ``chunk_id`` writes its output while it runs."""
    return staging_root(home) / f"{chunk_id}-{attempt}"


def cache_dir(home: Path, job: str, chunk_id: int, attempt: int) -> Path:
    """Where this machine keeps its copy of an attempt's output read from a bucket."""
    return home / "jobs" / "cache" / job / attempt_name(chunk_id, attempt)


def job_output_dir(home: Path, job: str) -> Path:
    """The published outputs of ``job``: one ``chunk=<id>`` entry per chunk."""
    return home / "jobs" / "output" / job


def published_dir(home: Path, job: str, chunk_id: int) -> Path:
    """The published output of a chunk (a symlink to the attempt that published it)."""
    return job_output_dir(home, job) / chunk_name(chunk_id)


def attempt_dir(home: Path, job: str, chunk_id: int, attempt: int) -> Path:
    """Attempt ``attempt``'s output once moved out of staging (never rewritten)."""
    return job_output_dir(home, job) / ATTEMPTS / attempt_name(chunk_id, attempt)


def published_attempt(home: Path, job: str, chunk_id: int) -> int | None:
    """The attempt whose output ``chunk=<id>`` shows now, or None (nothing published).
    A directory left by riverbed before attempts were named counts as attempt 0."""
    link = published_dir(home, job, chunk_id)
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # a real directory: published by an older riverbed
            return 0
        raise
    parsed = parse_attempt_name(Path(target).name)
    if parsed is None:
        raise JobsError(f"{link} points at {target}, which is no attempt's output")
    return parsed[1]


def publish(home: Path, job: str, chunk_id: int, attempt: int) -> bool:
    """Make attempt ``attempt``'s staged output the chunk's published output (see the
    module doc). True if that attempt's output is the published one when this returns;
    False if it staged nothing or a newer attempt published first (then its own copy is
    removed)."""
    staged = staging_dir(home, chunk_id, attempt)
    mine = attempt_dir(home, job, chunk_id, attempt)
    mine.parent.mkdir(parents=True, exist_ok=True)
    # The bytes first, then the names. A file gone meanwhile was moved by a concurrent
    # caller of this attempt, who synced every file before its rename.
    for path, _dirs, files in os.walk(staged):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                fsync_file(Path(path) / name)
    try:
        os.rename(staged, mine)  # step 1
        fsync_dir(mine.parent)
        fsync_dir(staged.parent)
    except FileNotFoundError:
        pass  # another caller moved it already, or nothing was staged
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not mine.is_dir():
        return published_attempt(home, job, chunk_id) == attempt
    link = published_dir(home, job, chunk_id)
    with _locked(home, job):  # step 2
        current = published_attempt(home, job, chunk_id)
        if current == attempt:
            return True
        if current is not None and current > attempt:
            log.warning(
                "chunk %s attempt %s: attempt %s published first; this output is discarded",
                chunk_id,
                attempt,
                current,
            )
            shutil.rmtree(mine, ignore_errors=True)
            return False
        old = _target(link)
        if current == 0:  # an older riverbed's real directory: make way (not atomic)
            shutil.rmtree(link)
        tmp = link.with_name(f".{link.name}-{attempt}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(Path(ATTEMPTS) / mine.name, tmp)
        os.replace(tmp, link)
        fsync_dir(link.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # an older attempt's output, now unseen
    return True


def retract(home: Path, job: str, chunk_id: int, attempt: int) -> None:
    """Unpublish the chunk's output if it is of attempt ``attempt`` or older — for an
    attempt that was fenced or failed (a newer attempt's output stays)."""
    link = published_dir(home, job, chunk_id)
    if published_attempt(home, job, chunk_id) is None:
        return  # the common case, decided without the lock: nothing to retract
    with _locked(home, job):
        current = published_attempt(home, job, chunk_id)
        if current is None or current > attempt or current == 0:
            return
        old = _target(link)
        link.unlink()
        fsync_dir(link.parent)
    log.info("chunk %s: retracted the output of attempt %s", chunk_id, current)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(attempt_dir(home, job, chunk_id, attempt), ignore_errors=True)


class DirectoryPublication:
    """Publication on this machine's disk (the functions of this module)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)

    def __repr__(self) -> str:
        return f"DirectoryPublication({str(self.home)!r})"

    @property
    def location(self) -> str:
        return str(self.home / "jobs" / "output")

    def publish(self, job: str, chunk_id: int, attempt: int) -> bool:
        return publish(self.home, job, chunk_id, attempt)

    def retract(self, job: str, chunk_id: int, attempt: int) -> None:
        retract(self.home, job, chunk_id, attempt)

    def published_attempt(self, job: str, chunk_id: int) -> int | None:
        return published_attempt(self.home, job, chunk_id)

    def chunks(self, job: str) -> list[int]:
        root = job_output_dir(self.home, job)
        names = (d.name.removeprefix("chunk=") for d in root.glob("chunk=*"))
        return [int(n) for n in names if n.isdigit()]

    def published_files(self, job: str, chunk_id: int, pattern: str = "*") -> dict[str, Path]:
        folder = published_dir(self.home, job, chunk_id)
        found = {}
        for path in folder.glob(pattern):
            if path.is_file():
                found[path.relative_to(folder).as_posix()] = path
        return found

    def published_urls(self, job: str, chunk_id: int) -> list[str]:
        folder = published_dir(self.home, job, chunk_id)
        return sorted(str(p) for p in folder.rglob("*") if p.is_file())

    def job_files(self, job: str, pattern: str = "*") -> dict[str, Path]:
        found: dict[str, Path] = {}
        for chunk in sorted(self.chunks(job), reverse=True):
            for name, path in self.published_files(job, chunk, pattern).items():
                found.setdefault(name, path)
        return found

    def sweep(self, job: str) -> int:
        root = job_output_dir(self.home, job) / ATTEMPTS
        gone = 0
        current: dict[int, int | None] = {}
        for path in root.glob("chunk=*") if root.is_dir() else []:
            parsed = parse_attempt_name(path.name)
            if parsed is None:
                continue
            chunk, number = parsed
            if chunk not in current:
                current[chunk] = published_attempt(self.home, job, chunk)
            published = current[chunk]
            if published is not None and number < published:
                shutil.rmtree(path, ignore_errors=True)
                gone += 1
        return gone


def _target(link: Path) -> Path | None:
    try:
        return link.parent / os.readlink(link)
    except OSError:
        return None


@contextlib.contextmanager
def _locked(home: Path, job: str) -> Iterator[None]:
    """The job's publication lock: one publisher of this job's chunks at a time on this
    file system (a readlink, a symlink and a rename: held for well under a millisecond)."""
    path = job_output_dir(home, job) / ATTEMPTS / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with flocked(path):
        yield
