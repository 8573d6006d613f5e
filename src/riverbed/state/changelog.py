"""One version's changes, as written to durable storage.

Layout: ``RBCL`` magic, format byte ``1``, a msgpack document
``{"version": v, "base": b, "base_tag": t, "ops": [[kind, a, b], ...]}``, then a CRC32
of everything before it. ``base`` is the version these changes were applied on top
of and ``base_tag`` that version's tag (its changelog's CRC), so a reader can follow
the chain back and tell when a base was since rewritten with other contents.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cached_property

import msgpack

from riverbed.state.base import Op
from riverbed.state.errors import CorruptStateError

_MAGIC = b"RBCL\x01"


@dataclass(frozen=True)
class Changelog:
    version: int
    base: int
    base_tag: int  # tag of the base version: detects a base rewritten since
    ops: list[Op]

    @cached_property
    def raw(self) -> bytes:
        body: bytes = _MAGIC + msgpack.packb(
            {
                "version": self.version,
                "base": self.base,
                "base_tag": self.base_tag,
                "ops": [list(op) for op in self.ops],
            }
        )
        return body + zlib.crc32(body).to_bytes(4, "big")

    @property
    def tag(self) -> int:
        """The changelog's checksum: identifies this exact version of the history."""
        return int.from_bytes(self.raw[-4:], "big")

    def encode(self) -> bytes:
        return self.raw

    @classmethod
    def decode(cls, raw: bytes, where: str = "changelog") -> Changelog:
        if len(raw) < len(_MAGIC) + 4 or not raw.startswith(_MAGIC):
            raise CorruptStateError(f"{where} is not a riverbed changelog")
        body, crc = raw[:-4], int.from_bytes(raw[-4:], "big")
        if zlib.crc32(body) != crc:
            raise CorruptStateError(f"{where} failed its checksum (torn or altered file)")
        doc = msgpack.unpackb(body[len(_MAGIC) :])
        ops: list[Op] = [(str(k), bytes(a), bytes(b)) for k, a, b in doc["ops"]]  # type: ignore[misc]
        return cls(int(doc["version"]), int(doc["base"]), int(doc["base_tag"]), ops)
