"""When the next micro-batch runs and how its work is spread: the pure core of the
log-native trigger loop (:mod:`riverbed.stream.loop`). Which offsets a batch reads is
decided by :mod:`riverbed.spark.offsets`, shared with the Spark source.

Nothing here touches a log, a file or Spark: offsets go in, offsets come out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from riverbed.log.base import TopicConfig, next_boundary, placed_by
from riverbed.spark.offsets import TriggerError

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class Trigger:
    """``available_now``: process what the topic holds when the query starts (in batches
    of at most ``maxRecordsPerBatch``), then stop. Otherwise a batch every
    ``interval_s`` seconds while there is input."""

    available_now: bool = False
    interval_s: float = 1.0


_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
}
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_trigger(trigger: Mapping[str, Any] | None) -> Trigger:
    """Spark's ``trigger(...)`` keywords: ``availableNow=True``, ``once=True`` (the same
    here) or ``processingTime="2 seconds"`` (default ``"1 second"``)."""
    if not trigger:
        return Trigger()
    known = {"availableNow", "once", "processingTime"}
    unknown = set(trigger) - known
    if unknown or len(trigger) != 1:
        raise TriggerError(
            f"trigger {dict(trigger)!r} is not one of availableNow=True, once=True or "
            'processingTime="<n> seconds"'
        )
    ((kind, value),) = trigger.items()
    if kind in ("availableNow", "once"):
        if value is not True:
            raise TriggerError(f"trigger {kind} must be True, not {value!r}")
        return Trigger(available_now=True)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _INTERVAL.match(str(value).lower())
        if match is None or match.group(2) not in _UNITS:
            raise TriggerError(
                f"processingTime {value!r} is not an interval: write e.g. '1 second', "
                "'500 milliseconds' or '2 minutes'"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise TriggerError(f"processingTime must not be negative, not {value!r}")
    return Trigger(interval_s=seconds)


def balanced_groups(items: Sequence[T], size: Callable[[T], int], bins: int) -> list[list[T]]:
    """``items`` in at most ``bins`` groups of about equal total ``size``: the longest-
    processing-time rule (biggest first, each into the lightest group so far), which is
    within 4/3 of the best split. Groups keep biggest-first order; none is empty."""
    bins = max(1, min(bins, len(items)))
    groups: list[list[T]] = [[] for _ in range(bins)]
    loads = [0] * bins
    for item in sorted(items, key=size, reverse=True):
        lightest = min(range(bins), key=lambda i: (loads[i], len(groups[i])))
        groups[lightest].append(item)
        loads[lightest] += size(item)
    return [g for g in groups if g]


def slices_json(begin: Mapping[int, int], ends: Mapping[int, int]) -> dict[str, list[int]]:
    """A batch's plan as its record stores it: ``{"<partition>": [start, end]}``."""
    return {str(p): [int(begin[p]), int(ends[p])] for p in sorted(ends)}


def ends_of(slices: Mapping[str, list[int]]) -> dict[int, int]:
    """The end offset per partition of a stored plan."""
    return {int(p): int(se[1]) for p, se in slices.items()}


def within_placement(
    config: TopicConfig, begin: Mapping[int, int], latest: Mapping[int, int]
) -> dict[int, int]:
    """``latest`` offsets no further than the next place where the topic's placement
    changes (``topic alter --partitions``) past ``begin``: a batch then lies in one
    placement in every partition, and once the aggregation's state has the topic's new
    count, its batches are co-located again from there (:func:`co_located`)."""
    out = dict(latest)
    for p, end in latest.items():
        boundary = next_boundary(config, p, begin.get(p, 0))
        if boundary is not None:
            out[p] = min(end, boundary)
    return out


def co_located(config: TopicConfig, slices: Mapping[str, Sequence[int]], state: int) -> bool:
    """Whether a batch's ``slices`` can run co-located with ``state`` state partitions:
    one slice per state partition, each with its records placed by that many partitions
    (records from before an alter to another count go through the shuffle)."""
    if len(slices) != state:
        return False
    for p, (start, end) in slices.items():
        count = placed_by(config, int(p), int(start), int(end))
        if int(end) > int(start) and count != state:
            return False
    return True


def has_input(slices: Mapping[str, list[int]]) -> bool:
    return any(int(e) > int(s) for s, e in slices.values())


__all__ = [
    "Trigger",
    "TriggerError",
    "balanced_groups",
    "co_located",
    "ends_of",
    "has_input",
    "parse_trigger",
    "slices_json",
    "within_placement",
]
