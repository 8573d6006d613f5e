"""riverbed.checksum.crc32 is zlib's CRC-32, value for value (stored batches,
changelogs and snapshots written with either read with the other)."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from riverbed.checksum import crc32


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 64))
def test_crc32_is_zlibs(data: bytes, start: int, cut: int) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)
    view = memoryview(data)[cut:]
    assert crc32(view) == zlib.crc32(view)
    assert crc32(data[cut:], crc32(data[:cut])) == zlib.crc32(data)
