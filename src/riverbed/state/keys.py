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
the watermark passes the last time a partner could arrive:

* ``0x03 + side + key`` — the key's buffered events of that side (one value: a batch
  reads every key it pairs in one multi-get);
* ``0x04 + side + expiry time + time + log partition + offset + key`` — an index entry
  per event by when the watermark drops it, so the dropped ones are one range scan and
  their index one range delete.

A window key's first byte is 0 for every window start before the year 2,280,000, so
the five layouts never meet.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime

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


def split_window_key(data: bytes) -> tuple[datetime, bytes]:
    millis, key = split_window_key_ms(data)
    return datetime.fromtimestamp(millis / 1000, tz=UTC), key


def split_window_key_ms(data: bytes) -> tuple[int, bytes]:
    """:func:`split_window_key` with the window start in epoch milliseconds."""
    (millis,) = _TS.unpack_from(data)
    return int(millis), data[_TS.size :]


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


JOIN_ROWS = b"\x03"  # + side + join key -> the key's buffered events of that side
JOIN_EXPIRY = b"\x04"  # + side + expiry + time + partition + offset + join key -> b""
_EXPIRY = struct.Struct(">QQIQ")  # expiry, time, log partition, offset


def join_rows_key(side: bytes, key: bytes) -> bytes:
    """The buffered events of ``side`` (one byte) with join key ``key``."""
    return JOIN_ROWS + side + key


def join_expiry_key(side: bytes, expires_ms: int, ts: int, partition: int, offset: int,
                    key: bytes) -> bytes:  # fmt: skip
    """The index entry of one buffered event, dropped at ``expires_ms``."""
    return JOIN_EXPIRY + side + _EXPIRY.pack(max(expires_ms, 0), ts, partition, offset) + key


def split_join_expiry_key(data: bytes) -> tuple[int, int, int, bytes]:
    """(time, partition, offset, join key) of a :func:`join_expiry_key`."""
    _, ts, partition, offset = _EXPIRY.unpack_from(data, 2)
    return int(ts), int(partition), int(offset), data[2 + _EXPIRY.size :]


def join_expiring(side: bytes, upto_ms: int) -> tuple[bytes, bytes]:
    """The range of index entries of ``side`` that expire at or before ``upto_ms``."""
    return JOIN_EXPIRY + side + _TS.pack(0), JOIN_EXPIRY + side + _TS.pack(max(upto_ms + 1, 0))
