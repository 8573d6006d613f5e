"""The declarative aggregation spec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from riverbed.durations import duration_ms
from riverbed.stream.errors import StreamValueError
from riverbed.stream.metrics import Metric
from riverbed.stream.windows import Window

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Aggregation:
    """What to compute, e.g. hourly unique users per feature flag::

        Aggregation(
            name="flags_hourly", key="flag", time="timestamp", window=Tumbling("1h"),
            watermark="10m", metrics={"users": Distinct("user_id"), "events": Count()},
        )

    ``state_partitions`` is fixed when the query first runs (it is recorded in the
    checkpoint; changing it later is refused). ``output``: ``update`` emits every
    window a batch changed; ``final`` emits a window once, when the watermark closes it.
    """

    name: str
    key: str
    window: Window
    metrics: Mapping[str, Metric]
    time: str = "timestamp"
    watermark: str = "0s"
    output: Literal["update", "final"] = "update"
    state_partitions: int = 8
    keep_closed: str = "0s"  # keep closed windows this long past the watermark (queries)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise StreamValueError(f"aggregation name {self.name!r}: letters, digits, '_' (max 64)")
        if not self.metrics:
            raise StreamValueError("an aggregation needs at least one metric")
        for metric_name in self.metrics:
            if not _NAME.match(metric_name):
                raise StreamValueError(f"metric name {metric_name!r}: letters, digits, '_'")
        if self.output not in ("update", "final"):
            raise StreamValueError(f"output must be update or final, not {self.output!r}")
        if self.state_partitions < 1:
            raise StreamValueError("state_partitions must be at least 1")
        duration_ms(self.watermark)
        duration_ms(self.keep_closed)
        object.__setattr__(self, "metrics", dict(self.metrics))  # a private copy

    @property
    def watermark_ms(self) -> int:
        return duration_ms(self.watermark)

    @property
    def keep_closed_ms(self) -> int:
        return duration_ms(self.keep_closed)

    def columns(self) -> list[str]:
        """Input columns the metrics read."""
        cols = [self.key, self.time]
        for metric in self.metrics.values():
            column = getattr(metric, "column", None)
            if column and column not in cols:
                cols.append(column)
        return cols
