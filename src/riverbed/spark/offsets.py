"""Which offsets a micro-batch of a riverbed topic reads — the pure admission control
shared by the Spark source's ``latestOffset`` (:mod:`riverbed.spark.source`) and the
stream's own trigger loop (:mod:`riverbed.stream.loop`).

Nothing here touches a log, a file or Spark: offsets go in, offsets come out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from riverbed.errors import RiverbedError

__all__ = ["TriggerError", "batch_ends", "begin_offsets", "capped", "source_limits"]

K = TypeVar("K")


class TriggerError(RiverbedError, ValueError):
    """A trigger or a source limit the loop cannot run with."""


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
