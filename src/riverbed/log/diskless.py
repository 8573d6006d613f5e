"""Diskless topics: records in an object store, their offsets in the control plane.

(Over 600 lines: one storage's protocol — the group-committing writer, the index
reads and the upkeep — shares :class:`Layout` and the index's transaction shapes, and
each I/O step sits beside the pure decision it runs (listed at the end of this text),
which tests reach without a bucket. Split the upkeep out when it grows.)

A log at ``s3://bucket/prefix`` keeps nothing on the machines that produce and consume
it (the shape of WarpStream, Bufstream and Kafka's KIP-1150 "diskless topics"):

* **Writes are group-committed.** Appends of any topic and partition made in one
  process within a flush interval (default 50 ms, or sooner when 4 MiB are waiting)
  go into **one shared object** (``wal/<ms>-<writer>-<flush>``): each batch's encoded
  body, one after another, with no offsets in them.
* **One control-plane transaction per flush assigns the offsets.** It checks that no
  other writer moved any of the flush's partitions since they were read (their
  ``end`` keys' revisions), then moves each partition's end past its batches and puts
  one **index entry** per batch — base offset → (object, byte range, count, time
  range). A conflict re-reads the ends and tries again; the object stays as written.
* **An append returns only after both**: acknowledged means in the bucket and in the
  index. An append whose flush failed raises, and nothing of it is readable — unless
  the commit's answer was lost on the way back: the flush's writer key (put in the
  same transaction) tells, on the retry, that it did commit, and with which offsets.
* **Reads** look the offsets up in the index (entries are grouped in pages of
  2^16 offsets, so a lookup reads one page) and fetch byte ranges of the objects
  through an in-memory cache.

* **Upkeep** (every log server runs it each minute): retention drops a partition's
  oldest index entries; compaction rewrites runs of batches in shared objects into one
  object of their partition (``seg/…``), fenced by the old entries' revisions; garbage
  collection deletes objects nothing names any more, an hour after they were written,
  and the writer keys of writers gone as long (a writer deletes its own when it closes).

The key layout in the control plane and the bucket has one owner, :class:`Layout`.
The pure decisions — where each batch goes in a flush's object and which offsets it
gets (:func:`place`), which index entries a read needs (:func:`covering`), what
retention drops (:func:`expired`), what compaction merges (:func:`compaction_runs`,
:func:`merged`), what garbage goes (:func:`unreferenced`, :func:`stale_writer`),
what the processes did (:func:`summarize`) — are functions of their inputs alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from riverbed.control import Compare, ControlPlane, Delete, OutcomeUnknownError, Put
from riverbed.log.base import (
    LogStorage,
    TopicConfig,
    check_column_values,
    typed_values,
)
from riverbed.log.errors import (
    CorruptLogError,
    LogError,
    LogValueError,
    OffsetOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import (
    ColumnBatch,
    Columns,
    EncodedBatch,
    RawRecord,
    StoredBatch,
    columns_from,
    encode_body,
    encode_columns,
    rows_from,
)
from riverbed.storage import ObjectNotFoundError, ObjectStore

FLUSH_MS = 50  # the default flush interval: the latency/cost trade-off (docs/log.md)
FLUSH_BYTES = 4 * 1024 * 1024  # a flush goes sooner once this much is waiting
PAGE_BITS = 16  # index entries are grouped by base offset >> PAGE_BITS
COMMIT_ATTEMPTS = 200  # conflicts with other writers before a flush gives up
UNKNOWN_ATTEMPTS = 6  # commits lost with their member (outcome unknown) before it gives up
CACHE_BYTES = 64 * 1024 * 1024
MAX_TXN_OPS = 100  # operations (and compares) per control-plane transaction: etcd allows 128
DISK_CACHE_BYTES = 1024 * 1024 * 1024
WAL, SEG = "wal/", "seg/"  # object prefixes: shared flush objects, a partition's own (Layout)


class DisklessCommitError(LogError):
    """A flush could not commit its offsets (the control plane refused or was
    unreachable); nothing of its appends is readable."""


# -- the pure decisions -------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """One append waiting for a flush: its batch encoded but for its offsets."""

    topic: str
    partition: int
    count: int
    body: bytes
    min_ts: int
    max_ts: int
    producer: str | None = None  # with ``sequence``: a client's retry is recognised
    sequence: int = 0


@dataclass(frozen=True)
class Entry:
    """An index entry: records [base, base + count) of a partition are the byte range
    [start, stop) of ``obj``, stamped between ``min_ts`` and ``max_ts``."""

    base: int
    count: int
    obj: str
    start: int
    stop: int
    min_ts: int
    max_ts: int
    parts: tuple[tuple[int, int], ...] = ()  # compacted: (records, bytes) of each batch

    @property
    def end(self) -> int:
        return self.base + self.count

    @property
    def shared(self) -> bool:
        """Whether its batches are still in a flush object shared by partitions
        (``wal/``, :meth:`Layout.wal`), not yet compacted into one of their own."""
        return self.obj.startswith(WAL)

    def batches(self) -> list[tuple[int, int, int, int]]:
        """(base offset, records, first byte, byte past the end) of each stored batch
        the entry holds: one, or a compacted entry's several back to back."""
        if not self.parts:
            return [(self.base, self.count, self.start, self.stop)]
        out, base, at = [], self.base, self.start
        for count, size in self.parts:
            out.append((base, count, at, at + size))
            base, at = base + count, at + size
        return out

    def encode(self) -> bytes:
        fields: list[Any] = [self.obj, self.start, self.stop, self.count, self.min_ts, self.max_ts]
        if self.parts:
            fields.append([list(p) for p in self.parts])
        return json.dumps(fields).encode()

    @staticmethod
    def decode(base: int, value: bytes) -> Entry:
        obj, start, stop, count, min_ts, max_ts, *rest = json.loads(value)
        parts = tuple((int(n), int(b)) for n, b in rest[0]) if rest else ()
        return Entry(base, count, obj, start, stop, min_ts, max_ts, parts)


