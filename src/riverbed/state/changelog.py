"""One version's changes, as written to durable storage.

Layout::

    b"RBCL\\x03" | version u64 | base u64 | base_tag u32
    | zstd(msgpack([[kind, a, b], ...])) | crc32 u32

Format 2 (written before riverbed compressed changelogs) has the msgpack body as is; it
is still read. zstd at level 1 (the level is the writer's; every level reads the same):
on the stream's changelogs about a third of the bytes for ~0.1 ms per batch and
partition; on a join's buffered events and a state of many keys half the time of level
3 for 0-5 % more bytes (``benchmarks/compression.py``).

``base`` is the version these changes were applied on top of and ``base_tag`` that
version's tag; the tag of a changelog is its CRC trailer. Header and trailer have
fixed sizes, so planning a rebuild (:func:`peek`) reads two small ends of each file
instead of decoding every operation.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from functools import cached_property

import msgpack
import zstandard

from riverbed.checksum import crc32
from riverbed.formats import CURRENT, check
from riverbed.state.base import Op
from riverbed.state.errors import CorruptStateError

_MAGIC = b"RBCL" + bytes([CURRENT["state changelog"]])
_READ = (2, CURRENT["state changelog"])  # 2: the body not compressed
_HEADER = struct.Struct(">QQI")
ZSTD_LEVEL = 1
HEAD_SIZE = len(_MAGIC) + _HEADER.size
TAIL_SIZE = 4


@dataclass(frozen=True)
class Header:
    version: int
    base: int
    base_tag: int
    tag: int


def peek(head: bytes, tail: bytes, where: str = "changelog") -> Header:
    """The header and tag from the first HEAD_SIZE and last TAIL_SIZE bytes of a changelog."""
    if head.startswith(_MAGIC[:4]) and len(head) > 4:  # the byte after RBCL: its format
        check("state changelog", head[4], where)
    known = len(head) >= HEAD_SIZE and head.startswith(_MAGIC[:4]) and head[4] in _READ
    if not known or len(tail) != TAIL_SIZE:
        raise CorruptStateError(f"{where} is not a riverbed changelog")
    version, base, base_tag = _HEADER.unpack_from(head, len(_MAGIC))
    return Header(version, base, base_tag, int.from_bytes(tail, "big"))


@dataclass(frozen=True)
class Changelog:
    version: int
    base: int
    base_tag: int  # tag of the base version: detects a base rewritten since
    ops: list[Op]

    @cached_property
    def raw(self) -> bytes:
        packed = msgpack.packb(self.ops)  # (tuples pack as arrays, as lists do)
        body: bytes = (
            _MAGIC
            + _HEADER.pack(self.version, self.base, self.base_tag)
            + _compressor().compress(packed)
        )
        return body + crc32(body).to_bytes(4, "big")

    @property
    def tag(self) -> int:
        """The changelog's checksum: identifies this exact version of the history."""
        return int.from_bytes(self.raw[-4:], "big")

    def encode(self) -> bytes:
        return self.raw

    @classmethod
    def decode(cls, raw: bytes, where: str = "changelog") -> Changelog:
        header = peek(raw[:HEAD_SIZE], raw[-TAIL_SIZE:], where)
        body = raw[:-TAIL_SIZE]
        if crc32(body) != header.tag:
            raise CorruptStateError(f"{where} failed its checksum (torn or altered file)")
        try:
            packed = body[HEAD_SIZE:]
            if raw[4] != 2:
                packed = _decompressor().decompress(packed)
            doc = msgpack.unpackb(packed)
        except (ValueError, zstandard.ZstdError) as exc:
            raise CorruptStateError(f"{where} cannot be decoded ({exc})") from exc
        ops: list[Op] = [(str(k), bytes(a), bytes(b)) for k, a, b in doc]  # type: ignore[misc]
        decoded = cls(header.version, header.base, header.base_tag, ops)
        # its bytes are the file's: a changelog of an older format keeps its tag (the
        # history names it by its CRC), never re-encoded in today's format
        decoded.__dict__["raw"] = bytes(raw)
        return decoded


_LOCAL = threading.local()  # zstd contexts are not thread-safe: one pair per thread


def _compressor() -> zstandard.ZstdCompressor:
    if not hasattr(_LOCAL, "c"):
        _LOCAL.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return _LOCAL.c  # type: ignore[no-any-return]


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_LOCAL, "d"):
        _LOCAL.d = zstandard.ZstdDecompressor()
    return _LOCAL.d  # type: ignore[no-any-return]
