"""Value codecs: msgpack for small structured values, raw bytes for sketches. No pickle:
state must be readable by another Python version, another machine, and other tools."""

from __future__ import annotations

from typing import Any

import msgpack

from riverbed.state.errors import CorruptStateError


def encode(value: Any) -> bytes:
    """msgpack-encode ints, floats, str, bytes, lists, dicts (and nesting)."""
    try:
        data: bytes = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cannot store {type(value).__name__} as a state value ({exc}); use plain "
            "ints, floats, str, bytes, lists and dicts, or encode it to bytes yourself"
        ) from exc
    return data


def decode(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData) as exc:
        raise CorruptStateError(f"state value is not msgpack ({exc})") from exc
