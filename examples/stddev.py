"""A user-defined metric: the standard deviation of a column, per window and key.

A spec file like any other (``riverbed stream run examples/stddev.py``) whose metric
``spread`` is a :class:`riverbed.stream.Custom` over the aggregator below — riverbed
gives it exactly-once state, partials, the shuffle and the result table. The state
is (count, mean, M2): Welford's update for a batch of values, Chan's formula to merge
two states in any order, 24 bytes stored per window and key. The result is the
sample standard deviation, as Spark's ``stddev`` (None below two values).

Tested by ``tests/stream/test_custom.py`` against pandas on every engine path.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from riverbed.stream import Aggregation, Count, Custom, Tumbling

State = tuple[int, float, float]  # (count, mean, M2: the sum of squared deviations)


class StdDev:
    """Sample standard deviation (``riverbed.stream.Aggregator``). Spark's tasks get it
    pickled with what it uses from this file, so it keeps no unpicklable module-level
    object (a precompiled ``struct.Struct`` would be refused at start)."""

    def create(self) -> State:
        return (0, 0.0, 0.0)

    def update(self, state: State, values: pa.Array) -> State:
        data = values.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        if not len(data):
            return state
        mean = float(data.mean())
        batch = (len(data), mean, float(((data - mean) ** 2).sum()))
        return self.merge(state, batch)

    def merge(self, a: State, b: State) -> State:
        (na, ma, qa), (nb, mb, qb) = a, b
        if na == 0 or nb == 0:
            return b if na == 0 else a
        n = na + nb
        delta = mb - ma
        return (n, ma + delta * nb / n, qa + qb + delta * delta * na * nb / n)

    def result(self, state: State) -> Any:
        n, _, m2 = state
        return math.sqrt(m2 / (n - 1)) if n > 1 else None

    def to_bytes(self, state: State) -> bytes:
        return struct.pack("<qdd", *state)

    def from_bytes(self, data: bytes) -> State:
        n, mean, m2 = struct.unpack("<qdd", data)
        return (int(n), float(mean), float(m2))


source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="spread",
    key="flag",
    time="ts",
    window=Tumbling("1h"),
    watermark="10h",
    metrics={"events": Count(), "spread": Custom("amount", StdDev(), type="double")},
    state_partitions=3,
)
