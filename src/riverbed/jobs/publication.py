"""Where a chunk's output lives, and how an attempt's output becomes *the* output.

The one owner of the output layout, in an :class:`~riverbed.storage.ObjectStore` —
``<home>/jobs/output`` on this machine, or ``<checkpoints>/jobs/output`` when the
checkpoints are in a bucket (:mod:`riverbed.jobs.outputs` picks it)::

    <job>/.attempts/chunk=<chunk>-<attempt>/<file>   an attempt's files (immutable)
    <job>/.published/chunk=<chunk>/<attempt:020d>    its publication marker: created
                                                     once (create-only), after every
                                                     file; the body lists them
    <job>/chunk=<chunk>                              a view of the published attempt
                                                     (a symlink, on a directory only)
    <job>/.table                                     the table the chunks are published
                                                     to too, when the job names one

and on the worker's own disk, under ``<home>/jobs``::

    staging/<chunk>-<attempt>/              an attempt writes here while it runs (private)
    cache/<job>/chunk=<chunk>-<attempt>/    copies of outputs read from a bucket

**The ordering guarantee.** A worker publishes an attempt's output *before* it records
the chunk DONE, so anyone who sees DONE (a dependent chunk, the CLI, the console) finds
the output in place. Publication cannot be fenced by the database, so it is fenced by
the attempt number, which only grows per chunk. **What is published** is the attempt of
the *highest* marker of a chunk: publishing copies the staged files, then creates the
marker, so a reader that finds a marker finds every file it names. A zombie (an older
attempt, reclaimed while it was stopped) that publishes after a newer attempt creates a
marker that never becomes current and removes its own objects when it sees that; one
that publishes first is replaced when the newer attempt does. :meth:`Publication.retract`
(a fenced or failed attempt) deletes the markers of its own and older attempts, never a
newer one's; :meth:`Publication.sweep` deletes what attempts older than the published
one left. Publishing is idempotent: any number of callers may publish the same attempt
at once (the worker after a database error, an orchestrator finishing a crashed
worker's leftovers); each returns whether that attempt is published.

**A table.** A job with ``table="delta:…"`` or ``"iceberg:…"`` (:mod:`riverbed.tables`)
has each chunk's published Parquet files as one partition (``chunk`` = the chunk id) of
that table, replaced whole right after the marker makes the attempt current — so before
DONE, like the files. The commit is fenced by the attempt number as the files are: it
carries :func:`publish_version` (``2·attempt``), and a retraction empties the partition
at :func:`retract_version` (``2·attempt + 1``); a table never goes back to a lower
version, so a zombie's older attempt, or one retracted, cannot put its rows back. The
executor records the job's table under ``<job>/.table`` before a chunk runs, so every
publisher (a worker, an orchestrator finishing leftovers, a reaper retracting) finds it
without loading the job's code.

**Views.** On a directory, ``chunk=<id>`` shows the published attempt (the store's
view: a symlink replaced by one rename), so readers outside riverbed globbing
``output/<job>/chunk=*`` (DuckDB, Spark, Polars) see one entry per chunk and never the
hidden attempts. Each marker change is followed by a refresh of the view that reads the
markers under the view's lock, so the view ends at the published attempt whatever order
concurrent publishers ran in. riverbed itself reads markers, never views.

**Readers** get local files (:meth:`Publication.published_files`): a directory's
objects where they are; a bucket's as copies cached under ``<home>/jobs/cache`` by
attempt (an attempt's files never change, so a copy never goes stale).

**Before markers** riverbed published on a directory by renaming the attempt's
directory under ``.attempts/`` and pointing ``chunk=<id>`` at it (and earlier still, by
making ``chunk=<id>`` the directory itself, "attempt 0"). :func:`adopt_old_layout`
gives such chunks their markers once, crash-safely (markers are create-only; a stamp
is written last). The contract every store passes is
``tests/jobs/test_publication_contract.py``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from riverbed.parquetbytes import read_parquet_bytes
from riverbed.storage import ObjectNotFoundError, ObjectStore, StorageError

if TYPE_CHECKING:
    from riverbed.tables import PartitionTable

__all__ = [
    "ATTEMPTS",
    "PUBLISHED",
    "Publication",
    "adopt_old_layout",
    "attempt_name",
    "attempt_prefix",
    "cache_dir",
    "chunk_name",
    "marker_key",
    "markers_prefix",
    "matching",
    "parse_attempt_name",
    "staging_dir",
    "staging_root",
]

log = logging.getLogger(__name__)

ATTEMPTS = ".attempts"  # hidden: globs of chunk=*, Spark and DuckDB readers skip it
PUBLISHED = ".published"  # the create-only markers
TABLE = ".table"  # the table the job's chunks are published to: riverbed.tables' spelling
LAYOUT_STAMP = ".layout-markers"  # written once old-layout chunks have their markers


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


def attempt_prefix(job: str, chunk_id: int, attempt: int) -> str:
    """Where an attempt's files are in the store (ends in ``/``)."""
    return f"{job}/{ATTEMPTS}/{attempt_name(chunk_id, attempt)}/"


