"""Key layouts that make window expiry one cheap range delete.

A windowed key is ``window_start`` (milliseconds since the epoch, 8 bytes big-endian,
so byte order = time order) followed by the user key. Every key of windows that
ended before a watermark is then in one contiguous range, deleted with a single
``delete_range`` — recorded in the changelog like any other write.

Session windows move (a session grows, starts earlier, merges with the next), so
their state is found by key, and expired by end:

* ``0x01 + user key`` — the key's sessions (one value: all of them, few per key);
* ``0x02 + end + start + user key`` — an index entry per session, by end (8 bytes
  each, big-endian), so the sessions the watermark closed are one range scan and
  their index one range delete.

A stream-stream join (:mod:`riverbed.stream.pairing`) buffers each side's events until
the watermark passes the last time a partner could arrive — a batch's events of a side
in a state partition as one immutable segment:

* ``0x05 + side + max expiry + batch + n`` — a segment's index entry (by the latest
  time the watermark keeps one of its events, so the segments it passed are one range
  scan and one range delete), its value the segment's name: 16 random bytes;
* ``0x08 + name`` — the segment's events, an Arrow IPC stream (written once, never
  changed: a process may keep it decoded by its name);
* ``0x06 + a left segment's (max expiry + batch + n) + batch`` — the row numbers of that
  segment's events paired by that batch (a left join emits the others, unmatched);
* ``0x07`` — the watermark of the batch that wrote this version.

Join state format 1 (riverbed before the segments) kept ``0x03 + side + key`` — the
key's events as one msgpack list — and ``0x04 + side + expiry + time + partition +
offset + key`` — an index entry per event; a partition still holding them is rewritten
as segments by its next batch (:func:`riverbed.stream.pairing.step`).

A hopping or sliding window's state held as panes (:mod:`riverbed.stream.panes`) keys
each pane as a window (its start + user key), and a window the watermark closed, while
``keep_closed`` keeps it, as a window key whose start has its top bit set
(:func:`closed_window_key`: ``0x80`` and up): the user key stays 8 bytes in, where a
move between partition counts reads it, and expiry is one more range delete.

A window key's first byte is 0 for every window start before the year 2,280,000, so
the layouts never meet.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from riverbed.durations import epoch_ms
from riverbed.state.errors import StateValueError
from riverbed.state.store import StateStore

_TS = struct.Struct(">Q")


def to_millis(ts: datetime | int) -> int:
    """Milliseconds since the epoch; datetimes must be timezone-aware."""
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise StateValueError(f"naive datetime {ts!r}: pass a timezone-aware (UTC) datetime")
        return epoch_ms(ts)
    if ts < 0:
        raise StateValueError(f"timestamp must be >= 0 ms, got {ts}")
    return ts


def window_key(window_start: datetime | int, key: bytes) -> bytes:
    return _TS.pack(to_millis(window_start)) + key


def window_keys(starts: Sequence[int], keys: Sequence[bytes]) -> list[bytes]:
    """:func:`window_key` of many (window start in epoch ms, key) pairs at once."""
    if starts and min(starts) < 0:
        raise StateValueError(f"timestamp must be >= 0 ms, got {min(starts)}")
    pack = _TS.pack
    return [pack(ms) + key for ms, key in zip(starts, keys, strict=True)]


def split_window_key(data: bytes) -> tuple[datetime, bytes]:
    millis, key = split_window_key_ms(data)
    return datetime.fromtimestamp(millis / 1000, tz=UTC), key


def split_window_key_ms(data: bytes) -> tuple[int, bytes]:
    """:func:`split_window_key` with the window start in epoch milliseconds."""
    (millis,) = _TS.unpack_from(data)
    return int(millis), data[_TS.size :]


def split_window_keys_ms(data: Sequence[bytes]) -> tuple[np.ndarray, list[bytes]]:
    """:func:`split_window_key_ms` of many keys at once: their window starts (an int64
    array of epoch milliseconds) and their keys."""
    width = _TS.size
    starts = np.frombuffer(b"".join([k[:width] for k in data]), dtype=">u8").astype(np.int64)
    return starts, [k[width:] for k in data]


CLOSED = 1 << 63  # a closed window's start, in its key (panes' keep_closed)


def closed_window_key(window_key: bytes) -> bytes:
    """The key a closed window is kept under beside panes (the module doc): its window
    key with the start's top bit set."""
    return bytes([window_key[0] | 0x80]) + window_key[1:]


def is_closed_window_key(data: bytes) -> bool:
    """Whether a state key is a :func:`closed_window_key`."""
    return data[0] >= 0x80


