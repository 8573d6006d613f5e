"""``file:///path``: topics as directories of append-only segment files.

Layout::

    <root>/<topic>/topic.json                          the topic's configuration
    <root>/<topic>/<partition>/<base:020d>.log         framed record batches (see records.py)
    <root>/<topic>/<partition>/<base:020d>.index       sparse index: (offset u64, position u64)
    <root>/<topic>/<partition>/.lock                   flock held while appending

Appends (many processes may append to one partition):

1. take the partition's ``flock`` (and a thread lock: flock is per open file);
2. catch up with appends other processes made since ours (stat + scan new frames);
   the first time, *recover*: a torn or corrupt tail left by a crashed writer is
   reported and truncated back to the last whole batch;
3. roll to a new segment if this one is full (and apply retention), write the frame
   with one ``write`` on an ``O_APPEND`` descriptor, add an index entry every
   ``INDEX_EVERY`` bytes, ``fsync`` per the topic's policy; release the lock.

Readers take no lock. They stop at the first frame that is short or fails its CRC —
a batch still being written does not exist yet.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import logging
import mmap
import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from riverbed.log.base import LogStorage, TopicConfig, check_topic_name
from riverbed.log.errors import (
    CorruptLogError,
    OffsetOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import (
    ColumnBatch,
    Columns,
    RawRecord,
    decode_batch,
    encode_batch,
    read_header,
)

log = logging.getLogger(__name__)

INDEX_EVERY = 4096
_ENTRY = struct.Struct(">QQ")


def _segments(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())


def _seg_path(directory: Path, base: int, suffix: str = ".log") -> Path:
    return directory / f"{base:020d}{suffix}"


def _read_index(directory: Path, base: int) -> list[tuple[int, int]]:
    try:
        raw = _seg_path(directory, base, ".index").read_bytes()
    except FileNotFoundError:
        return []
    usable = len(raw) - len(raw) % _ENTRY.size
    return [_ENTRY.unpack_from(raw, i) for i in range(0, usable, _ENTRY.size)]


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                yield view
            finally:
                view.release()


def _scan(buf: memoryview, pos: int, next_offset: int) -> tuple[int, int]:
    """Walk whole frames from ``pos``; returns (position after the last whole frame,
    next offset)."""
    while True:
        header = read_header(buf, pos)
        if header is None:
            return pos, next_offset
        pos += header.size
        next_offset = header.next_offset


@dataclass
class _Writer:
    """One process's appending state for one partition."""

    directory: Path
    lockfile: int
    mutex: threading.Lock = field(default_factory=threading.Lock)
    base: int = 0  # active segment
    fd: int = -1
    size: int = 0
    next_offset: int = 0
    since_index: int = 0
    last_fsync: float = 0.0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        os.close(self.lockfile)


