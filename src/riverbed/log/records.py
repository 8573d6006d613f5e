"""Records and their on-disk batch framing.

A batch on disk::

    length u32 | crc32 u32 | base_offset u64 | count u32 | msgpack([[ts, key, value, hdrs]..])

``length`` counts everything after itself; ``crc32`` covers everything after itself.
A reader that finds fewer bytes than ``length``, or a CRC mismatch, is looking at a
torn write: the batch does not exist.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgpack

from riverbed.log.errors import CorruptLogError

_PREFIX = struct.Struct(">II")  # length, crc
_HEAD = struct.Struct(">QI")  # base_offset, count
PREFIX_SIZE = _PREFIX.size


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


@dataclass(frozen=True)
class RawRecord:
    """A record as stored: bytes key and value, event time in ms."""

    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    """A record read from a topic, with its coordinates."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: Any
    headers: Mapping[str, bytes]

    def __repr__(self) -> str:
        return (
            f"Record({self.topic}/{self.partition}@{self.offset}, key={self.key!r}, "
            f"value={self.value!r:.60}, ts={self.timestamp.isoformat()})"
        )


@dataclass(frozen=True)
class RecordMetadata:
    """Where an appended record landed."""

    topic: str
    partition: int
    offset: int


def encode_batch(base_offset: int, records: Sequence[RawRecord]) -> bytes:
    payload: bytes = _HEAD.pack(base_offset, len(records)) + msgpack.packb(
        [[r.timestamp_ms, r.key, r.value, dict(r.headers)] for r in records], use_bin_type=True
    )
    return _PREFIX.pack(len(payload) + 4, zlib.crc32(payload)) + payload


@dataclass(frozen=True)
class BatchHeader:
    base_offset: int
    count: int
    size: int  # whole frame, prefix included

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def read_header(buf: bytes | memoryview, pos: int) -> BatchHeader | None:
    """The batch at ``pos`` if it is whole and its CRC is right, else ``None``."""
    if len(buf) - pos < PREFIX_SIZE + _HEAD.size:
        return None
    length, crc = _PREFIX.unpack_from(buf, pos)
    end = pos + 4 + length
    if length < 4 + _HEAD.size or end > len(buf):
        return None
    if zlib.crc32(buf[pos + PREFIX_SIZE : end]) != crc:
        return None
    base, count = _HEAD.unpack_from(buf, pos + PREFIX_SIZE)
    return BatchHeader(base, count, end - pos)


def decode_rows(buf: bytes | memoryview, pos: int, header: BatchHeader) -> list[Any]:
    """The batch's records as stored: ``[[ts_ms, key, value, headers], ...]``."""
    start = pos + PREFIX_SIZE + _HEAD.size
    try:
        rows: list[Any] = msgpack.unpackb(bytes(buf[start : pos + header.size]), raw=False)
    except ValueError as exc:
        raise CorruptLogError(f"batch at offset {header.base_offset} cannot be decoded") from exc
    return rows


class Columns(NamedTuple):
    """Records [start, end) of a partition column by column, for vectorized readers."""

    offsets: list[int]
    timestamps_ms: list[int]
    keys: list[bytes | None]
    values: list[bytes]