def compaction_runs(
    entries: Sequence[Entry],
    *,
    min_run: int = 8,
    max_bytes: int = 64 * 1024 * 1024,
    max_entries: int = MAX_TXN_OPS,
) -> list[list[Entry]]:
    """Runs of consecutive entries still in shared flush objects (``wal/``) to rewrite
    into one object of their partition each: at least ``min_run`` entries, at most
    ``max_bytes`` (an entry bigger than that alone is left as it is) and
    ``max_entries`` (one transaction checks and replaces them all)."""
    runs: list[list[Entry]] = []
    run: list[Entry] = []
    size = 0
    for entry in entries:
        shared = entry.shared
        full = len(run) >= max_entries or size + entry.stop - entry.start > max_bytes
        if not shared or (run and full):
            if len(run) >= min_run:
                runs.append(run)
            run, size = [], 0
            if not shared:
                continue
        run.append(entry)
        size += entry.stop - entry.start
    if len(run) >= min_run:
        runs.append(run)
    return runs


def merged(run: Sequence[Entry], obj: str) -> Entry:
    """The one entry that replaces ``run`` once its batches are ``obj``, back to back."""
    parts = tuple((n, stop - start) for e in run for _, n, start, stop in e.batches())
    return Entry(
        run[0].base,
        sum(e.count for e in run),
        obj,
        0,
        sum(size for _, size in parts),
        min(e.min_ts for e in run),
        max(e.max_ts for e in run),
        parts,
    )


Seen = Mapping[tuple[str, int, str], Mapping[int, int]]  # (topic, partition, producer) → seq → base
REMEMBERED = 64  # sequences remembered per producer and partition (a client's retries)


def place(
    pending: Sequence[Pending],
    ends: Mapping[tuple[str, int], int],
    obj: str,
    seen: Seen | None = None,
) -> list[tuple[Entry | None, int]]:
    """Where each pending batch goes, as (entry, base offset), in the order given: its
    byte range in the flush's object (back to back) and its base offset (each
    partition's batches in order, from that partition's current end). A batch whose
    (producer, sequence) ``seen`` already records for its partition — or that an earlier
    batch of this flush carries — is a client's retry: no entry, and the base it got
    the first time."""
    seen = seen or {}
    next_offset = dict(ends)
    firsts: dict[tuple[str, int, str, int], int] = {}
    placed: list[tuple[Entry | None, int]] = []
    at = 0
    for p in pending:
        stop = at + len(p.body)
        tp = (p.topic, p.partition)
        if p.producer is not None:
            retry = seen.get((*tp, p.producer), {}).get(p.sequence)
            if retry is None:
                retry = firsts.get((*tp, p.producer, p.sequence))
            if retry is not None:
                placed.append((None, retry))
                at = stop
                continue
        base = next_offset[tp]
        next_offset[tp] = base + p.count
        if p.producer is not None:
            firsts[(*tp, p.producer, p.sequence)] = base
        placed.append((Entry(base, p.count, obj, at, stop, p.min_ts, p.max_ts), base))
        at = stop
    return placed


def expired(
    entries: Sequence[Entry],
    held: int,
    now_ms: int,
    retention_ms: int | None,
    retention_bytes: int | None,
) -> list[Entry]:
    """The oldest entries of a partition (``entries``: from its first retained offset, in
    order; ``held``: the bytes it holds) that retention removes: while the oldest one's
    newest record is older than ``retention_ms`` or the partition holds more than
    ``retention_bytes``. Never one out of order: the first kept stops it."""
    gone: list[Entry] = []
    for entry in entries:
        too_old = retention_ms is not None and entry.max_ts < now_ms - retention_ms
        too_big = retention_bytes is not None and held > retention_bytes
        if not (too_old or too_big):
            break
        gone.append(entry)
        held -= entry.stop - entry.start
    return gone


def unreferenced(
    objects: Mapping[str, float], referenced: set[str], now_s: float, grace_s: float
) -> list[str]:
    """The objects (key → when written, seconds) no index entry names that are older
    than ``grace_s`` — so a flush still committing its object is never one of them."""
    return sorted(k for k, t in objects.items() if k not in referenced and now_s - t > grace_s)


PUBLISH_S = 5.0  # how often a process publishes what it wrote and read (its stats key)


def summarize(published: Sequence[Mapping[str, float]], now: float) -> dict[str, Any]:
    """What the processes of a diskless log did lately, from the intervals each published
    (``at``, ``interval_s``, ``objects``, ``bytes``, ``flush_ms``, ``hits``, ``misses``):
    objects written per second, bytes per object, a flush's mean time, the read cache's
    hit ratio (None when nothing was read), and how many processes reported. Intervals
    older than three publish periods are of processes gone quiet, and left out."""
    live = [p for p in published if now - p["at"] <= 3 * PUBLISH_S and p["interval_s"] > 0]
    objects = sum(p["objects"] for p in live)
    reads = sum(p["hits"] + p["misses"] for p in live)
    return {
        "processes": len(live),
        "objects_per_s": sum(p["objects"] / p["interval_s"] for p in live),
        "bytes_per_object": sum(p["bytes"] for p in live) / objects if objects else None,
        "flush_ms": sum(p["flush_ms"] for p in live) / objects if objects else None,
        "cache_hit_ratio": sum(p["hits"] for p in live) / reads if reads else None,
    }