class FileLogStorage(LogStorage):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        root.mkdir(parents=True, exist_ok=True)
        self._writers: dict[tuple[str, int], _Writer] = {}
        self._configs: dict[str, TopicConfig] = {}
        self._lock = threading.Lock()

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
        config = TopicConfig(**data)
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
            if partitions < config.partitions:
                raise ValueError(
                    f"topic '{name}' has {config.partitions} partitions; partitions can be "
                    "added, never removed"
                )
            for p in range(config.partitions, partitions):
                (directory / str(p)).mkdir(exist_ok=True)
            new = replace(config, partitions=partitions)
            tmp = directory / f".topic.json.{uuid.uuid4().hex}"
            tmp.write_text(json.dumps(new.to_dict(), indent=2))
            os.replace(tmp, directory / "topic.json")
            self._configs[name] = new
            return new
        finally:
            os.close(fd)

    def _config(self, topic: str) -> TopicConfig:
        config = self._configs.get(topic)
        return config if config is not None else self.topic_config(topic)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        config = self._config(topic)
        if not 0 <= partition < config.partitions:
            config = self.topic_config(topic)  # partitions may have been added meanwhile
            if not 0 <= partition < config.partitions:
                raise ValueError(
                    f"topic '{topic}' has partitions 0..{config.partitions - 1}, not {partition}"
                )
        return self._topic_dir(topic) / str(partition)

    # -- appends ------------------------------------------------------------------------
    def _writer(self, topic: str, partition: int) -> _Writer:
        key = (topic, partition)
        with self._lock:
            writer = self._writers.get(key)
            if writer is None:
                directory = self._partition_dir(topic, partition)
                directory.mkdir(exist_ok=True)
                lockfile = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
                writer = _Writer(directory, lockfile)
                self._writers[key] = writer
            return writer

    @contextlib.contextmanager
    def _locked(self, writer: _Writer) -> Iterator[None]:
        with writer.mutex:
            fcntl.flock(writer.lockfile, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(writer.lockfile, fcntl.LOCK_UN)

    def _sync_state(self, w: _Writer) -> None:
        """Under the lock: catch up with other processes' appends (and recover once)."""
        segments = _segments(w.directory)
        if not segments:
            self._open_segment(w, 0, 0)
            return
        last = segments[-1]
        path = _seg_path(w.directory, last)
        size = os.stat(path).st_size
        if w.fd >= 0 and last == w.base and size == w.size:
            return
        if w.fd < 0 or last != w.base:
            index = _read_index(w.directory, last)
            pos, offset = (index[-1][1], index[-1][0]) if index else (0, last)
            if pos > size:  # index ahead of a truncated file
                pos, offset = 0, last
        else:
            pos, offset = w.size, w.next_offset
        with _mapped(path) as buf:
            end, next_offset = _scan(buf, pos, offset)
        if end < size:
            # We hold the lock, so no writer is mid-append: these bytes are torn.
            log.warning(
                "%s: %d bytes after offset %d are a torn or corrupt batch (a writer "
                "crashed mid-append?); truncating them — every whole batch before is kept",
                path,
                size - end,
                next_offset,
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
        entries = [e for e in _read_index(directory, base) if e[1] < size]
        path = _seg_path(directory, base, ".index")
        if path.exists():
            path.write_bytes(b"".join(_ENTRY.pack(*e) for e in entries))

    def _open_segment(self, w: _Writer, base: int, next_offset: int) -> None:
        if w.fd >= 0:
            os.fsync(w.fd)
            os.close(w.fd)
        path = _seg_path(w.directory, base)
        w.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        w.base, w.size, w.next_offset, w.since_index = base, 0, next_offset, 0

    def append(self, topic: str, partition: int, records: Sequence[RawRecord]) -> int:
        if not records:
            raise ValueError("cannot append an empty batch")
        config = self._config(topic)
        w = self._writer(topic, partition)
        with self._locked(w):
            self._sync_state(w)
            base = w.next_offset
            frame = encode_batch(base, records)
            if w.size and w.size + len(frame) > config.segment_bytes:
                self._open_segment(w, base, base)
                self._retain(w.directory, config)
            if w.since_index >= INDEX_EVERY or w.size == 0:
                with open(_seg_path(w.directory, w.base, ".index"), "ab") as index:
                    index.write(_ENTRY.pack(base, w.size))
                w.since_index = 0
            os.write(w.fd, frame)
            w.size += len(frame)
            w.since_index += len(frame)
            w.next_offset = base + len(records)
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
        segments = _segments(directory)
        removable = segments[:-1]  # never the active segment
        removed = 0
        now = time.time()
        sizes = {b: _seg_path(directory, b).stat().st_size for b in segments}
        total = sum(sizes.values())
        for base in removable:
            path = _seg_path(directory, base)
            too_big = config.retention_bytes is not None and total > config.retention_bytes
            too_old = (
                config.retention_ms is not None
                and (now - path.stat().st_mtime) * 1000 > config.retention_ms
            )
            if not (too_big or too_old):
                break
            path.unlink()
            _seg_path(directory, base, ".index").unlink(missing_ok=True)
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
        directory = self._partition_dir(topic, partition)
        segments = _segments(directory)
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
        for n, base in enumerate(segments[i:]):
            last = i + n == len(segments) - 1
            path = _seg_path(directory, base)
            index = _read_index(directory, base)
            j = bisect.bisect_right(index, (offset, 2**64)) - 1
            pos, at = (index[j][1], index[j][0]) if j >= 0 else (0, base)
            try:
                mapped = _mapped(path)
                buf = mapped.__enter__()
            except FileNotFoundError:  # removed by retention meanwhile
                continue
            try:
                while True:
                    header = read_header(buf, pos)
                    if header is None:
                        if not last and pos < len(buf):
                            raise CorruptLogError(
                                f"{path}: invalid batch at byte {pos} in a closed segment"
                            )
                        break
                    if header.next_offset > offset:
                        yield header.base_offset, decode_batch(buf, pos, header)
                    pos += header.size
                    at = header.next_offset
            finally:
                mapped.__exit__(None, None, None)
            if last:
                return
            offset = max(offset, at)

    def read(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[tuple[int, RawRecord]]:
        out: list[tuple[int, RawRecord]] = []
        for base, batch in self._batches(topic, partition, offset):
            skip = max(0, offset - base)
            chunk = batch.slice(skip, skip + max_records - len(out)).rows()
            out.extend(enumerate(chunk, base + skip))
            if len(out) >= max_records:
                break
        return out

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        chunks: list[ColumnBatch] = []
        for base, batch in self._batches(topic, partition, start):
            if base >= end:
                break
            chunk = batch.slice(max(0, start - base), end - base)
            if len(chunk):
                chunks.append(chunk)
            if base + len(batch) >= end:
                break
        return Columns.concat(start, chunks)

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        directory = self._partition_dir(topic, partition)
        segments = _segments(directory)
        if not segments:
            return 0, 0
        last = segments[-1]
        index = _read_index(directory, last)
        pos, offset = (index[-1][1], index[-1][0]) if index else (0, last)
        with _mapped(_seg_path(directory, last)) as buf:
            if pos > len(buf):
                pos, offset = 0, last
            _, end = _scan(buf, pos, offset)
        return segments[0], end

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
