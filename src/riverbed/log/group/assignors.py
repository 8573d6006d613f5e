"""Partition assignment strategies: pure functions, no I/O.

Each takes the live members, the partitions to cover and the previous assignment,
and returns ``{partition: member}`` — one owner per partition by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, str]
Assignor = Callable[
    [Sequence[str], Sequence[TopicPartition], Mapping[TopicPartition, str]], Assignment
]


def range_assignor(
    members: Sequence[str],
    partitions: Sequence[TopicPartition],
    previous: Mapping[TopicPartition, str],
) -> Assignment:
    """Per topic, contiguous ranges of partitions to members in sorted order (Kafka's
    RangeAssignor): partition p of every topic tends to land on the same member."""
    out: Assignment = {}
    ordered = sorted(members)
    if not ordered:
        return out
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(p)
    for topic, parts in by_topic.items():
        parts.sort()
        per, extra = divmod(len(parts), len(ordered))
        i = 0
        for n, member in enumerate(ordered):
            take = per + (1 if n < extra else 0)
            for p in parts[i : i + take]:
                out[(topic, p)] = member
            i += take
    return out


def round_robin_assignor(
    members: Sequence[str],
    partitions: Sequence[TopicPartition],
    previous: Mapping[TopicPartition, str],
) -> Assignment:
    """All partitions, sorted, dealt to sorted members in turn."""
    ordered = sorted(members)
    if not ordered:
        return {}
    return {tp: ordered[i % len(ordered)] for i, tp in enumerate(sorted(partitions))}


def sticky_assignor(
    members: Sequence[str],
    partitions: Sequence[TopicPartition],
    previous: Mapping[TopicPartition, str],
) -> Assignment:
    """Balanced (sizes differ by at most one) while moving as few partitions as
    possible: a partition stays with its previous owner while that owner is live and
    under its quota."""
    ordered = sorted(members)
    if not ordered:
        return {}
    n = len(partitions)
    low = n // len(ordered)
    high = math.ceil(n / len(ordered))
    highs_left = n - low * len(ordered)  # how many members may hold `high`
    load = dict.fromkeys(ordered, 0)
    out: Assignment = {}
    live = set(ordered)
    # 1. keep what can stay, up to the quota
    for tp in sorted(partitions):
        owner = previous.get(tp)
        if owner in live:
            assert owner is not None
            cap = high if highs_left > 0 or load[owner] < low else low
            if load[owner] < low or (load[owner] < cap and highs_left > 0):
                if load[owner] == low:
                    highs_left -= 1
                load[owner] += 1
                out[tp] = owner
    # 2. hand out the rest to the least loaded
    for tp in sorted(partitions):
        if tp in out:
            continue
        member = min(ordered, key=lambda m: (load[m], m))
        load[member] += 1
        out[tp] = member
    return out


ASSIGNORS: dict[str, Assignor] = {
    "range": range_assignor,
    "round-robin": round_robin_assignor,
    "sticky": sticky_assignor,
}