def backlog_of(entries: Iterable[Entry]) -> tuple[int, int]:
    """The compaction backlog of some index entries: how many batches, and bytes, are
    still in shared flush objects (``wal/``) rather than in objects of their own."""
    batches = size = 0
    for e in entries:
        if e.shared:
            batches += len(e.batches())
            size += e.stop - e.start
    return batches, size


def remembered(known: Mapping[int, int], new: Mapping[int, int]) -> dict[int, int]:
    """A producer's sequence → base record after a flush: the newest
    :data:`REMEMBERED` sequences of both."""
    merged = {**known, **new}
    return {q: merged[q] for q in sorted(merged)[-REMEMBERED:]}


def writer_record(flush: int, bases: Sequence[int], at: float) -> str:
    """A writer key's value: the last flush the writer committed, its batches' base
    offsets, and when (so :func:`stale_writer` can tell a writer long gone)."""
    return json.dumps({"flush": flush, "bases": list(bases), "at": at})


def stale_writer(value: bytes, now: float, grace_s: float) -> bool:
    """Whether a process's writer key or stats key is garbage: what it last said (its
    ``at``) is ``grace_s`` old (only its own writer reads the writer key, right after a
    flush commits; stats are summed over the last seconds). A value without a time
    (``[flush, bases]``, as earlier riverbeds wrote writer keys) counts as stale: its
    writer, if still running, puts the key again with its next flush."""
    record = json.loads(value)
    return not isinstance(record, dict) or now - float(record["at"]) > grace_s


def fitting(pending: Sequence[Pending], limit: int = MAX_TXN_OPS) -> int:
    """How many of ``pending`` (a prefix, at least one) one flush commits within
    ``limit`` operations: an index entry per batch, an end per partition, a record per
    producer and partition, and the writer's key."""
    ends: set[tuple[str, int]] = set()
    producers: set[tuple[str, int, str]] = set()
    for n, p in enumerate(pending):
        ends.add((p.topic, p.partition))
        if p.producer is not None:
            producers.add((p.topic, p.partition, p.producer))
        if n + 1 + len(ends) + len(producers) + 1 > limit:
            return max(1, n)
    return len(pending)


def covering(entries: Sequence[Entry], start: int, end: int) -> list[Entry]:
    """The entries (sorted by base, as an index page lists them) holding any of the
    offsets [start, end), in order."""
    if start >= end:
        return []
    return [e for e in entries if e.base < end and e.end > start]


# -- where things are ---------------------------------------------------------------


class Layout:
    """The one owner of the diskless log's names: control-plane keys under a namespace
    derived from the bucket location, and object keys in the bucket."""

    def __init__(self, location: str) -> None:
        digest = hashlib.sha256(location.encode()).hexdigest()[:16]
        self.ns = f"riverbed/log/{digest}/"

    def topic(self, name: str) -> str:
        return f"{self.ns}topics/{name}"

    @property
    def topics(self) -> str:
        return f"{self.ns}topics/"

    def end(self, topic: str, partition: int) -> str:
        return f"{self.ns}end/{topic}/{partition}"

    @property
    def index(self) -> str:
        return f"{self.ns}index/"

    def page(self, topic: str, partition: int, page: int) -> str:
        return f"{self.index}{topic}/{partition}/{page:010d}/"

    def entry(self, topic: str, partition: int, base: int) -> str:
        return f"{self.page(topic, partition, base >> PAGE_BITS)}{base:020d}"

    def producer(self, topic: str, partition: int, producer: str) -> str:
        return f"{self.ns}producers/{topic}/{partition}/{producer}"

    def stats(self, writer: str = "") -> str:
        return f"{self.ns}stats/{writer}"

    @property
    def backlog(self) -> str:
        return f"{self.ns}backlog"

    def writer(self, writer: str) -> str:
        return f"{self.ns}writers/{writer}"

    @staticmethod
    def wal(writer: str, flush: int) -> str:
        return f"{WAL}{int(time.time() * 1000):013d}-{writer}-{flush:08d}"

    @staticmethod
    def seg(topic: str, partition: int, base: int) -> str:
        return f"{SEG}{topic}/{partition}/{base:020d}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Head:
    """A partition's first retained offset, next offset, and bytes held."""

    start: int = 0
    end: int = 0
    held: int = 0  # bytes

    def encode(self) -> bytes:
        return json.dumps([self.start, self.end, self.held]).encode()

    @staticmethod
    def decode(value: bytes) -> Head:
        start, end, size = json.loads(value)
        return Head(start, end, size)


# -- the storage --------------------------------------------------------------------


