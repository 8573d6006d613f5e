"""Serializers for record values. A topic remembers its serde by name."""

from __future__ import annotations

import json
from typing import Any, Protocol

import msgpack

from riverbed.log.errors import SerdeError


class Serde(Protocol):
    name: str

    def serialize(self, value: Any) -> bytes: ...

    def deserialize(self, data: bytes) -> Any: ...


class JsonSerde:
    name = "json"

    def serialize(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), default=_iso).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"value is not JSON-serializable: {exc}") from exc

    def deserialize(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerdeError(f"record value is not JSON ({exc}): {data[:60]!r}") from exc


def _iso(value: Any) -> str:
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


class MsgpackSerde:
    name = "msgpack"

    def serialize(self, value: Any) -> bytes:
        try:
            data: bytes = msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"value is not msgpack-serializable: {exc}") from exc
        return data

    def deserialize(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, raw=False)
        except ValueError as exc:
            raise SerdeError(f"record value is not msgpack ({exc})") from exc


class BytesSerde:
    name = "bytes"

    def serialize(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        if not isinstance(value, bytes | bytearray | memoryview):
            raise SerdeError(f"the bytes serde takes bytes or str, not {type(value).__name__}")
        return bytes(value)

    def deserialize(self, data: bytes) -> Any:
        return data


BUILTIN_SERDES: dict[str, Serde] = {s.name: s for s in (JsonSerde(), MsgpackSerde(), BytesSerde())}
