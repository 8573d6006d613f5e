"""Segment files of the ``file://`` log: names, the sparse index, memory maps, and the
frame scan that tells a torn tail (an append not finished) from damage.

:mod:`riverbed.log.file` owns the protocol (the layout and the append/read steps are in
its docstring); this module is the part of it that reads one directory of segments.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from riverbed.log.base import (
    Damage,
)
from riverbed.log.errors import (
    CorruptLogError,
)
from riverbed.log.records import (
    PREFIX_SIZE,
    BatchHeader,
    read_header,
    whole_frame,
)

log = logging.getLogger(__name__)

INDEX_EVERY = 4096
INDEX_ENTRY = struct.Struct(">QQ")


def list_segments(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())


def seg_path(directory: Path, base: int, suffix: str = ".log") -> Path:
    return directory / f"{base:020d}{suffix}"


def read_index(directory: Path, base: int) -> list[tuple[int, int]]:
    try:
        raw = seg_path(directory, base, ".index").read_bytes()
    except FileNotFoundError:
        return []
    usable = len(raw) - len(raw) % INDEX_ENTRY.size
    return [INDEX_ENTRY.unpack_from(raw, i) for i in range(0, usable, INDEX_ENTRY.size)]


@contextlib.contextmanager
def map_segment(path: Path) -> Iterator[memoryview]:
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


FRAME_HEADER = PREFIX_SIZE + 12  # length, crc, base offset, count
FIELDS_LENGTH = struct.Struct(">I")
FIELDS_BASE = struct.Struct(">Q")
_MIN_RECORD_BYTES = 4  # no stored record takes fewer bytes (bounds a damaged tail's offsets)


def _next_valid(buf: memoryview, pos: int, at: int) -> tuple[int, BatchHeader] | None:
    """The first whole batch after byte ``pos`` whose offsets start at ``at`` or later:
    resynchronising after a damaged batch. Candidates (plausible length, base offset
    and count at every byte) are found with numpy; only they are CRC-checked."""
    size = len(buf)
    q0, step = pos + 1, 1 << 20
    while q0 + FRAME_HEADER <= size:
        n = min(step, size - FRAME_HEADER - q0 + 1)
        qs = np.arange(q0, q0 + n, dtype=np.int64)
        lengths = np.ndarray((n,), ">u4", buffer=buf, offset=q0, strides=(1,)).astype(np.int64)
        bases = np.ndarray((n,), ">u8", buffer=buf, offset=q0 + 8, strides=(1,)).astype(np.uint64)
        counts = np.ndarray((n,), ">u4", buffer=buf, offset=q0 + 16, strides=(1,)).astype(np.int64)
        plausible = (
            (lengths >= FRAME_HEADER - 4)
            & (qs + 4 + lengths <= size)
            & (bases >= np.uint64(at))
            & (bases < np.uint64(at + 2**40))
            & (counts > 0)
        )
        for c in np.flatnonzero(plausible).tolist():
            header = read_header(buf, q0 + c)
            if header is not None:
                return q0 + c, header
        q0 += n
    return None


@dataclass(frozen=True)
class Torn:
    """An unfinished append at the end of the newest segment."""

    position: int
    size: int


def scan_frames(
    path: Path,
    buf: memoryview,
    pos: int,
    at: int,
    *,
    next_base: int | None,
    index: Sequence[tuple[int, int]],
) -> Iterator[tuple[int, BatchHeader] | Damage | Torn]:
    """Walk a segment from byte ``pos`` (where offset ``at`` starts): every whole batch as
    (position, header), every damaged stretch as a :class:`Damage` (then on, after it,
    where the segment has more), and an unfinished tail as :class:`Torn`.
    ``next_base`` is the next segment's first offset (None: this is the newest)."""
    while True:
        header = read_header(buf, pos)
        if header is not None and header.base_offset == at:
            yield pos, header
            pos, at = pos + header.size, header.next_offset
            continue
        if header is None and pos >= len(buf):
            if next_base is not None and at != next_base:
                if at > next_base:
                    raise CorruptLogError(
                        f"{path} ends at offset {at} but the next segment starts at "
                        f"{next_base}: segments overlap"
                    )
                yield Damage(str(path), pos, at, next_base, None)  # batches missing
            return
        damage: Damage | None
        if header is not None:  # whole, but not the offsets that follow
            if header.base_offset < at:
                raise CorruptLogError(
                    f"{path}: the batch at byte {pos} holds offsets from "
                    f"{header.base_offset}, but {at} was expected there: batches overlap"
                )
            damage = Damage(str(path), pos, at, header.base_offset, pos)
        else:
            damage = _damage(path, buf, pos, at, next_base=next_base, index=index)
            if damage is None:
                yield Torn(pos, len(buf) - pos)
                return
        yield damage
        if damage.resume is None or damage.end is None:
            return
        pos, at = damage.resume, damage.end


def _damage(
    path: Path,
    buf: memoryview,
    pos: int,
    at: int,
    *,
    next_base: int | None,
    index: Sequence[tuple[int, int]],
) -> Damage | None:
    """What the bad frame at ``pos`` is: damage (with the offsets it hides), or None for
    a torn tail — an unfinished append: nothing readable after it in the newest segment,
    no index entry showing the partition had gone past it, and fewer bytes than the
    frame claims (a frame that is all there but fails its CRC was damaged)."""
    found = _next_valid(buf, pos, at)
    if found is not None:
        q, header = found
        return Damage(str(path), pos, at, header.base_offset, q)
    if next_base is not None:
        return Damage(str(path), pos, at, next_base, len(buf))
    if any(p > pos and o > at for o, p in index) or whole_frame(buf, pos):
        # an index entry is written just before its batch, and an unfinished append is
        # shorter than it claims: either way the batch at pos was whole
        upper = at + (len(buf) - pos) // _MIN_RECORD_BYTES + 1
        return Damage(str(path), pos, at, None, None, upper=upper)
    return None


def refuse(topic: str, partition: int, damage: Damage) -> CorruptLogError:
    after = (
        f"Readable batches follow at byte {damage.resume}, so nothing after them is lost. "
        if damage.resume is not None and damage.end is not None
        else ""
    )
    error = CorruptLogError(
        f"{topic}/{partition} is damaged: {damage.describe()}. {after}"
        f"Find every damaged range: `riverbed topic verify {topic}`; to read past this "
        f"one: `riverbed topic skip {topic} {partition} {damage.start} {damage.span_end}` "
        "(docs/log.md, 'When a topic is damaged')."
    )
    error.damage = damage
    return error


@dataclass
class Writer:
    """One process's appending state for one partition."""

    directory: Path
    lockfile: int
    topic: str
    partition: int
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
