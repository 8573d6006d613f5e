"""Session windows: the pure core (cutting a batch's events into sessions, merging
sessions), below the engine's state I/O (:func:`riverbed.stream.engine.merge_partition`).

A session of a key is a maximal run of its events each at most ``gap`` after the one
before; it is ``[first event, last event + gap]`` — Spark's ``session_window`` (two
events exactly ``gap`` apart share a session, as in Spark and Flink). Equivalently:
every event stands for the interval ``[t, t + gap]``, and a session is a connected
component of those intervals. That is what makes sessions mergeable like any partial:
sessions cut from any subset of the events (a task's share, a batch) merge into the
sessions of all the events by joining the ones that overlap or touch — in any order,
across tasks, batches and restarts.

**Watermark.** An event before the watermark is late (:func:`riverbed.windows.
late`); a session whose end is before the watermark is closed — emitted once by
``output="final"``, kept ``keep_closed`` longer for queries, then dropped. An on-time
event (at or after the watermark) can only touch a session that ends at or after it,
so a closed session never changes again.

**What a merge changes in the result table.** A session that absorbed new events is
emitted again (``update``); a stored session that was absorbed into one starting
earlier (a late-arriving first event, or a bridge to the session before) is
*removed*: the result table gets a tombstone for its ``(window_start, key)``
(``deleted`` is true), and the sinks a delete (:mod:`riverbed.stream.sinks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

END = "_end"  # a session partial's end (ms) beside its metrics' partials (metric
# names start with a letter, so it never meets one)

Stored = tuple[int, int, dict[str, Any]]  # (start ms, end ms, {metric: partial})


def cut(ts: np.ndarray, codes: np.ndarray, gap: int) -> tuple[np.ndarray, list[int]]:
    """The sessions of a frame of events (times in ms, key codes): the order that sorts
    them by (key, time), and the bounds of each session's run in that order."""
    order = np.lexsort((ts, codes))
    ts_o, codes_o = ts[order], codes[order]
    breaks = np.flatnonzero((np.diff(codes_o) != 0) | (np.diff(ts_o) > gap)) + 1
    return order, [0, *breaks.tolist(), len(order)]


@dataclass
class Merged:
    """What merging a key's new sessions into its stored ones did."""

    sessions: list[Stored]  # every session of the key now, by start
    changed: list[Stored] = field(default_factory=list)  # new or grown: emit them
    gone: list[tuple[int, int]] = field(default_factory=list)  # stored (start, end) replaced
    removed: list[int] = field(default_factory=list)  # stored starts no session has now


def merge(
    stored: list[Stored],
    incoming: list[Stored],
    combine: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
) -> Merged:
    """Merge ``incoming`` sessions (any order, overlapping each other or not) into a
    key's ``stored`` ones (disjoint, by start). Sessions that overlap or touch become
    one; ``combine`` merges two sessions' partials."""
    if not stored and len(incoming) == 1:  # a key's first session: nothing to merge
        return Merged(sessions=[incoming[0]], changed=[incoming[0]])
    tagged = sorted(
        [(s, e, p, True) for s, e, p in stored] + [(s, e, p, False) for s, e, p in incoming],
        key=lambda t: (t[0], t[1], not t[3]),  # stored first among equals: a stable order
    )
    out = Merged(sessions=[])
    group: list[tuple[int, int, dict[str, Any], bool]] = []
    end = -1

    def close() -> None:
        start = group[0][0]
        partials = group[0][2]
        for g in group[1:]:
            partials = combine(partials, g[2])
        out.sessions.append((start, end, partials))
        if len(group) == 1 and group[0][3]:
            return  # a stored session nothing touched
        out.changed.append((start, end, partials))
        for s, e, _, was_stored in group:
            if was_stored:
                out.gone.append((s, e))
                if s != start:
                    out.removed.append(s)

    for item in tagged:
        if group and item[0] > end:
            close()
            group = []
        group.append(item)
        end = item[1] if len(group) == 1 else max(end, item[1])
    if group:
        close()
    return out


def split_closed(sessions: list[Stored], before: int) -> tuple[list[Stored], list[Stored]]:
    """(the sessions that end before ``before``, the others)."""
    return [s for s in sessions if s[1] < before], [s for s in sessions if s[1] >= before]
