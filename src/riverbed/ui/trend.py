"""Trends the console shows: rates from counters, and when a lag drains.

Pure: samples in, numbers out (no clock, no I/O), so every rule is tested with
Hypothesis. The console's sampler feeds one :class:`Trend` per series (a topic's end
offset, a group's total lag) and asks it for a rate or a drain estimate.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Point = tuple[float, float]  # (epoch seconds, value)


def rate(points: Sequence[Point]) -> float | None:
    """Per second, of a counter that only grows (an end offset): over the whole span.
    None with fewer than two points or no time between them. A counter that went
    back (a topic recreated) counts from where it restarted."""
    if len(points) < 2:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    grown = 0.0
    for (_, before), (_, after) in itertools.pairwise(points):
        grown += after - before if after >= before else after
    return grown / span


def slope(points: Sequence[Point]) -> float | None:
    """Least-squares change per second; None when it cannot be told (fewer than two
    points, or all at one instant)."""
    n = len(points)
    if n < 2:
        return None
    t0 = points[0][0]
    mean_t = sum(t - t0 for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - t0 - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return None
    cov = sum((t - t0 - mean_t) * (v - mean_v) for t, v in points)
    return cov / var


def drain_seconds(points: Sequence[Point]) -> float | None:
    """Seconds until a lag reaches zero at its recent trend: 0 when it is zero now,
    None when it is not shrinking (it will not drain at this pace) or cannot be told."""
    if not points:
        return None
    now = points[-1][1]
    if now <= 0:
        return 0.0
    s = slope(points)
    # a flat series can come out a hair below zero in floating point: that is not draining
    if s is None or s >= -1e-9 * max(1.0, abs(now)):
        return None
    return now / -s


def describe_drain(seconds: float | None, lag: float) -> str:
    """ "drained", "≈ 3 min", or "not draining" — what the pages print."""
    if lag <= 0:
        return "drained"
    if seconds is None:
        return "not draining"
    if seconds < 90:
        return f"≈ {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"≈ {seconds / 60:.0f} min"
    return f"≈ {seconds / 3600:.1f} h"


@dataclass
class Trend:
    """The newest ``keep`` points of one series, oldest first."""

    keep: int = 120

    def __post_init__(self) -> None:
        self._points: deque[Point] = deque(maxlen=self.keep)

    def add(self, at: float, value: float) -> None:
        """Add a point; one older than the newest is ignored (clocks never run back
        here, but a sample taken late must not reorder the series)."""
        if self._points and at < self._points[-1][0]:
            return
        if self._points and at == self._points[-1][0]:
            self._points[-1] = (at, value)
            return
        self._points.append((at, value))

    def extend(self, points: Iterable[Point]) -> None:
        for at, value in points:
            self.add(at, value)

    @property
    def points(self) -> list[Point]:
        return list(self._points)

    def recent(self, seconds: float) -> list[Point]:
        """The points within ``seconds`` of the newest."""
        if not self._points:
            return []
        since = self._points[-1][0] - seconds
        return [p for p in self._points if p[0] >= since]