def markers_prefix(job: str, chunk_id: int) -> str:
    """Where a chunk's publication markers are in the store (ends in ``/``)."""
    return f"{job}/{PUBLISHED}/{chunk_name(chunk_id)}/"


def marker_key(job: str, chunk_id: int, attempt: int) -> str:
    """An attempt's publication marker: its number, zero-padded, so names sort."""
    return f"{markers_prefix(job, chunk_id)}{attempt:020d}"


def table_key(job: str) -> str:
    """Where the table a job's chunks are published to is named (hidden, like
    ``.attempts``)."""
    return f"{job}/{TABLE}"


def publish_version(attempt: int) -> int:
    """The version a chunk's partition is replaced at when ``attempt`` publishes: above
    every older attempt's retraction, below this attempt's."""
    return 2 * attempt


def retract_version(attempt: int) -> int:
    """The version a chunk's partition is emptied at when ``attempt`` (and those before
    it) is retracted: above its publication, below every newer attempt's."""
    return 2 * attempt + 1


def staging_root(home: Path) -> Path:
    """Where running attempts stage their output, one directory each."""
    return home / "jobs" / "staging"


def staging_dir(home: Path, chunk_id: int, attempt: int) -> Path:
    """Where attempt ``attempt`` of chunk ``chunk_id`` writes its output while it runs."""
    return staging_root(home) / f"{chunk_id}-{attempt}"


def cache_dir(home: Path, job: str, chunk_id: int, attempt: int) -> Path:
    """Where this machine keeps its copy of an attempt's output read from a bucket."""
    return home / "jobs" / "cache" / job / attempt_name(chunk_id, attempt)


def _open(table: str, job: str) -> PartitionTable:
    """The table spelled ``table`` (:func:`riverbed.tables.partition_table`), written by
    ``job``."""
    from riverbed.tables import partition_table

    return partition_table(table, job)


