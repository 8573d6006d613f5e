"""Records and their on-disk batch framing.

A batch on disk::

    length u32 | crc32 u32 | base_offset u64 | count u32 | msgpack(payload)

``length`` counts everything after itself; ``crc32`` covers everything after itself.
A reader that finds fewer bytes than ``length``, or a CRC mismatch, is looking at a
torn write: the batch does not exist.

The payload is columnar (format 2), so readers decode a batch with a handful of array
copies instead of a Python object per record::

    [2, timestamps (int64 LE), key offsets (int32 LE, count + 1), key validity
     (little-endian bitmap, or b"" when every key is set), key bytes,
     value offsets (int32 LE, count + 1), value bytes, headers (list of maps, or nil)]

A typed topic's batches (format 3) hold the values as typed columns instead — an
Arrow IPC stream of one record batch with the topic's schema — in place of the value
offsets and bytes::

    [3, timestamps, key offsets, key validity, key bytes, Arrow IPC, headers]

Format 1, still read, was ``[[ts, key, value, headers], ...]``: its elements are rows
(arrays), never the integer 2.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from riverbed.arrowbytes import ipc_bytes
from riverbed.checksum import crc32
from riverbed.log.errors import CorruptLogError, LogValueError

_PREFIX = struct.Struct(">II")  # length, crc
_HEAD = struct.Struct(">QI")  # base_offset, count
PREFIX_SIZE = _PREFIX.size
BATCH_HEAD_SIZE = PREFIX_SIZE + _HEAD.size  # what precedes a batch's payload


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


@dataclass(frozen=True)
class RawRecord:
    """A record as stored: bytes key, event time in ms, and the value — its serde's
    bytes, or for a typed topic the mapping of its fields."""

    timestamp_ms: int
    key: bytes | None
    value: Any
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


FORMAT_COLUMNS = 2
FORMAT_TYPED = 3
_MAX_BYTES = 2**31 - 1  # int32 offsets


def _le(values: array[int]) -> bytes:
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def _offsets(lengths: list[int]) -> bytes:
    offsets = array("i", [0])
    offsets.extend(accumulate(lengths))
    if offsets[-1] > _MAX_BYTES:
        raise LogValueError("a batch's keys or values exceed 2 GiB; append smaller batches")
    return _le(offsets)


@dataclass(frozen=True)
class EncodedBatch:
    """A batch encoded but for its base offset (known only under the partition's lock):
    :meth:`frame` adds it. Encoding the values outside the lock keeps appends short."""

    count: int
    body: bytes

    def frame(self, base_offset: int) -> bytes:
        payload = _HEAD.pack(base_offset, self.count) + self.body
        return _PREFIX.pack(len(payload) + 4, crc32(payload)) + payload


def encode_body(records: Sequence[RawRecord], typed: pa.RecordBatch | None = None) -> EncodedBatch:
    """Encode ``records``; ``typed`` holds a typed topic's values as columns (format 3),
    else the values are serde bytes (format 2)."""
    # array + accumulate, not numpy: most appends are small, where numpy's per-call
    # overhead would dominate
    keys = [r.key for r in records]
    missing = [k is None for k in keys]
    validity = b""
    if any(missing):
        validity = np.packbits(~np.array(missing), bitorder="little").tobytes()
    stored: list[Any]
    if typed is None:
        values = [r.value for r in records]
        stored = [FORMAT_COLUMNS, _offsets([len(v) for v in values]), b"".join(values)]
    else:
        if typed.num_rows != len(records):
            raise LogValueError(f"{typed.num_rows} typed values for {len(records)} records")
        stored = [FORMAT_TYPED, ipc_bytes(typed)]
    body: bytes = msgpack.packb(
        [
            stored[0],
            _le(array("q", [r.timestamp_ms for r in records])),
            _offsets([len(k) if k is not None else 0 for k in keys]),
            validity,
            b"".join(k for k in keys if k is not None),
            *stored[1:],
            [dict(r.headers) for r in records] if any(r.headers for r in records) else None,
        ],
        use_bin_type=True,
    )
    return EncodedBatch(len(records), body)


def encode_batch(
    base_offset: int, records: Sequence[RawRecord], typed: pa.RecordBatch | None = None
) -> bytes:
    """The frame of one batch (see :func:`encode_body`)."""
    return encode_body(records, typed).frame(base_offset)


def _from_ipc(data: bytes) -> pa.StructArray:
    return as_struct(pa.ipc.open_stream(data).read_next_batch())


def as_struct(batch: pa.RecordBatch) -> pa.StructArray:
    """A typed topic's values (a record batch of its schema) as one struct column."""
    return pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))


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
    if crc32(buf[pos + PREFIX_SIZE : end]) != crc:
        return None
    base, count = _HEAD.unpack_from(buf, pos + PREFIX_SIZE)
    return BatchHeader(base, count, end - pos)