class _Cache:
    """Byte ranges of objects: in memory, then (given a directory) on local disk, the
    least recently used dropped first from each. Objects never change once written, so
    nothing cached is ever stale; a disk copy is written whole, then renamed, so
    processes sharing the directory never read a part."""

    def __init__(self, limit: int, disk: Path | None = None, disk_limit: int = 0) -> None:
        self.limit = limit
        self._data: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = 0
        self.disk, self.disk_limit = disk, disk_limit
        self._files: OrderedDict[str, int] = OrderedDict()  # name → bytes, oldest first
        self._disk_size = 0
        if disk is not None:
            disk.mkdir(parents=True, exist_ok=True)
            found = sorted(
                (f.stat().st_mtime, f.name, f.stat().st_size)
                for f in disk.iterdir()
                if f.is_file() and not f.name.startswith(".")
            )
            for _, name, size in found:
                self._files[name] = size
                self._disk_size += size

    def get(self, store: ObjectStore, obj: str, start: int, stop: int) -> bytes:
        key = (obj, start, stop)
        with self._lock:
            data = self._data.get(key)
            if data is not None:
                self._data.move_to_end(key)
                self.hits += 1
                return data
        data = self._from_disk(key)
        if data is None:
            with self._lock:
                self.misses += 1
            data = store.get_range(obj, start, stop)
            self._to_disk(key, data)
        else:
            with self._lock:
                self.disk_hits += 1
                self.hits += 1
        with self._lock:
            if key not in self._data:
                self._data[key] = data
                self._size += len(data)
            while self._size > self.limit and self._data:
                _, dropped = self._data.popitem(last=False)
                self._size -= len(dropped)
        return data

    @staticmethod
    def _name(key: tuple[str, int, int]) -> str:
        return hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    def _from_disk(self, key: tuple[str, int, int]) -> bytes | None:
        if self.disk is None:
            return None
        name = self._name(key)
        try:
            data = (self.disk / name).read_bytes()
        except OSError:  # not cached, or dropped by another process
            return None
        with self._lock:
            if name in self._files:
                self._files.move_to_end(name)
        return data

    def _to_disk(self, key: tuple[str, int, int], data: bytes) -> None:
        if self.disk is None or len(data) > self.disk_limit:
            return
        name = self._name(key)
        tmp = self.disk / f".{name}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.write_bytes(data)
            tmp.replace(self.disk / name)
        except OSError:  # a full or gone disk: the cache is only a cache
            tmp.unlink(missing_ok=True)
            return
        with self._lock:
            if name not in self._files:
                self._files[name] = len(data)
                self._disk_size += len(data)
            doomed = []
            while self._disk_size > self.disk_limit and self._files:
                old, size = self._files.popitem(last=False)
                self._disk_size -= size
                doomed.append(old)
        for old in doomed:
            (self.disk / old).unlink(missing_ok=True)


