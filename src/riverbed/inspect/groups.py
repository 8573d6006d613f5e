"""Consumer groups: members, assignment and lag per partition."""

from __future__ import annotations

from typing import Any

from riverbed.inspect.sources import Sources


def group_names(src: Sources) -> list[str]:
    from riverbed.log.group.consumer import list_groups

    names: list[str] = list_groups(src.control)
    return names


def group(src: Sources, name: str) -> dict[str, Any]:
    return group_of(src.log, src.control, name)


def group_of(log: Any, cp: Any, name: str) -> dict[str, Any]:
    """Members, leader, generation, and per partition owner, committed, end and lag."""
    from riverbed.log.group import describe_group

    desc = describe_group(log, cp, name)
    parts = [
        {
            "topic": p.topic,
            "partition": p.partition,
            "owner": p.owner,
            "committed": p.committed,
            "end": p.end,
            "lag": p.lag,
        }
        for p in desc.partitions
    ]
    return {
        "group": desc.group,
        "generation": desc.generation,
        "members": desc.members,
        "leader": desc.leader,
        "partitions": parts,
        "lag": sum(p["lag"] for p in parts),
    }


def groups(src: Sources) -> list[dict[str, Any]]:
    return [group(src, name) for name in group_names(src)]