def whole_frame(buf: bytes | memoryview, pos: int) -> bool:
    """Whether all the bytes the frame at ``pos`` claims are there (its CRC unchecked).

    An unfinished append leaves a *prefix* of a correct frame, whose length field
    claims more bytes than follow it; a frame that claims no more than follows was
    written whole, so a CRC mismatch there is damage, not an unfinished write."""
    if len(buf) - pos < PREFIX_SIZE + _HEAD.size:
        return False
    length: int = _PREFIX.unpack_from(buf, pos)[0]
    return length >= 4 + _HEAD.size and pos + 4 + length <= len(buf)


@dataclass(frozen=True)
class ColumnBatch:
    """One stored batch, column by column. ``values`` is a binary array of serde bytes,
    or for a typed topic a struct array of the schema's fields."""

    timestamps_ms: np.ndarray  # int64
    keys: pa.BinaryArray
    values: pa.Array
    headers: list[dict[str, bytes]] | None

    def __len__(self) -> int:
        return len(self.timestamps_ms)

    def slice(self, start: int, stop: int) -> ColumnBatch:
        return ColumnBatch(
            self.timestamps_ms[start:stop],
            self.keys.slice(start, max(0, stop - start)),
            self.values.slice(start, max(0, stop - start)),
            self.headers[start:stop] if self.headers is not None else None,
        )

    @staticmethod
    def from_rows(rows: Sequence[RawRecord], schema: pa.Schema | None = None) -> ColumnBatch:
        """The inverse of :meth:`rows` (for row-shaped sources: format 1 batches,
        storages without a columnar read); ``schema`` for a typed topic's rows."""
        values: pa.Array
        if schema is None:
            values = pa.array([r.value for r in rows], pa.binary())
        else:
            from riverbed.log.schema import to_batch

            values = as_struct(to_batch([r.value for r in rows], schema))
        return ColumnBatch(
            np.array([r.timestamp_ms for r in rows], dtype=np.int64),
            pa.array([r.key for r in rows], pa.binary()),
            values,
            [dict(r.headers) for r in rows] if any(r.headers for r in rows) else None,
        )

    def rows(self) -> list[RawRecord]:
        headers = self.headers or [{}] * len(self)
        return [
            RawRecord(ts, key, value, h or {})
            for ts, key, value, h in zip(
                self.timestamps_ms.tolist(),
                self.keys.to_pylist(),
                self.values.to_pylist(),
                headers,
                strict=True,
            )
        ]


def _binary(n: int, offsets: bytes, data: bytes, validity: bytes = b"") -> pa.BinaryArray:
    buffers = [pa.py_buffer(validity) if validity else None, pa.py_buffer(offsets)]
    array = pa.Array.from_buffers(pa.binary(), n, [*buffers, pa.py_buffer(data)])
    assert isinstance(array, pa.BinaryArray)
    return array