class DisklessLogStorage(LogStorage):
    """Topics in ``store`` (objects) and ``control`` (offsets, index): see the module
    doc. Every process that opens the same store with the same control plane sees the
    same topics and offsets."""

    waits = True
    idempotent = True
    columnar = True  # append_columns encodes the columns as given

    def __init__(
        self,
        store: ObjectStore,
        control: ControlPlane,
        *,
        flush_ms: float = FLUSH_MS,
        flush_bytes: int = FLUSH_BYTES,
        cache_bytes: int = CACHE_BYTES,
        cache_dir: Path | None = None,
        disk_cache_bytes: int = DISK_CACHE_BYTES,
        close_control: bool = False,
    ) -> None:
        if not 1 <= flush_ms <= 10_000:
            raise LogValueError(f"flush_ms must be between 1 and 10000, not {flush_ms}")
        self.url = store.url
        self.store = store
        self.control = control
        self.layout = Layout(store.url)
        self.flush_ms = flush_ms
        self.flush_bytes = flush_bytes
        self._close_control = close_control
        self._writer = uuid.uuid4().hex[:12]
        self._flushes = itertools.count()
        self._pending: list[tuple[Pending, Future[int]]] = []
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._closed = False
        self._configs: dict[str, TopicConfig] = {}
        self._cache = _Cache(cache_bytes, cache_dir, disk_cache_bytes)
        self.stats = {"objects": 0, "bytes": 0, "flush_ms_total": 0.0, "conflicts": 0}
        self._published = (time.time(), dict(self.stats), 0, 0)

    # -- topics ------------------------------------------------------------------------

    def create_topic(self, config: TopicConfig) -> None:
        # a missing bucket or bad credentials: said now, not at the first append (a
        # LIST of an empty prefix: a HEAD's 404 does not tell a missing bucket apart)
        self.store.list(f"topics/{config.name}/")
        key = self.layout.topic(config.name)
        puts = [Put.of(key, json.dumps(config.to_dict()))]
        puts += [
            Put.of(self.layout.end(config.name, p), Head().encode())
            for p in range(config.partitions)
        ]
        if not self.control.txn([Compare.version(key) == 0], puts).succeeded:
            raise TopicExistsError(f"topic '{config.name}' already exists")
        self._configs[config.name] = config

    def topic_config(self, name: str) -> TopicConfig:
        kv = self.control.get(self.layout.topic(name))
        if kv is None:
            raise TopicNotFoundError(name)
        config = TopicConfig.from_dict(json.loads(kv.value))
        self._configs[name] = config
        return config

    def _config(self, name: str, partition: int | None = None) -> TopicConfig:
        """The topic's configuration, from this process's copy unless it is missing or
        does not know ``partition`` (another process may have added partitions)."""
        config = self._configs.get(name)
        if config is None or (partition is not None and partition >= config.partitions):
            config = self.topic_config(name)
        if partition is not None and not 0 <= partition < config.partitions:
            raise LogValueError(
                f"topic '{name}' has partitions 0..{config.partitions - 1}, not {partition}"
            )
        return config

    def list_topics(self) -> list[str]:
        prefix = self.layout.topics
        return sorted(kv.key.decode()[len(prefix) :] for kv in self.control.get_prefix(prefix))

    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        key = self.layout.topic(name)
        while True:
            kv = self.control.get(key)
            if kv is None:
                raise TopicNotFoundError(name)
            config = TopicConfig.from_dict(json.loads(kv.value))
            config.check_growth(partitions)  # refuse before reading
            if partitions == config.partitions:
                return config
            # the ends where the new placement begins: no flush may commit between
            # reading them and this transaction (it moves an end key: a conflict)
            compares = [Compare.mod(key) == kv.mod_revision]
            ends = []
            for p in range(config.partitions):
                end = self.control.get(self.layout.end(name, p))
                if end is None:
                    raise CorruptLogError(f"topic '{name}' has no end key for partition {p}")
                ends.append(Head.decode(end.value).end)
                compares.append(Compare.mod(self.layout.end(name, p)) == end.mod_revision)
            grown = config.grown(partitions, ends)
            puts = [Put.of(key, json.dumps(grown.to_dict()))]
            puts += [
                Put.of(self.layout.end(name, p), Head().encode())
                for p in range(config.partitions, partitions)
            ]
            if self.control.txn(compares, puts).succeeded:
                self._configs[name] = grown
                return grown

    # -- writes ------------------------------------------------------------------------

    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        return self.append_parts(topic, [(partition, records, typed)])[0]

    def append_parts(
        self, topic: str, parts: Sequence[tuple[int, Sequence[RawRecord], Any]]
    ) -> list[int]:
        """Every part waits for the same flush: one object, one transaction."""
        return [f.result() for f in self.append_parts_async(topic, parts)]

    def append_parts_async(
        self, topic: str, parts: Sequence[tuple[int, Sequence[RawRecord], Any]]
    ) -> list[Future[int]]:
        """Queue every part for the next flush; futures of their base offsets."""
        waiting = []
        for partition, records, typed in parts:
            if not records:
                raise LogValueError("cannot append an empty batch")
            config = self._config(topic, partition)
            encoded = encode_body(records, typed_values(topic, config, records, typed))
            stamps = [r.timestamp_ms for r in records]
            waiting.append((topic, partition, encoded, min(stamps), max(stamps)))
        return [self._enqueue(*w) for w in waiting]

    def append_columns(self, topic: str, partition: int, batch: ColumnBatch) -> int:
        return self._append_batch(topic, partition, batch, None, 0).result()

    def append_columns_parts(
        self, topic: str, parts: Sequence[tuple[int, ColumnBatch]]
    ) -> list[int]:
        """Every part waits for the same flush: one object, one transaction."""
        waiting = [self._append_batch(topic, p, batch, None, 0) for p, batch in parts]
        return [f.result() for f in waiting]

    def _append_batch(
        self,
        topic: str,
        partition: int,
        batch: ColumnBatch,
        producer: str | None,
        sequence: int,
    ) -> Future[int]:
        """A batch given as columns, checked, queued for the next flush: a future of its
        base offset."""
        if not len(batch):
            raise LogValueError("cannot append an empty batch")
        config = self._config(topic, partition)
        check_column_values(config, batch.values)
        stamps = batch.timestamps_ms
        encoded = encode_columns(batch)
        lo, hi = int(stamps.min()), int(stamps.max())
        return self._enqueue(topic, partition, encoded, lo, hi, producer, sequence)

    def append_once(
        self, topic: str, partition: int, batch: ColumnBatch, producer: str, sequence: int
    ) -> int:
        if not producer or len(producer) > 64 or "/" in producer:
            raise LogValueError(f"a producer id is 1-64 characters without '/', not {producer!r}")
        return self._append_batch(topic, partition, batch, producer, sequence).result()

    def _enqueue(
        self,
        topic: str,
        partition: int,
        encoded: EncodedBatch,
        lo: int,
        hi: int,
        producer: str | None = None,
        sequence: int = 0,
    ) -> Future[int]:
        """Queue a batch for the next flush; its future gets the batch's base offset."""
        pending = Pending(topic, partition, encoded.count, encoded.body, lo, hi, producer, sequence)
        done: Future[int] = Future()
        with self._cond:
            if self._closed:
                raise LogError(f"the log at {self.url} is closed")
            self._pending.append((pending, done))
            self._pending_bytes += len(pending.body)
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="riverbed-diskless-flush", daemon=True
                )
                self._flusher.start()
            self._cond.notify_all()
        return done

    def _flush_loop(self) -> None:
        leftover = False
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return  # closed, nothing left
                # the interval counts from the first waiting append (what the last flush
                # could not take goes at once)
                if not leftover:
                    self._cond.wait_for(
                        lambda: self._closed or self._pending_bytes >= self.flush_bytes,
                        timeout=self.flush_ms / 1000,
                    )
                take = fitting([q for q, _ in self._pending])
                batch, self._pending = self._pending[:take], self._pending[take:]
                self._pending_bytes -= sum(len(q.body) for q, _ in batch)
                leftover = bool(self._pending)
            try:
                bases = self._flush([p for p, _ in batch])
            except Exception as exc:  # every waiting append learns why
                for _, done in batch:
                    done.set_exception(exc)
            else:
                for (_, done), base in zip(batch, bases, strict=True):
                    done.set_result(base)

    def _flush(self, pending: list[Pending]) -> list[int]:
        """Write one object for ``pending``, then commit their offsets; their bases."""
        began = time.monotonic()
        flush = next(self._flushes)
        obj = self.layout.wal(self._writer, flush)
        self.store.put(obj, b"".join(p.body for p in pending))
        writer_key = self.layout.writer(self._writer)
        partitions = sorted({(p.topic, p.partition) for p in pending})
        producers = sorted({(p.topic, p.partition, p.producer) for p in pending if p.producer})
        unknown = 0  # attempts whose outcome the control plane could not tell
        for _ in range(COMMIT_ATTEMPTS):
            heads: dict[tuple[str, int], Head] = {}
            compares = []
            for tp in partitions:
                key = self.layout.end(*tp)
                kv = self.control.get(key)
                if kv is None:
                    raise TopicNotFoundError(tp[0])
                heads[tp] = Head.decode(kv.value)
                compares.append(Compare.mod(key) == kv.mod_revision)
            seen: dict[tuple[str, int, str], dict[int, int]] = {}
            for t, part, producer in producers:
                key = self.layout.producer(t, part, producer)
                kv = self.control.get(key)
                record = {} if kv is None else json.loads(kv.value)
                seen[(t, part, producer)] = {int(q): int(b) for q, b in record.items()}
                compares.append(Compare.mod(key) == (0 if kv is None else kv.mod_revision))
            placed = place(pending, {tp: h.end for tp, h in heads.items()}, obj, seen)
            grown = dict(heads)
            puts = []
            new: dict[tuple[str, int, str], dict[int, int]] = {}
            for p, (entry, _) in zip(pending, placed, strict=True):
                if entry is None:
                    continue  # a retry of a batch committed before
                h = grown[(p.topic, p.partition)]
                grown[(p.topic, p.partition)] = Head(
                    h.start, entry.end, h.held + entry.stop - entry.start
                )
                puts.append(
                    Put.of(self.layout.entry(p.topic, p.partition, entry.base), entry.encode())
                )
                if p.producer is not None:
                    new.setdefault((p.topic, p.partition, p.producer), {})[p.sequence] = entry.base
            bases = [base for _, base in placed]
            puts += [Put.of(self.layout.end(*tp), h.encode()) for tp, h in grown.items()]
            for (t, part, producer), fresh in new.items():
                record = remembered(seen[(t, part, producer)], fresh)
                puts.append(Put.of(self.layout.producer(t, part, producer), json.dumps(record)))
            puts.append(Put.of(writer_key, writer_record(flush, bases, time.time())))
            try:
                result = self.control.txn(compares, puts)
            except Exception as exc:
                if (recorded := self._committed(writer_key, flush)) is not None:
                    bases = recorded  # the answer was lost, the commit was not
                    break
                if isinstance(exc, OutcomeUnknownError) and unknown < UNKNOWN_ATTEMPTS:
                    unknown += 1  # a member failed while handling it (its host lost):
                    continue  # the client asks another one next
                raise DisklessCommitError(
                    f"could not commit a flush of {len(pending)} batches to the control "
                    f"plane at {self.control.url}: {exc}; nothing of it was acknowledged"
                ) from exc
            if result.succeeded:
                break
            # An attempt lost with its member may still land (raft had it): then this
            # one's compares failed because it moved each partition's end, and the flush
            # is committed already — with that attempt's offsets.
            if unknown and (recorded := self._committed(writer_key, flush)) is not None:
                bases = recorded
                break
            self.stats["conflicts"] += 1
        else:
            raise DisklessCommitError(
                f"a flush lost {COMMIT_ATTEMPTS} races for its partitions' offsets; "
                "nothing of it was acknowledged"
            )
        self.stats["objects"] += 1
        self.stats["bytes"] += sum(len(p.body) for p in pending)
        self.stats["flush_ms_total"] += (time.monotonic() - began) * 1000
        self._publish()
        return bases

    def _publish(self, force: bool = False) -> None:
        """Put what this process wrote and read since it last did under its stats key
        (every :data:`PUBLISH_S` at most), for consoles and ``/metrics``
        (:meth:`object_stats`). Best effort: a control plane that is down costs nothing."""
        now = time.time()
        at, before, hits, misses = self._published
        if not force and now - at < PUBLISH_S:
            return
        self._published = (now, dict(self.stats), self._cache.hits, self._cache.misses)
        interval = {
            "at": now,
            "interval_s": now - at,
            "objects": self.stats["objects"] - before["objects"],
            "bytes": self.stats["bytes"] - before["bytes"],
            "flush_ms": self.stats["flush_ms_total"] - before["flush_ms_total"],
            "hits": self._cache.hits - hits,
            "misses": self._cache.misses - misses,
        }
        if not any(interval[k] for k in ("objects", "hits", "misses")):
            return  # nothing to say
        try:
            self.control.put(self.layout.stats(self._writer), json.dumps(interval))
        except Exception:
            self._published = (at, before, hits, misses)  # said next time

    def object_stats(self) -> dict[str, Any] | None:
        """What every process of this log wrote and read lately (:func:`summarize`)."""
        published = [json.loads(kv.value) for kv in self.control.get_prefix(self.layout.stats())]
        out = summarize(published, time.time())
        kv = self.control.get(self.layout.backlog)
        out["compaction_backlog"] = json.loads(kv.value) if kv is not None else None
        return out

    def measure_backlog(self, topics: Iterable[str]) -> dict[str, Any]:
        """The compaction backlog of ``topics`` now (:func:`backlog_of` over every
        partition's index), recorded for consoles and ``/metrics``; the log servers'
        maintenance measures it after each compaction pass, so a backlog that grows from
        one pass to the next means compaction is falling behind (or failing)."""
        per_topic: dict[str, int] = {}
        batches = size = 0
        for topic in topics:
            for partition in range(self._config(topic).partitions):
                n, b = backlog_of(e for e, _ in self._index(topic, partition))
                per_topic[topic] = per_topic.get(topic, 0) + n
                batches, size = batches + n, size + b
        measured = {"at": time.time(), "batches": batches, "bytes": size, "topics": per_topic}
        self.control.put(self.layout.backlog, json.dumps(measured))
        return measured

    def _committed(self, writer_key: str, flush: int) -> list[int] | None:
        """The bases the writer key says flush ``flush`` committed, if it did."""
        try:
            kv = self.control.get(writer_key)
        except Exception:
            return None
        if kv is None:
            return None
        record = json.loads(kv.value)
        return list(record["bases"]) if record["flush"] == flush else None

    # -- reads -------------------------------------------------------------------------

    def _head(self, topic: str, partition: int) -> Head:
        self._config(topic, partition)
        kv = self.control.get(self.layout.end(topic, partition))
        if kv is None:
            raise TopicNotFoundError(topic)
        return Head.decode(kv.value)

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        head = self._head(topic, partition)
        return head.start, head.end

    def size(self, topic: str, partition: int) -> int:
        return self._head(topic, partition).held

    def _page_revisions(self, topic: str, partition: int, page: int) -> list[tuple[Entry, int]]:
        """One index page's entries, sorted by base, with their keys' mod revisions."""
        prefix = self.layout.page(topic, partition, page)
        found = [
            (Entry.decode(int(kv.key.decode()[len(prefix) :]), kv.value), kv.mod_revision)
            for kv in self.control.get_prefix(prefix)
        ]
        return sorted(found, key=lambda em: em[0].base)

    def _page(self, topic: str, partition: int, page: int) -> list[Entry]:
        return [e for e, _ in self._page_revisions(topic, partition, page)]

    def _entries(
        self, topic: str, partition: int, start: int, end: int, floor: int = 0
    ) -> Iterator[Entry]:
        """Index entries holding offsets [start, end), in order, pages read as needed;
        ``floor`` is the partition's first retained offset (no entry begins before it
        that a read needs)."""
        if start >= end:
            return
        page = start >> PAGE_BITS
        entries = self._page(topic, partition, page)
        earlier = page - 1
        # the batch holding ``start`` may begin on an earlier page
        while (not entries or entries[0].base > start) and earlier >= floor >> PAGE_BITS:
            found = self._page(topic, partition, earlier)
            if found:
                entries = found[-1:] + entries
            earlier = -1 if found else earlier - 1
        at = start
        while True:
            for entry in covering(entries, at, end):
                yield entry
                at = entry.end
            if at >= end:
                return
            if at >> PAGE_BITS <= page:  # the entry for ``at`` should have been there
                raise CorruptLogError(
                    f"the index of {topic}/{partition} has no entry for offset {at} "
                    f"(in the control plane at {self.control.url}); was it edited by hand?"
                )
            page = at >> PAGE_BITS
            entries = self._page(topic, partition, page)

    def _batches(
        self, topic: str, partition: int, start: int, end: int, floor: int
    ) -> Iterator[StoredBatch]:
        for entry in self._entries(topic, partition, start, end, floor):
            try:
                data = self._cache.get(self.store, entry.obj, entry.start, entry.stop)
            except ObjectNotFoundError:
                raise OffsetOutOfRangeError(
                    f"offsets {entry.base}..{entry.end - 1} of {topic}/{partition} are gone "
                    "from the bucket (removed by retention while being read); read from "
                    "the partition's first retained offset"
                ) from None
            view = memoryview(data)
            for base, count, lo, hi in entry.batches():
                if base < end and base + count > start:
                    yield StoredBatch(base, count, view[lo - entry.start : hi - entry.start])
        self._publish()

    def _range(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        head = self._head(topic, partition)
        if offset < head.start:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{partition} was removed by retention "
                f"(first retained: {head.start})"
            )
        return head.start, head.end

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        first, end = self._range(topic, partition, offset)
        end = min(end, offset + max_records)
        if offset >= end:
            return []
        batches = self._batches(topic, partition, offset, end, first)
        decoded = ((b.base_offset, b.decode()) for b in batches)
        return rows_from(decoded, offset, max_records)

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        first, last = self._range(topic, partition, start)
        end = min(end, last)
        if start >= end:
            return Columns.concat(start, [])
        batches = self._batches(topic, partition, start, end, first)
        decoded = ((b.base_offset, b.decode()) for b in batches)
        return columns_from(decoded, start, end)

    def read_stored(
        self, topic: str, partition: int, start: int, end: int, max_bytes: int
    ) -> Iterator[StoredBatch]:
        first, last = self._range(topic, partition, start)
        size = 0
        for batch in self._batches(topic, partition, start, min(end, last), first):
            if size and size + len(batch.body) > max_bytes:
                return
            yield batch
            size += len(batch.body)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """Exact, reading only the batches whose time range reaches ``timestamp_ms``."""
        start, end = self.offsets(topic, partition)
        for entry in self._entries(topic, partition, start, end, start):
            if entry.max_ts < timestamp_ms:
                continue
            columns = self.read_columns(topic, partition, max(entry.base, start), entry.end)
            hits = np.flatnonzero(columns.timestamps_ms >= timestamp_ms)
            if len(hits):
                return int(columns.offsets[hits[0]])
        return end

    def wait(self, positions: Mapping[tuple[str, int], int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if any(self.offsets(t, p)[1] > o for (t, p), o in positions.items()):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, 0.02))

    def enforce_retention(self, topic: str) -> int:
        """Drop each partition's oldest batches beyond the topic's ``retention_ms`` (by
        their newest record's timestamp) or ``retention_bytes``: their index entries go
        and the partition's first offset moves past them, in one transaction per
        partition (a concurrent append or retention retries). Their objects are deleted
        by :meth:`collect_garbage` once no partition refers to them. Returns how many
        batches were dropped."""
        config = self.topic_config(topic)  # as it is now, not as this process first saw it
        if config.retention_ms is None and config.retention_bytes is None:
            return 0
        dropped = 0
        for partition in range(config.partitions):
            key = self.layout.end(topic, partition)
            while True:
                kv = self.control.get(key)
                if kv is None:
                    raise TopicNotFoundError(topic)
                head = Head.decode(kv.value)
                entries = self._entries(topic, partition, head.start, head.end, head.start)
                gone = expired(
                    list(entries), head.held, int(time.time() * 1000),
                    config.retention_ms, config.retention_bytes,
                )[: MAX_TXN_OPS - 1]  # fmt: skip
                if not gone:
                    break
                start = gone[-1].end
                held = head.held - sum(e.stop - e.start for e in gone)
                ops: list[Put | Delete] = [Put.of(key, Head(start, head.end, held).encode())]
                ops += [Delete.of(self.layout.entry(topic, partition, e.base)) for e in gone]
                if self.control.txn([Compare.mod(key) == kv.mod_revision], ops).succeeded:
                    dropped += len(gone)  # and on: at most MAX_TXN_OPS entries a round
        return dropped

    def _index(self, topic: str, partition: int) -> list[tuple[Entry, int]]:
        """Every index entry of a partition from its first retained offset, in order,
        with its key's mod revision (what a compaction's transaction checks)."""
        head = self._head(topic, partition)
        return [
            (entry, mod)
            for page in range(head.start >> PAGE_BITS, (head.end >> PAGE_BITS) + 1)
            for entry, mod in self._page_revisions(topic, partition, page)
            if entry.end > head.start
        ]

    def compaction_plan(
        self, topic: str, partition: int, min_run: int = 8
    ) -> list[list[tuple[Entry, int]]]:
        """The runs :meth:`compact` would rewrite now, with their keys' revisions."""
        index = self._index(topic, partition)
        revision = {e.base: mod for e, mod in index}
        runs = compaction_runs([e for e, _ in index], min_run=min_run)
        return [[(e, revision[e.base]) for e in run] for run in runs]

    def rewrite(self, topic: str, partition: int, run: Sequence[tuple[Entry, int]]) -> bool:
        """Write ``run``'s batches as one object of the partition and make it current in
        one transaction — only if none of its entries changed since they were read (the
        fence: a compactor that stalled and resumes after another one, or after
        retention, changes nothing). The old objects are left to
        :meth:`collect_garbage`, so readers that looked them up before still find them.
        Whether it became current."""
        entries = [e for e, _ in run]
        data = b"".join(self._cache.get(self.store, e.obj, e.start, e.stop) for e in entries)
        obj = self.layout.seg(topic, partition, entries[0].base)
        self.store.put(obj, data)
        new = merged(entries, obj)
        compares = [
            Compare.mod(self.layout.entry(topic, partition, e.base)) == mod for e, mod in run
        ]
        ops: list[Put | Delete] = [
            Put.of(self.layout.entry(topic, partition, new.base), new.encode())
        ]
        ops += [Delete.of(self.layout.entry(topic, partition, e.base)) for e in entries[1:]]
        if self.control.txn(compares, ops).succeeded:
            return True
        self.store.delete(obj)  # no entry names it: nobody can be reading it
        return False

    def compact(self, topic: str, min_run: int = 8) -> int:
        """Rewrite each partition's runs of batches in shared flush objects into objects
        of their own (fewer index entries, and the flush objects can go once nothing
        else is in them); returns how many batches moved."""
        moved = 0
        for partition in range(self._config(topic).partitions):
            for run in self.compaction_plan(topic, partition, min_run):
                if self.rewrite(topic, partition, run):
                    moved += len(run)
        return moved

    def collect_garbage(self, grace_s: float = 3600.0) -> int:
        """Delete the objects no index entry refers to any more (every batch in them was
        dropped by retention or compacted into another object, or a writer died between
        its PUT and its commit), once they
        are ``grace_s`` old; returns how many. Safe beside writers, readers and other
        collectors: an object is only ever unreferenced for good."""
        now = time.time()
        for prefix in (self.layout.stats(), self.layout.writer("")):  # processes long gone
            for kv in self.control.get_prefix(prefix):
                if stale_writer(kv.value, now, grace_s):
                    self.control.delete(kv.key)
        objects = {o.key: o.modified for where in (WAL, SEG) for o in self.store.list(where)}
        if not objects:
            return 0
        referenced = {json.loads(kv.value)[0] for kv in self.control.get_prefix(self.layout.index)}
        doomed = unreferenced(objects, referenced, time.time(), grace_s)
        self.store.delete_many(doomed)
        return len(doomed)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join(30)
        self._publish(force=True)  # what this process did since it last said
        if self._flusher is None or not self._flusher.is_alive():
            # No flush of this process asks its writer key again; a control plane
            # that is down now leaves it to collect_garbage.
            with contextlib.suppress(Exception):
                self.control.delete(self.layout.writer(self._writer))
        if self._close_control:
            self.control.close()


__all__ = [
    "FLUSH_MS",
    "DisklessCommitError",
    "DisklessLogStorage",
    "Entry",
    "Layout",
    "Pending",
    "backlog_of",
    "covering",
    "place",
]
