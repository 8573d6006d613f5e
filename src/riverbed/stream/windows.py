"""Event-time windows: pure assignment of timestamps (ms) to window starts.

* :class:`Tumbling` ("1h") — fixed, non-overlapping; each event in exactly one window.
* :class:`Hopping` ("1h", hop="15m") — fixed size, starting every ``hop``; an event is
  in ``size / hop`` windows.
* :class:`Sliding` ("1h", step="1m") — "the last hour, as of every minute": windows of
  ``size`` ending at every ``step`` boundary. (Mathematically a hopping window keyed by
  its end; it reads as a rolling metric.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from riverbed.durations import duration_ms
from riverbed.stream.errors import StreamValueError


@dataclass(frozen=True)
class Tumbling:
    size: str | int | timedelta

    @property
    def size_ms(self) -> int:
        return duration_ms(self.size)

    @property
    def hop_ms(self) -> int:
        return self.size_ms

    def starts(self, ts_ms: np.ndarray) -> list[np.ndarray]:
        """For each window an event can fall in, the array of window starts."""
        return _hop_starts(ts_ms, self.size_ms, self.hop_ms)


@dataclass(frozen=True)
class Hopping:
    size: str | int | timedelta
    hop: str | int | timedelta

    def __post_init__(self) -> None:
        if self.size_ms % self.hop_ms:
            raise StreamValueError(
                f"hopping window size {self.size} must be a multiple of hop {self.hop}"
            )

    @property
    def size_ms(self) -> int:
        return duration_ms(self.size)

    @property
    def hop_ms(self) -> int:
        return duration_ms(self.hop)

    def starts(self, ts_ms: np.ndarray) -> list[np.ndarray]:
        return _hop_starts(ts_ms, self.size_ms, self.hop_ms)


@dataclass(frozen=True)
class Sliding:
    size: str | int | timedelta
    step: str | int | timedelta = "1m"

    def __post_init__(self) -> None:
        if self.size_ms % self.step_ms:
            raise StreamValueError(
                f"sliding size {self.size} must be a multiple of step {self.step}"
            )

    @property
    def size_ms(self) -> int:
        return duration_ms(self.size)

    @property
    def step_ms(self) -> int:
        return duration_ms(self.step)

    @property
    def hop_ms(self) -> int:
        return self.step_ms

    def starts(self, ts_ms: np.ndarray) -> list[np.ndarray]:
        return _hop_starts(ts_ms, self.size_ms, self.step_ms)


Window = Tumbling | Hopping | Sliding


def _hop_starts(ts_ms: np.ndarray, size: int, hop: int) -> list[np.ndarray]:
    if size <= 0 or hop <= 0:
        raise StreamValueError("window size and hop must be positive")
    last = (ts_ms // hop) * hop  # the latest window start at or before ts
    return [last - i * hop for i in range(size // hop)]
