"""CRC-32 with zlib's polynomial and values, ~17x faster than ``zlib.crc32`` where
python-isal (Intel ISA-L, carry-less multiply) is installed — a dependency, so always,
barring a platform without its wheels, where zlib's serves. Every batch of the log, its
changelogs and snapshots are checked with it on every read, so it is on the hot path
of readers and of the log server (a fifth of the server's CPU with zlib's, measured)."""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal ships wheels for our platforms
    from zlib import crc32

__all__ = ["crc32"]