@contextlib.contextmanager
def _table_away(job: str) -> Iterator[None]:
    """A job's table that cannot be written now (its catalog or bucket away, another
    writer winning its check every time) is a :class:`StorageError`: the worker records
    the chunk's end again later and publishes again (idempotent: the files are
    published, the table commit is made then), the orchestrator retries at its next
    round — neither stops."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        said = re.sub(r"(\w[\w+.-]*://)[^/@\s]+@", r"\1", str(exc))  # no credentials
        raise StorageError(f"the table of job {job!r} cannot be written now: {said}") from exc


def adopt_old_layout(store: ObjectStore) -> int:
    """Give every chunk an older riverbed published on a directory (a ``chunk=<id>``
    view of ``.attempts/chunk=<id>-<n>``, or ``chunk=<id>`` the directory itself) its
    marker, once: then the markers say what is published, as for chunks published since.
    Crash-safe and idempotent (copies are redone, markers are create-only, the stamp
    that says it is done is written last). Returns how many chunks were adopted."""
    if store.exists(LAYOUT_STAMP):
        return 0
    adopted = 0
    for job in store.entries(""):
        prefix = f"{job}/"
        for name, shown in store.views(prefix).items():
            parsed = parse_attempt_name(shown.rsplit("/", 1)[-1])
            if name.startswith("chunk=") and parsed is not None:
                files = [i.key[len(shown) + 1 :] for i in store.list(f"{shown}/")]
                adopted += _adopt(store, job, *parsed, files)
        in_place: dict[int, list[str]] = {}  # chunk=<id>/<file>: "attempt 0"
        for info in store.list(f"{job}/chunk="):
            top, _, rest = info.key[len(prefix) :].partition("/")
            number = top.removeprefix("chunk=")
            if number.isdigit() and rest:
                in_place.setdefault(int(number), []).append(rest)
        for chunk, files in in_place.items():
            attempt = attempt_prefix(job, chunk, 0)
            for name in files:  # copied, not moved: readers keep the old directory until
                store.put(attempt + name, store.get(f"{job}/chunk={chunk}/{name}"))
            adopted += _adopt(store, job, chunk, 0, files)
            store.show(f"{job}/{chunk_name(chunk)}", functools.partial(str, attempt[:-1]))
    store.put(LAYOUT_STAMP, b"published chunks have markers\n")
    if adopted:
        log.info("gave %d chunks published by an older riverbed their markers", adopted)
    return adopted


def _adopt(store: ObjectStore, job: str, chunk: int, attempt: int, files: list[str]) -> int:
    marker = marker_key(job, chunk, attempt)
    return int(store.put_if_absent(marker, json.dumps({"files": sorted(files)}).encode()))


class Publication:
    """Chunk outputs of every job in ``store``; attempts stage locally under ``home``."""

    def __init__(self, store: ObjectStore, home: Path) -> None:
        self.store = store
        self.home = Path(home)
        self._marker_files: dict[tuple[str, int, int], list[str]] = {}

    def __repr__(self) -> str:
        return f"Publication({self.store.url!r})"

    @property
    def location(self) -> str:
        """Where the outputs are, for people: a directory or an ``s3://`` URL."""
        return self.store.locate("").rstrip("/")

    # -- names ------------------------------------------------------------------------

    def _published(self, job: str, chunk_id: int) -> list[int]:
        """The attempts with a marker, oldest first."""
        prefix = markers_prefix(job, chunk_id)
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
                body = json.loads(self.store.get(marker_key(job, chunk_id, attempt)))
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
        """Where the chunk's published files are (paths on a directory, URLs in a bucket),
        sorted, without reading them; [] when none is published."""
        found = self._files(job, chunk_id)
        if found is None:
            return []
        prefix = attempt_prefix(job, chunk_id, found[0])
        return [self.store.locate(prefix + name) for name in found[1]]

    def published_files(self, job: str, chunk_id: int, pattern: str = "*") -> dict[str, Path]:
        """The chunk's published files matching ``pattern`` as local files: a
        directory's where they are, a bucket's downloaded once per attempt into
        ``<home>/jobs/cache`` (copies of the chunk's older attempts there are removed)."""
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
        """An attempt's files matching ``pattern`` as local files (in place, or copies);
        None when one of them is gone (the attempt was replaced or retracted while we
        read)."""
        local = cache_dir(self.home, job, chunk_id, attempt)
        prefix = attempt_prefix(job, chunk_id, attempt)
        copies = {}
        tidy = True
        for name in matching(names, pattern):
            in_place = self.store.local_file(prefix + name)
            if in_place is not None:  # a directory's: read where it is, never copied
                copies[name] = in_place
                continue
            path = local / name
            if not path.exists():
                if tidy:  # the chunk's older attempts' copies: never read again
                    tidy = False
                    for other in local.parent.glob(f"{chunk_name(chunk_id)}-*"):
                        if other != local:
                            shutil.rmtree(other, ignore_errors=True)
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
        it is the published one when this returns (its view in place, where the store
        keeps views, and its partition in the job's table, where the job has one); False
        if it staged nothing or a newer attempt published first (then its own objects
        are removed)."""
        published = self._publish_files(job, chunk_id, attempt)
        if published:
            self._to_table(job, chunk_id, attempt)
        return published

    def _publish_files(self, job: str, chunk_id: int, attempt: int) -> bool:
        current = self.published_attempt(job, chunk_id)
        if current is not None and current >= attempt:
            if current > attempt:
                self._discard(job, chunk_id, attempt, current)
                return False
            return self._is_published(job, chunk_id, attempt)
        staged = staging_dir(self.home, chunk_id, attempt)
        prefix = attempt_prefix(job, chunk_id, attempt)
        # os.walk, not rglob: a concurrent publisher of this attempt may remove it meanwhile
        files = sorted(Path(d) / name for d, _dirs, names in os.walk(staged) for name in names)
        if not files:
            return self._is_published(job, chunk_id, attempt)
        names = []
        try:
            for path in files:
                name = path.relative_to(staged).as_posix()
                self.store.put_file(prefix + name, path)  # multipart when large
                names.append(name)
        except FileNotFoundError:  # a concurrent publisher of this attempt moved on
            return self._is_published(job, chunk_id, attempt)
        body = json.dumps({"files": names}).encode()
        self.store.put_if_absent(marker_key(job, chunk_id, attempt), body)
        shutil.rmtree(staged, ignore_errors=True)
        published = self._published(job, chunk_id)
        current = published[-1] if published else None
        if current != attempt:  # a newer attempt published first (or retracted this one)
            if current is not None and current > attempt:
                self._discard(job, chunk_id, attempt, current)
            return False
        self._show(job, chunk_id)
        for older in published[:-1]:  # replaced outputs, now unseen
            self._drop(job, chunk_id, older)
        return True

    def _is_published(self, job: str, chunk_id: int, attempt: int) -> bool:
        """Whether ``attempt`` is published (another caller of it got there first); if
        so its view is made sure of before saying so."""
        if self.published_attempt(job, chunk_id) != attempt:
            return False
        self._show(job, chunk_id)
        return True

    def retract(self, job: str, chunk_id: int, attempt: int) -> None:
        """Unpublish the chunk's output if it is of attempt ``attempt`` or older (an
        attempt fenced or failed); a newer attempt's output stays."""
        retracted = [older for older in self._published(job, chunk_id) if older <= attempt]
        for older in retracted:
            self.store.delete(marker_key(job, chunk_id, older))
            log.info("chunk %s: retracted the output of attempt %s", chunk_id, older)
        if retracted:
            self._show(job, chunk_id)  # before the objects go: a reader's view never dangles
        for older in retracted:
            self._drop_objects(job, chunk_id, older)
        shutil.rmtree(staging_dir(self.home, chunk_id, attempt), ignore_errors=True)
        bound = self._bound(job)  # (most jobs: one read, no table)
        if bound is None:
            return
        import pyarrow as pa

        with _table_away(job):  # emptied: a stale publisher of these attempts cannot win
            _open(bound, job).replace(str(chunk_id), pa.table({}), retract_version(attempt))

    # -- the job's table ----------------------------------------------------------------

    def bind_table(self, job: str, table: str | None) -> None:
        """Record the table ``job``'s chunks are published to (its spec's ``table``;
        None: none), where every publisher reads it (:meth:`table`) — the executor that
        runs a chunk of the job records it before the chunk runs."""
        bound = self._bound(job)
        if bound == table:
            return
        if table is None:
            self.store.delete(table_key(job))
        else:
            self.store.put(table_key(job), table.encode())

    def _bound(self, job: str) -> str | None:
        """The spelling of the table ``job``'s chunks are published to, or None."""
        try:
            return self.store.get(table_key(job)).decode()
        except ObjectNotFoundError:
            return None

    def table(self, job: str) -> PartitionTable | None:
        """The table ``job``'s chunks are published to, or None."""
        bound = self._bound(job)
        return None if bound is None else _open(bound, job)

    def _to_table(self, job: str, chunk_id: int, attempt: int) -> None:
        """Replace the chunk's partition of the job's table by the Parquet files of its
        published attempt, at :func:`publish_version` (a re-publication, or an older
        attempt after a newer one, writes nothing)."""
        bound = self._bound(job)  # (most jobs: one read, no table)
        if bound is None:
            return
        import pyarrow as pa

        names = self._names(job, chunk_id, attempt) or []
        prefix = attempt_prefix(job, chunk_id, attempt)
        parts = [
            read_parquet_bytes(self.store.get(prefix + n)) for n in names if n.endswith(".parquet")
        ]
        rows = pa.concat_tables(parts, promote_options="default") if parts else pa.table({})
        with _table_away(job):
            _open(bound, job).replace(str(chunk_id), rows, publish_version(attempt))

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
            marker_key(job, chunk, a)
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
        self.store.delete(marker_key(job, chunk_id, attempt))
        self._drop_objects(job, chunk_id, attempt)

    def _drop_objects(self, job: str, chunk_id: int, attempt: int) -> None:
        prefix = attempt_prefix(job, chunk_id, attempt)
        self.store.delete_many([info.key for info in self.store.list(prefix)])

    def _show(self, job: str, chunk_id: int) -> None:
        """Point the chunk's view (``<job>/chunk=<id>``, where the store keeps views) at
        its published attempt, or remove it: decided under the view's lock from the
        markers then, so after every marker change and its ``_show`` the view shows the
        highest marker whatever order concurrent callers ran in."""

        def current() -> str | None:
            attempt = self.published_attempt(job, chunk_id)
            return None if attempt is None else attempt_prefix(job, chunk_id, attempt)[:-1]

        self.store.show(f"{job}/{chunk_name(chunk_id)}", current)
