"""Event-time windows, shared by the stream engine and time-range jobs: pure
assignment of timestamps (ms) to window starts.

* :class:`Tumbling` ("1h") — fixed, non-overlapping; each event in exactly one window.
* :class:`Hopping` ("1h", hop="15m") — fixed size, starting every ``hop``; an event is
  in ``size / hop`` windows.
* :class:`Sliding` ("1h", step="1m") — "the last hour, as of every minute": windows of
  ``size`` ending at every ``step`` boundary. (Mathematically a hopping window keyed by
  its end; it reads as a rolling metric.)
* :class:`Session` ("5m") — per key, a maximal run of events each at most ``gap`` after
  the one before; it starts at its first event and ends ``gap`` after its last (Spark's
  ``session_window``: two events exactly ``gap`` apart share a session). Sessions grow,
  start earlier and merge as events arrive: :mod:`riverbed.stream.sessions`.

Each window answers two questions every path asks the same way: which events are
*late* (:meth:`late`: every window they could count toward is closed) and which
instants an event's windows span (:meth:`span`: they must lie in 1970..9999,
riverbed.stream.validity).

A time-range job's ``Tumbling(size, column, aggs)`` metric
(:class:`riverbed.timerange.spec.Tumbling`) is this :class:`Tumbling` with what to
aggregate in it: one window, one size rule, for both engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from riverbed.durations import duration_ms
from riverbed.errors import InvalidValueError


class WindowValueError(InvalidValueError):
    """A window that cannot be: a size, hop, step or gap that is not a positive
    duration, or a size that is not a multiple of its hop or step."""


@dataclass(frozen=True)
class Tumbling:
    size: str | int | timedelta

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise WindowValueError(f"a tumbling window's size must be positive, not {self.size!r}")

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
            raise WindowValueError(
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
            raise WindowValueError(
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


@dataclass(frozen=True)
class Session:
    gap: str | int | timedelta

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise WindowValueError(f"a session's gap must be positive, not {self.gap!r}")

    @property
    def gap_ms(self) -> int:
        return duration_ms(self.gap)


Window = Tumbling | Hopping | Sliding | Session
WINDOWS = (Tumbling, Hopping, Sliding, Session)


def late(window: Window, ts_ms: np.ndarray, watermark_ms: int) -> np.ndarray:
    """Which events (times in ms) are late under ``watermark_ms``: a fixed window's
    event when its latest window ended at or before the watermark (start + size <=
    watermark, the window is closed); a session's event when it is before the
    watermark — a session closes once its end is before the watermark, so an on-time
    event can never reach a closed session (riverbed.stream.sessions)."""
    if isinstance(window, Session):
        out: np.ndarray = ts_ms < watermark_ms
        return out
    hop = window.hop_ms
    closed: np.ndarray = ts_ms // hop * hop + window.size_ms <= watermark_ms
    return closed


def late_column(window: Window, ts_ms: Any, watermark_ms: int) -> Any:
    """:func:`late` as a Spark column over event times in epoch ms."""
    from pyspark.sql import functions as F

    if isinstance(window, Session):
        return ts_ms < F.lit(watermark_ms)
    hop = window.hop_ms
    return F.floor(ts_ms / hop) * hop + window.size_ms <= F.lit(watermark_ms)


def span(window: Window, ts_ms: Any, floor: Any = None) -> tuple[Any, Any]:
    """(the earliest start, the latest end) of the windows an event at ``ts_ms`` falls
    in — numpy arrays, or Spark columns when ``floor`` is Spark's ``F.floor``. A
    session's start is an event's time and its end is ``gap`` after one."""
    if isinstance(window, Session):
        return ts_ms, ts_ms + window.gap_ms
    hop, size = window.hop_ms, window.size_ms
    last = floor(ts_ms / hop) * hop if floor is not None else ts_ms // hop * hop  # floors
    return last - (size - hop), last + size


def _hop_starts(ts_ms: np.ndarray, size: int, hop: int) -> list[np.ndarray]:
    if size <= 0 or hop <= 0:
        raise WindowValueError("window size and hop must be positive")
    last = (ts_ms // hop) * hop  # the latest window start at or before ts
    return [last - i * hop for i in range(size // hop)]
