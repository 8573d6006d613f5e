"""The shuffled path's values (riverbed.stream.lognative, riverbed.stream.chain): a
piece's partials grouped by the state partition their keys belong to, each group
crossing the shuffle as one msgpack value — one value a partition and piece for Spark
to move, not one a (window, key) through PySpark's pickling (a quarter of a q11 task's
time, docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgpack
import pandas as pd

from riverbed.stream.engine import state_partition_of
from riverbed.stream.grouping import Partial


def owned(partials: list[Partial], n: int) -> dict[int, list[Partial]]:
    """The partials per state partition (of ``n``) their keys belong to."""
    if not partials:
        return {}
    owners = state_partition_of(pd.Series([key for _, key, _ in partials]), n).tolist()
    out: dict[int, list[Partial]] = {}
    for p, partial in zip(owners, partials, strict=True):
        if p in out:
            out[p].append(partial)
        else:
            out[p] = [partial]
    return out


def packed(partials: list[Partial]) -> bytes:
    """A shuffle's value: a state partition's share of a piece's partials, as one
    msgpack array of ``[start, key, partials]``."""
    blob: bytes = msgpack.packb(partials, use_bin_type=True)
    return blob


def values(partials: list[Partial], n: int) -> list[tuple[int, bytes]]:
    """A piece's partials as shuffle values: (state partition of ``n``, :func:`packed`
    share), one a partition it has partials for."""
    return [(p, packed(share)) for p, share in owned(partials, n).items()]


def unpacked(values: Iterable[bytes]) -> Iterator[Partial]:
    """The partials of :func:`packed` shuffle values, in their order."""
    for blob in values:
        yield from msgpack.unpackb(blob, raw=False)
