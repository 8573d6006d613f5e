"""One version's changes, as written to durable storage.

Layout: ``RBCL`` magic, format byte ``1``, a msgpack document
``{"version": v, "base": b, "ops": [[kind, a, b], ...]}``, then a CRC32 of everything
before it. ``base`` is the version these changes were applied on top of, so a reader
can tell the chain it belongs to.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from riverbed.state.base import Op
from riverbed.state.errors import CorruptStateError

_MAGIC = b"RBCL\x01"


@dataclass(frozen=True)
class Changelog:
    version: int
    base: int
    ops: list[Op]

    def encode(self) -> bytes:
        body: bytes = _MAGIC + msgpack.packb(
            {"version": self.version, "base": self.base, "ops": [list(op) for op in self.ops]}
        )
        return body + zlib.crc32(body).to_bytes(4, "big")

    @classmethod
    def decode(cls, raw: bytes, where: str = "changelog") -> Changelog:
        if len(raw) < len(_MAGIC) + 4 or not raw.startswith(_MAGIC):
            raise CorruptStateError(f"{where} is not a riverbed changelog")
        body, crc = raw[:-4], int.from_bytes(raw[-4:], "big")
        if zlib.crc32(body) != crc:
            raise CorruptStateError(f"{where} failed its checksum (torn or altered file)")
        doc = msgpack.unpackb(body[len(_MAGIC) :])
        ops: list[Op] = [(str(k), bytes(a), bytes(b)) for k, a, b in doc["ops"]]  # type: ignore[misc]
        return cls(int(doc["version"]), int(doc["base"]), ops)


def make(version: int, base: int, ops: Sequence[Op]) -> Changelog:
    return Changelog(version, base, list(ops))
