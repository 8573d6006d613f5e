"""``file:///path``: topics as directories of append-only segment files.

(Over 600 lines: the append and read protocol of one storage, kept with its layout and
its recovery below; reading one directory of segment files is ``segments.py``.)

Layout::

    <root>/<topic>/topic.json                          the topic's configuration
    <root>/<topic>/<partition>/<base:020d>.log         framed record batches (see records.py)
    <root>/<topic>/<partition>/<base:020d>.index       sparse index: (offset u64, position u64)
    <root>/<topic>/<partition>/.lock                   flock held while appending

Appends (many processes may append to one partition):

1. take the partition's ``flock`` (and a thread lock: flock is per open file);
2. catch up with appends other processes made since ours (stat + scan new frames);
   the first time, *recover*: a torn tail left by a crashed writer (a bad batch with
   nothing readable after it) is moved to ``<base>.torn-<byte>`` beside the segment and
   cut off, with a warning;
3. roll to a new segment if this one is full (and apply retention), write the frame
   with one ``write`` on an ``O_APPEND`` descriptor, add an index entry every
   ``INDEX_EVERY`` bytes, ``fsync`` per the topic's policy; release the lock.

Readers take no lock. A bad frame (short, or failing its CRC) with nothing readable
after it, at the end of the newest segment, is an append still being written (or a
crashed writer's torn tail): it does not exist yet. Any other bad frame is *damage*:
readable batches follow it (found by resynchronising on the next frame whose header,
offsets and CRC check out), or it is in a closed segment, or the segment's index
shows the partition had gone past it. Damage raises :class:`CorruptLogError` naming
the file, the byte and the offsets — unless an operator recorded a skip for exactly
those offsets (``riverbed topic skip``), which readers then step over. A skip never
hides a readable record: it is consulted only where a damaged batch stops a reader.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from riverbed.log import watch
from riverbed.log.base import (
    Damage,
    LogStorage,
    PartitionReport,
    SkippedRange,
    TopicConfig,
    check_column_values,
    check_topic_name,
    typed_values,
)
from riverbed.log.errors import (
    CorruptLogError,
    LogValueError,
    OffsetOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import (
    BATCH_HEAD_SIZE,
    BatchHeader,
    ColumnBatch,
    Columns,
    EncodedBatch,
    RawRecord,
    StoredBatch,
    columns_from,
    decode_batch,
    encode_body,
    encode_columns,
    read_header,
    rows_from,
    timestamps_of,
)
from riverbed.log.segments import (
    FIELDS_BASE,
    FIELDS_LENGTH,
    FRAME_HEADER,
    INDEX_ENTRY,
    INDEX_EVERY,
    Torn,
    Writer,
    list_segments,
    map_segment,
    read_index,
    refuse,
    scan_frames,
    seg_path,
)

log = logging.getLogger(__name__)


class FileLogStorage(LogStorage):
    columnar = True  # append_columns encodes the columns as given

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        root.mkdir(parents=True, exist_ok=True)
        self._writers: dict[tuple[str, int], Writer] = {}
        self._configs: dict[str, TopicConfig] = {}
        self._lock = threading.Lock()
        self._reported: set[tuple[str, int]] = set()
        # a waiting consumer is woken by the kernel when a segment is written (inotify),
        # where it can be; one watcher per waiting thread: each reads its own events
        self.waits = watch.available()
        self._watchers = threading.local()

    # -- topics -------------------------------------------------------------------------
    def _topic_dir(self, name: str) -> Path:
        check_topic_name(name)
        return self.root / name

    def create_topic(self, config: TopicConfig) -> None:
        directory = self._topic_dir(config.name)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".create-{config.name}-{uuid.uuid4().hex}"
        tmp.mkdir()
        (tmp / "topic.json").write_text(json.dumps(config.to_dict(), indent=2))
        for p in range(config.partitions):
            (tmp / str(p)).mkdir()
        try:
            os.rename(tmp, directory)  # atomic: the topic appears whole, once
        except OSError:
            for child in sorted(tmp.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            tmp.rmdir()
            raise TopicExistsError(f"topic '{config.name}' already exists") from None

    def topic_config(self, name: str) -> TopicConfig:
        path = self._topic_dir(name) / "topic.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TopicNotFoundError(name) from None
        except ValueError as exc:
            raise CorruptLogError(f"{path} is not valid JSON ({exc})") from exc
        config = TopicConfig.from_dict(data)
        self._configs[name] = config
        return config

    def list_topics(self) -> list[str]:
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and (p / "topic.json").exists()
        )

    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        directory = self._topic_dir(name)
        fd = os.open(directory / "topic.json", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            config = self.topic_config(name)
            config.check_growth(partitions)  # refuse before locking
            if partitions == config.partitions:
                return config
            with contextlib.ExitStack() as held:
                # every partition's append lock, in order (an append takes one): the
                # ends read here are where the new placement begins, exactly
                for p in range(config.partitions):
                    held.enter_context(self._locked(self._writer(name, p)))
                ends = [self.offsets(name, p)[1] for p in range(config.partitions)]
                for p in range(config.partitions, partitions):
                    (directory / str(p)).mkdir(exist_ok=True)
                return self._write_config(config.grown(partitions, ends))
        finally:
            os.close(fd)

    def _write_config(self, config: TopicConfig) -> TopicConfig:
        directory = self._topic_dir(config.name)
        tmp = directory / f".topic.json.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps(config.to_dict(), indent=2))
        os.replace(tmp, directory / "topic.json")
        self._configs[config.name] = config
        return config

    def skip(self, topic: str, partition: int, start: int, end: int, reason: str) -> TopicConfig:
        if not 0 <= start < end:
            raise LogValueError(f"a skipped range needs 0 <= start < end, got {start}..{end}")
        fd = os.open(self._topic_dir(topic) / "topic.json", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            config = self.topic_config(topic)
            if not 0 <= partition < config.partitions:
                raise LogValueError(
                    f"topic '{topic}' has partitions 0..{config.partitions - 1}, not {partition}"
                )
            added = SkippedRange(partition, start, end, reason)
            return self._write_config(replace(config, skipped=(*config.skipped, added)))
        finally:
            os.close(fd)

    # -- damage -------------------------------------------------------------------------
    def _skip_for(self, topic: str, partition: int, damage: Damage) -> SkippedRange | None:
        config = self.topic_config(topic)  # fresh: another process may have recorded it
        for skip in config.skipped:
            if skip.covers(partition, damage.start, damage.span_end):
                return skip
        return None

    def _noted(self, topic: str, partition: int, damage: Damage) -> None:
        key = (damage.path, damage.position)
        if key not in self._reported:
            self._reported.add(key)
            log.error("%s", refuse(topic, partition, damage))

    def _start_at(
        self,
        topic: str,
        path: Path,
        buf: memoryview,
        base: int,
        entry: tuple[int, int],
        strict: bool,
    ) -> tuple[int, int]:
        """Where to walk from for an index entry (offset, byte), checked: the entry when
        a batch of that offset starts there (or it is the end of the whole batches: an
        entry written just before an append that never came). A wrong entry raises
        (``strict``) or falls back to the segment's start with a warning."""
        o, p = entry
        if strict and p + FRAME_HEADER <= len(buf):
            # readers: a structural check only — the walk checks the batch's CRC when it
            # reads it, and damage before the entry does not concern a read after it
            length = FIELDS_LENGTH.unpack_from(buf, p)[0]
            if FIELDS_BASE.unpack_from(buf, p + 8)[0] == o and length >= FRAME_HEADER - 4:
                return p, o
        header = read_header(buf, p) if p < len(buf) else None
        if header is not None and header.base_offset == o:
            return p, o
        pos, at = 0, base
        while pos < p:
            h = read_header(buf, pos)
            if h is None or h.base_offset != at:
                return 0, base  # damage before the entry: walked (and reported) from 0
            pos, at = pos + h.size, h.next_offset
        if pos == p and at == o:
            return p, o  # the entry is right; what is at p is damaged or unwritten
        index = seg_path(path.parent, base, ".index")
        message = (
            f"{index}: its entry for offset {o} points at byte {p}, where no batch of that "
            "offset starts — the index is corrupt (the log itself may be whole). Rebuild "
            f"the indexes: `riverbed topic verify {topic} --rebuild-indexes`"
        )
        if strict:
            raise CorruptLogError(message)
        log.warning("%s; reading the segment from its start meanwhile", message)
        return 0, base

    def _walk_tail(
        self,
        topic: str,
        partition: int,
        path: Path,
        buf: memoryview,
        pos: int,
        at: int,
        index: Sequence[tuple[int, int]],
    ) -> tuple[int, int, bool]:
        """Walk the newest segment to its end: (byte after the last whole batch, next
        offset, whether a torn tail follows). Damage with readable batches after it is
        logged and stepped over (readers raise on it); a damaged tail is appended past
        from the end of a recorded skip, else :class:`CorruptLogError`."""
        for item in scan_frames(path, buf, pos, at, next_base=None, index=index):
            if isinstance(item, Torn):
                return item.position, at, True
            if isinstance(item, Damage):
                if item.end is not None and item.resume is not None:
                    self._noted(topic, partition, item)
                    pos, at = item.resume, item.end
                    continue
                skip = self._skip_for(topic, partition, item)
                if skip is None:
                    raise refuse(topic, partition, item)
                return len(buf), max(skip.end, at), False
            p, header = item
            pos, at = p + header.size, header.next_offset
        return pos, at, False

    def _config(self, topic: str) -> TopicConfig:
        config = self._configs.get(topic)
        return config if config is not None else self.topic_config(topic)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        config = self._config(topic)
        if not 0 <= partition < config.partitions:
            config = self.topic_config(topic)  # partitions may have been added meanwhile
            if not 0 <= partition < config.partitions:
                raise LogValueError(
                    f"topic '{topic}' has partitions 0..{config.partitions - 1}, not {partition}"
                )
        return self._topic_dir(topic) / str(partition)

    # -- appends ------------------------------------------------------------------------
    def _writer(self, topic: str, partition: int) -> Writer:
        key = (topic, partition)
        with self._lock:
            writer = self._writers.get(key)
            if writer is None:
                directory = self._partition_dir(topic, partition)
                directory.mkdir(exist_ok=True)
                lockfile = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
                writer = Writer(directory, lockfile, topic, partition)
                self._writers[key] = writer
            return writer

    @contextlib.contextmanager
    def _locked(self, writer: Writer) -> Iterator[None]:
        with writer.mutex:
            fcntl.flock(writer.lockfile, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(writer.lockfile, fcntl.LOCK_UN)

    def _sync_state(self, w: Writer) -> None:
        """Under the lock: catch up with other processes' appends (and recover once)."""
        segments = list_segments(w.directory)
        if not segments:
            self._open_segment(w, 0, 0)
            return
        last = segments[-1]
        path = seg_path(w.directory, last)
        size = os.stat(path).st_size
        if w.fd >= 0 and last == w.base and size == w.size:
            return
        index = read_index(w.directory, last)
        with map_segment(path) as buf:
            if w.fd >= 0 and last == w.base:
                pos, offset = w.size, w.next_offset
            elif index:
                pos, offset = self._start_at(w.topic, path, buf, last, index[-1], strict=False)
            else:
                pos, offset = 0, last
            end, next_offset, torn = self._walk_tail(
                w.topic, w.partition, path, buf, pos, offset, index
            )
            kept = bytes(buf[end:]) if torn else b""
        if torn:
            # We hold the lock, so no writer is mid-append: these bytes are a crashed
            # append's. Kept beside the segment, never silently dropped.
            aside = path.with_name(f"{path.stem}.torn-{end}")
            aside.write_bytes(kept)
            log.warning(
                "%s: %d bytes after offset %d are an unfinished batch (a writer crashed "
                "mid-append?); moved to %s — every whole batch before is kept",
                path,
                size - end,
                next_offset,
                aside,
            )
            os.truncate(path, end)
            self._trim_index(w.directory, last, end)
            size = end
        if w.fd >= 0:
            os.close(w.fd)
        w.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        w.base, w.size, w.next_offset = last, size, next_offset

    @staticmethod
    def _trim_index(directory: Path, base: int, size: int) -> None:
        entries = [e for e in read_index(directory, base) if e[1] < size]
        path = seg_path(directory, base, ".index")
        if path.exists():
            path.write_bytes(b"".join(INDEX_ENTRY.pack(*e) for e in entries))

    def _open_segment(self, w: Writer, base: int, next_offset: int) -> None:
        if w.fd >= 0:
            os.fsync(w.fd)
            os.close(w.fd)
        path = seg_path(w.directory, base)
        w.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        w.base, w.size, w.next_offset, w.since_index = base, 0, next_offset, 0

    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        if not records:
            raise LogValueError("cannot append an empty batch")
        config = self._config(topic)
        encoded = encode_body(records, typed_values(topic, config, records, typed))
        return self._write(topic, partition, config, encoded)

    def append_columns(self, topic: str, partition: int, batch: ColumnBatch) -> int:
        if not len(batch):
            raise LogValueError("cannot append an empty batch")
        config = self._config(topic)
        check_column_values(config, batch.values)
        return self._write(topic, partition, config, encode_columns(batch))

    def _write(self, topic: str, partition: int, config: TopicConfig, encoded: EncodedBatch) -> int:
        w = self._writer(topic, partition)
        with self._locked(w):
            self._sync_state(w)
            base = w.next_offset
            frame = encoded.frame(base)
            if w.size and w.size + len(frame) > config.segment_bytes:
                self._open_segment(w, base, base)
                self._retain(w.directory, config)
            if w.since_index >= INDEX_EVERY or w.size == 0:
                with open(seg_path(w.directory, w.base, ".index"), "ab") as index:
                    index.write(INDEX_ENTRY.pack(base, w.size))
                w.since_index = 0
            os.write(w.fd, frame)
            w.size += len(frame)
            w.since_index += len(frame)
            w.next_offset = base + encoded.count
            now = time.monotonic()
            if config.fsync == "batch" or (
                config.fsync == "interval"
                and (now - w.last_fsync) * 1000 >= config.fsync_interval_ms
            ):
                os.fsync(w.fd)
                w.last_fsync = now
            return base

    # -- retention ----------------------------------------------------------------------
    def _retain(self, directory: Path, config: TopicConfig) -> int:
        segments = list_segments(directory)
        removable = segments[:-1]  # never the active segment
        removed = 0
        now = time.time()
        sizes = {b: seg_path(directory, b).stat().st_size for b in segments}
        total = sum(sizes.values())
        for base in removable:
            path = seg_path(directory, base)
            too_big = config.retention_bytes is not None and total > config.retention_bytes
            too_old = (
                config.retention_ms is not None
                and (now - path.stat().st_mtime) * 1000 > config.retention_ms
            )
            if not (too_big or too_old):
                break
            path.unlink()
            seg_path(directory, base, ".index").unlink(missing_ok=True)
            total -= sizes[base]
            removed += 1
        return removed

    def enforce_retention(self, topic: str) -> int:
        config = self.topic_config(topic)
        removed = 0
        for p in range(config.partitions):
            w = self._writer(topic, p)
            with self._locked(w):
                removed += self._retain(w.directory, config)
        return removed

    # -- reads --------------------------------------------------------------------------
    def _batches(
        self, topic: str, partition: int, offset: int
    ) -> Iterator[tuple[int, ColumnBatch]]:
        """Whole batches holding ``offset`` and after, as (base offset, columns)."""
        for buf, pos, header in self._whole(topic, partition, offset):
            yield header.base_offset, decode_batch(buf, pos, header)

    def _whole(
        self, topic: str, partition: int, offset: int
    ) -> Iterator[tuple[memoryview, int, BatchHeader]]:
        """Whole batches holding ``offset`` and after, each as (its segment's bytes, its
        position there, its header), CRC checked; the bytes are only valid until the
        next one is asked for (the segment is unmapped after it)."""
        directory = self._partition_dir(topic, partition)
        segments = list_segments(directory)
        if not segments:
            if offset == 0:
                return
            raise OffsetOutOfRangeError(
                f"{topic}/{partition} is empty; offset {offset} is past its end"
            )
        if offset < segments[0]:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {topic}/{partition} was removed by retention "
                f"(first retained: {segments[0]})"
            )
        i = bisect.bisect_right(segments, offset) - 1
        for k in range(i, len(segments)):
            base = segments[k]
            next_base = segments[k + 1] if k + 1 < len(segments) else None
            path = seg_path(directory, base)
            index = read_index(directory, base)
            j = bisect.bisect_right(index, (offset, 2**64)) - 1
            try:
                mapped = map_segment(path)
                buf = mapped.__enter__()
            except FileNotFoundError:  # removed by retention meanwhile
                continue
            try:
                pos, at = (
                    self._start_at(topic, path, buf, base, index[j], strict=True)
                    if j >= 0
                    else (0, base)
                )
                for item in scan_frames(path, buf, pos, at, next_base=next_base, index=index):
                    if isinstance(item, Torn):
                        break
                    if isinstance(item, Damage):
                        if item.end is not None and item.end <= offset:
                            continue  # before what was asked for
                        if self._skip_for(topic, partition, item) is None:
                            raise refuse(topic, partition, item)
                        continue
                    p, header = item
                    if header.next_offset > offset:
                        yield buf, p, header
            finally:
                mapped.__exit__(None, None, None)
            if next_base is None:
                return
            offset = max(offset, next_base)

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        return rows_from(self._batches(topic, partition, offset), offset, max_records)

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        return columns_from(self._batches(topic, partition, start), start, end)

    def read_stored(
        self, topic: str, partition: int, start: int, end: int, max_bytes: int
    ) -> Iterator[StoredBatch]:
        size = 0
        for buf, pos, header in self._whole(topic, partition, start):
            if header.base_offset >= end or (size and size + header.size > max_bytes):
                return
            yield StoredBatch(
                header.base_offset,
                header.count,
                bytes(buf[pos + BATCH_HEAD_SIZE : pos + header.size]),  # copied: unmapped next
            )
            size += header.size
            if header.next_offset >= end:
                return

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        start, end = self.offsets(topic, partition)
        for buf, pos, header in self._whole(topic, partition, start):
            body = buf[pos + BATCH_HEAD_SIZE : pos + header.size]
            try:
                hits = np.flatnonzero(
                    timestamps_of(body, header.count, header.base_offset) >= timestamp_ms
                )
            finally:
                body.release()  # a view of the mapped segment: let it be unmapped
            if len(hits):
                return header.base_offset + int(hits[0])
            if header.next_offset >= end:
                break
        return end

    def wait(self, positions: Mapping[tuple[str, int], int], timeout: float) -> bool:
        """Block until a partition of ``positions`` has a record at or past its offset
        (another process's append wakes this through inotify), or ``timeout`` passes."""
        watcher = getattr(self._watchers, "watcher", None)
        if watcher is None:
            watcher = self._watchers.watcher = watch.watcher()
        if watcher is None or not all(
            watcher.watch(self._partition_dir(t, p)) for t, p in positions
        ):
            return super().wait(positions, timeout)  # one look: the caller polls
        deadline = time.monotonic() + timeout
        while True:
            watcher.drain()  # what changed before this look is seen by it
            if any(self.offsets(t, p)[1] > o for (t, p), o in positions.items()):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not watcher.wait(left):
                return False

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        directory = self._partition_dir(topic, partition)
        segments = list_segments(directory)
        if not segments:
            return 0, 0
        last = segments[-1]
        path = seg_path(directory, last)
        index = read_index(directory, last)
        with map_segment(path) as buf:
            pos, at = (
                self._start_at(topic, path, buf, last, index[-1], strict=False)
                if index
                else (0, last)
            )
            _, end, _ = self._walk_tail(topic, partition, path, buf, pos, at, index)
        return segments[0], end

    def size(self, topic: str, partition: int) -> int:
        """Bytes of the partition's segment and index files."""
        directory = self._partition_dir(topic, partition)  # names an unknown topic
        if not directory.exists():
            return 0
        total = 0
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    total += entry.stat().st_size if entry.is_file() else 0
                except FileNotFoundError:
                    continue  # a segment retention removed while we looked
        return total

    def verify(self, topic: str, rebuild_indexes: bool = False) -> list[PartitionReport]:
        config = self.topic_config(topic)
        reports = []
        for p in range(config.partitions):
            if rebuild_indexes:
                w = self._writer(topic, p)
                with self._locked(w):
                    reports.append(self._verify_partition(topic, p, rebuild=True))
            else:
                reports.append(self._verify_partition(topic, p, rebuild=False))
        return reports

    def _verify_partition(self, topic: str, partition: int, rebuild: bool) -> PartitionReport:
        directory = self._partition_dir(topic, partition)
        segments = list_segments(directory)
        batches = nbytes = torn = 0
        damage: list[Damage] = []
        skipped: list[Damage] = []
        problems: list[str] = []
        at = segments[0] if segments else 0
        for k, base in enumerate(segments):
            next_base = segments[k + 1] if k + 1 < len(segments) else None
            path = seg_path(directory, base)
            index = read_index(directory, base)
            starts: dict[int, int] = {}  # byte -> first offset of each whole batch
            pos, at = 0, base
            with map_segment(path) as buf:
                nbytes += len(buf)
                for item in scan_frames(path, buf, 0, base, next_base=next_base, index=index):
                    if isinstance(item, Torn):
                        torn += item.size
                    elif isinstance(item, Damage):
                        skip = self._skip_for(topic, partition, item)
                        (damage if skip is None else skipped).append(item)
                        starts[item.position] = item.start  # an entry may point there
                        if item.end is not None and item.resume is not None:
                            pos, at = item.resume, item.end
                        elif skip is not None:
                            at = max(at, skip.end)
                    else:
                        q, header = item
                        starts[q] = header.base_offset
                        batches += 1
                        pos, at = q + header.size, header.next_offset
            index_path = seg_path(directory, base, ".index")
            previous = -1
            for o, q in index:
                if o < previous:
                    problems.append(f"{index_path}: entries out of order at offset {o}")
                elif starts.get(q) != o and not (next_base is None and q >= pos and o == at):
                    problems.append(
                        f"{index_path}: entry for offset {o} points at byte {q}, where no "
                        "batch of that offset starts"
                    )
                previous = o
            if rebuild and (problems or not index_path.exists()):
                entries, last_start = [], -INDEX_EVERY
                for q, o in sorted(starts.items()):  # as appends write them
                    if q - last_start >= INDEX_EVERY:
                        entries.append(INDEX_ENTRY.pack(o, q))
                        last_start = q
                tmp = index_path.with_name(f".{index_path.name}.{uuid.uuid4().hex}")
                tmp.write_bytes(b"".join(entries))
                os.replace(tmp, index_path)
                log.warning("%s: rebuilt (%d entries)", index_path, len(entries))
        first = segments[0] if segments else 0
        if rebuild:
            problems = []  # rebuilt
        return PartitionReport(
            partition,
            first,
            at,
            batches,
            nbytes,
            tuple(damage),
            tuple(skipped),
            tuple(problems),
            torn,
        )

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