def decode_batch(buf: bytes | memoryview, pos: int, header: BatchHeader) -> ColumnBatch:
    start = pos + BATCH_HEAD_SIZE
    # a copy: a view would keep a mapped segment open (in a traceback, say)
    return decode_body(bytes(buf[start : pos + header.size]), header.count, header.base_offset)


def decode_body(body: bytes | memoryview, n: int, base_offset: int) -> ColumnBatch:
    """The columns of a batch's payload (what follows its header) of ``n`` records."""
    try:
        payload = msgpack.unpackb(body, raw=False)
        if payload and payload[0] == FORMAT_COLUMNS:
            _, ts, key_offsets, key_valid, key_data, value_offsets, value_data, headers = payload
            return ColumnBatch(
                np.frombuffer(ts, dtype="<i8"),
                _binary(n, key_offsets, key_data, key_valid),
                _binary(n, value_offsets, value_data),
                headers,
            )
        if payload and payload[0] == FORMAT_TYPED:
            _, ts, key_offsets, key_valid, key_data, ipc, headers = payload
            values = _from_ipc(ipc)
            if len(values) != n:
                raise LogValueError(f"{len(values)} typed values for {n} records")
            return ColumnBatch(
                np.frombuffer(ts, dtype="<i8"),
                _binary(n, key_offsets, key_data, key_valid),
                values,
                headers,
            )
        # format 1: rows
        return ColumnBatch.from_rows([RawRecord(r[0], r[1], r[2], r[3] or {}) for r in payload])
    except (
        ValueError,
        TypeError,
        IndexError,
        msgpack.UnpackException,
        pa.ArrowInvalid,
        pa.ArrowTypeError,
    ) as exc:
        raise CorruptLogError(f"batch at offset {base_offset} cannot be decoded") from exc


def timestamps_of(body: bytes | memoryview, n: int, base_offset: int) -> np.ndarray:
    """Only the timestamps (int64 ms) of a batch's payload: the two first items of a
    format 2/3 payload, without unpacking its keys and values."""
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(body) + 1)
        unpacker.feed(body)
        unpacker.read_array_header()
        if unpacker.unpack() in (FORMAT_COLUMNS, FORMAT_TYPED):
            ts = np.frombuffer(unpacker.unpack(), dtype="<i8")
            if len(ts) != n:
                raise LogValueError(f"{len(ts)} timestamps for {n} records")
            return ts
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptLogError(f"batch at offset {base_offset} cannot be decoded") from exc
    return decode_body(body, n, base_offset).timestamps_ms  # format 1: rows


def _binary_parts(array: pa.Array) -> tuple[bytes, bytes, bytes]:
    """A binary array's (offsets from 0, validity or b"" without nulls, data), as format
    2 stores them — read from its Arrow buffers, not a Python object per element."""
    n = len(array)
    validity, offsets_buf, data = array.buffers()[:3]
    offsets = np.frombuffer(offsets_buf, dtype="<i4", count=n + 1, offset=array.offset * 4)
    first, last = int(offsets[0]), int(offsets[-1])
    bits = b""
    if array.null_count:
        flags = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
        bits = np.packbits(flags[array.offset : array.offset + n], bitorder="little").tobytes()
    body = data.slice(first, last - first).to_pybytes() if data is not None else b""
    return (offsets - first).astype("<i4").tobytes(), bits, body