def window_key_of_closed(data: bytes) -> bytes:
    """The window key of a :func:`closed_window_key`."""
    return bytes([data[0] & 0x7F]) + data[1:]


def closed_prefix(window_start: int) -> bytes:
    """Where the closed windows starting at ``window_start`` begin (the module doc)."""
    return _TS.pack(CLOSED | window_start)


def window_prefix(window_start: datetime | int) -> bytes:
    return _TS.pack(to_millis(window_start))


def expire_before(store: StateStore, window_start: datetime | int) -> None:
    """Delete every window that starts before ``window_start`` (one range delete)."""
    store.delete_range(_TS.pack(0), window_prefix(window_start))


SESSIONS = b"\x01"  # + user key -> the key's sessions
SESSION_ENDS = b"\x02"  # + end + start + user key -> b""


def session_key(key: bytes) -> bytes:
    return SESSIONS + key


def session_end_key(end: int, start: int, key: bytes) -> bytes:
    return SESSION_ENDS + _TS.pack(to_millis(end)) + _TS.pack(to_millis(start)) + key


def split_session_end_key(data: bytes) -> tuple[int, int, bytes]:
    """(end, start, user key) of a :func:`session_end_key`."""
    (end,) = _TS.unpack_from(data, 1)
    (start,) = _TS.unpack_from(data, 1 + _TS.size)
    return int(end), int(start), data[1 + 2 * _TS.size :]


def session_ends(lo: int, hi: int) -> tuple[bytes, bytes]:
    """The range of index entries of sessions that end in ``[lo, hi)`` (ms)."""
    return SESSION_ENDS + _TS.pack(max(lo, 0)), SESSION_ENDS + _TS.pack(max(hi, 0))


JOIN_ROWS = b"\x03"  # format 1: + side + join key -> the key's buffered events (msgpack)
JOIN_EXPIRY = b"\x04"  # format 1: + side + expiry + time + partition + offset + key -> b""
JOIN_SEGMENTS = b"\x05"  # + side + max expiry + batch + n -> a side's events (Arrow IPC)
JOIN_MATCHED = b"\x06"  # + left segment id + batch -> its rows paired then (int32s)
JOIN_WATERMARK = b"\x07"  # -> the watermark (ms) of the batch that wrote this version
JOIN_SEGMENT_DATA = b"\x08"  # + a segment's name -> its events (Arrow IPC)
_EXPIRY = struct.Struct(">QQIQ")  # expiry, time, log partition, offset
_SEGMENT = struct.Struct(">QQB")  # max expiry, batch, n


def join_segment_key(side: bytes, max_expiry_ms: int, batch: int, n: int) -> bytes:
    """Where a segment of ``side`` (one byte) written by ``batch`` lives; its id is the
    key less the first two bytes."""
    return JOIN_SEGMENTS + side + _SEGMENT.pack(max(max_expiry_ms, 0), batch, n)


def split_join_segment_key(data: bytes) -> tuple[int, bytes]:
    """(max expiry, segment id) of a :func:`join_segment_key`."""
    (max_expiry,) = _TS.unpack_from(data, 2)
    return int(max_expiry), data[2:]


def join_segment_data_key(name: bytes) -> bytes:
    """Where the events of the segment named ``name`` live."""
    return JOIN_SEGMENT_DATA + name


def join_segments_until(side: bytes, upto_ms: int) -> tuple[bytes, bytes]:
    """The range of ``side``'s segments whose every event expires at or before
    ``upto_ms``."""
    return JOIN_SEGMENTS + side, JOIN_SEGMENTS + side + _TS.pack(max(upto_ms + 1, 0))


def join_matched_key(segment: bytes, batch: int) -> bytes:
    """The rows of left segment ``segment`` (its id) that ``batch`` paired."""
    return JOIN_MATCHED + segment + _TS.pack(batch)


def join_matched_until(upto_ms: int) -> tuple[bytes, bytes]:
    """The range of the matched rows of left segments whose max expiry is at or before
    ``upto_ms``."""
    return JOIN_MATCHED, JOIN_MATCHED + _TS.pack(max(upto_ms + 1, 0))


def join_rows_key(side: bytes, key: bytes) -> bytes:
    """Format 1: the buffered events of ``side`` (one byte) with join key ``key``."""
    return JOIN_ROWS + side + key


def join_expiry_key(side: bytes, expires_ms: int, ts: int, partition: int, offset: int,
                    key: bytes) -> bytes:  # fmt: skip
    """Format 1: the index entry of one buffered event, dropped at ``expires_ms``."""
    return JOIN_EXPIRY + side + _EXPIRY.pack(max(expires_ms, 0), ts, partition, offset) + key
