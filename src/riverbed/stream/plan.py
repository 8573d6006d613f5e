"""Which offsets a micro-batch reads, and when the next one runs: the pure core of the
log-native trigger loop (:mod:`riverbed.stream.query`) and of the Spark source's
``latestOffset`` (:mod:`riverbed.stream.source`).

Nothing here touches a log, a file or Spark: offsets go in, offsets come out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from riverbed.errors import RiverbedError

K = TypeVar("K")
T = TypeVar("T")


class TriggerError(RiverbedError, ValueError):
    """A trigger or a source limit the loop cannot run with."""


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


def source_limits(options: Mapping[str, str]) -> tuple[int | None, str]:
    """``maxRecordsPerBatch`` (None: no bound) and ``startingOffsets`` (earliest or
    latest) of a riverbed source's options (keys in lower case)."""
    max_records = options.get("maxrecordsperbatch")
    if max_records is not None and (not max_records.isdigit() or int(max_records) < 1):
        raise TriggerError(f"maxRecordsPerBatch must be a positive integer, not {max_records!r}")
    start = options.get("startingoffsets", "earliest")
    if start not in ("earliest", "latest"):
        raise TriggerError(f"startingOffsets must be earliest or latest, not {start!r}")
    return (int(max_records) if max_records else None), start


def begin_offsets(
    retained: Mapping[K, tuple[int, int]], previous_ends: Mapping[K, int] | None, starting: str
) -> dict[K, int]:
    """Where the next batch starts in every partition: where the previous batch ended
    (``None``: there was none, start at ``starting``), never before a partition's first
    retained offset (retention may have deleted what was not read yet), and a new
    partition at its first retained offset. ``retained`` is (first, end) per partition."""
    if previous_ends is None:
        index = 0 if starting == "earliest" else 1
        return {p: se[index] for p, se in retained.items()}
    return {p: max(int(previous_ends.get(p, first)), first) for p, (first, _) in retained.items()}


def batch_ends(
    begin: Mapping[K, int], latest: Mapping[K, int], max_rows: int | None
) -> dict[K, int]:
    """Where a batch starting at ``begin`` ends, given each partition's ``latest``
    offset and a bound on the batch's records.

    The budget is shared in proportion to each partition's backlog: partitions fed at
    different rates then advance through event time together, so a busy partition does
    not fall behind the watermark and turn into "late" data. Never moves backwards,
    never past ``latest``, and takes exactly ``min(max_rows, backlog)`` records.
    """
    ends = {p: max(begin[p], latest[p]) for p in latest}
    if max_rows is None:
        return ends
    backlog = {p: ends[p] - begin[p] for p in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return ends
    out = {p: begin[p] + backlog[p] * max_rows // total for p in latest}
    left = max_rows - sum(out[p] - begin[p] for p in latest)
    for p in sorted(latest, key=lambda q: backlog[q], reverse=True):  # rounding remainder
        if left <= 0:
            break
        if out[p] < ends[p]:
            out[p] += 1
            left -= 1
    return out


def capped(retained: Mapping[K, tuple[int, int]], target: Mapping[K, int] | None) -> dict[K, int]:
    """Each partition's end offset (``retained`` is (first, end) per partition), no
    further than an available-now ``target`` (the ends when the query started; a
    partition created since then is not read)."""
    if target is None:
        return {p: end for p, (_, end) in retained.items()}
    return {p: min(end, target.get(p, first)) for p, (first, end) in retained.items()}


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


def has_input(slices: Mapping[str, list[int]]) -> bool:
    return any(int(e) > int(s) for s, e in slices.values())


__all__ = [
    "Trigger",
    "TriggerError",
    "balanced_groups",
    "batch_ends",
    "begin_offsets",
    "capped",
    "ends_of",
    "has_input",
    "parse_trigger",
    "slices_json",
    "source_limits",
]