def encode_columns(batch: ColumnBatch) -> EncodedBatch:
    """Encode a batch given as columns (what a log server receives) straight from their
    buffers: the same bytes :func:`encode_body` writes for the same records."""
    if batch.values.null_count:
        raise LogValueError("a record's value cannot be null")
    key_offsets, key_valid, key_data = _binary_parts(batch.keys)
    stored: list[Any]
    if pa.types.is_struct(batch.values.type):
        stored = [FORMAT_TYPED, ipc_bytes(pa.RecordBatch.from_struct_array(batch.values))]
    else:
        value_offsets, _, value_data = _binary_parts(batch.values)
        stored = [FORMAT_COLUMNS, value_offsets, value_data]
    headers = batch.headers if batch.headers and any(batch.headers) else None
    body: bytes = msgpack.packb(
        [
            stored[0],
            np.ascontiguousarray(batch.timestamps_ms, dtype="<i8").tobytes(),
            key_offsets,
            key_valid,
            key_data,
            *stored[1:],
            [dict(h) for h in headers] if headers else None,
        ],
        use_bin_type=True,
    )
    return EncodedBatch(len(batch), body)


@dataclass(frozen=True)
class StoredBatch:
    """One batch as stored (its CRC checked): what a log server ships for a fetch; the
    client decodes it (:meth:`decode`) as a local reader would."""

    base_offset: int
    count: int
    body: bytes | memoryview  # the payload past the batch's header

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    def decode(self) -> ColumnBatch:
        return decode_body(self.body, self.count, self.base_offset)


def rows_from(
    batches: Iterable[tuple[int, ColumnBatch]], offset: int, max_records: int
) -> list[tuple[int, RawRecord]]:
    """Up to ``max_records`` records from ``offset`` on, out of (base, columns) batches."""
    out: list[tuple[int, RawRecord]] = []
    for base, batch in batches:
        skip = max(0, offset - base)
        chunk = batch.slice(skip, skip + max_records - len(out)).rows()
        out.extend(enumerate(chunk, base + skip))
        if len(out) >= max_records:
            break
    return out


def columns_from(batches: Iterable[tuple[int, ColumnBatch]], start: int, end: int) -> Columns:
    """Records [start, end) out of (base, columns) batches (a gap between batches is a
    skipped damaged range)."""
    chunks: list[ColumnBatch] = []
    bases: list[int] = []
    for base, batch in batches:
        if base >= end:
            break
        skip = max(0, start - base)
        chunk = batch.slice(skip, end - base)
        if len(chunk):
            chunks.append(chunk)
            bases.append(base + skip)
        if base + len(batch) >= end:
            break
    return Columns.concat(start, chunks, bases)


@dataclass(frozen=True)
class Columns:
    """Records of a partition from offset ``start`` on, column by column, for vectorized
    readers (the Spark source, the stream engine). Offsets are contiguous unless
    ``picked`` lists them (a filtered read, or a read across a skipped damaged range)."""

    start: int
    timestamps_ms: np.ndarray  # int64 ms
    keys: pa.BinaryArray  # null where a record has no key
    values: pa.Array  # binary (serde bytes), or struct (a typed topic's fields)
    picked: np.ndarray | None = None  # int64 offsets of the records, when not contiguous

    def __len__(self) -> int:
        return len(self.timestamps_ms)

    @property
    def offsets(self) -> np.ndarray:
        if self.picked is not None:
            return self.picked
        return np.arange(self.start, self.start + len(self), dtype=np.int64)

    @staticmethod
    def concat(
        start: int, batches: Sequence[ColumnBatch], bases: Sequence[int] | None = None
    ) -> Columns:
        """``batches`` in order; ``bases`` (the first offset of each) only when there may
        be gaps between them."""
        if not batches:
            empty = pa.array([], pa.binary())
            return Columns(start, np.zeros(0, np.int64), empty, empty)
        picked = None
        if bases is not None:
            runs = [(b, len(c)) for b, c in zip(bases, batches, strict=True)]
            expected = start
            for b, n in runs:
                if b != expected:
                    picked = np.concatenate([np.arange(b, b + k, dtype=np.int64) for b, k in runs])
                    break
                expected = b + n
        return Columns(
            start,
            np.concatenate([b.timestamps_ms for b in batches]),
            pa.concat_arrays([b.keys for b in batches]),
            pa.concat_arrays([b.values for b in batches]),
            picked,
        )
