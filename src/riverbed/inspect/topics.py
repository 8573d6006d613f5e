"""Topics: their partitions and records, and the record browser's filters."""

from __future__ import annotations

import json
import re
from typing import Any

from riverbed.inspect.sources import QueryError, Sources, jsonable


def topics(src: Sources) -> list[dict[str, Any]]:
    """Every topic: its partitions with first/next offsets and bytes."""
    return [topic(src, name) for name in src.log.topics()]


def objects(src: Sources) -> dict[str, Any] | None:
    """Diskless topics: objects written per second, bytes per object, a flush's mean time
    and the read cache's hit ratio across the log's processes; None for other logs."""
    stats: dict[str, Any] | None = src.log.storage.object_stats()
    return stats


def topic(src: Sources, name: str) -> dict[str, Any]:
    log = src.log
    if name not in log.topics():
        known = ", ".join(log.topics()[:20]) or "none"
        raise QueryError(f"no topic '{name}' in {log.url} (topics: {known})")
    config = log.topic(name)
    parts = []
    for p in range(config.partitions):
        start, end = log.storage.offsets(name, p)
        parts.append(
            {
                "partition": p,
                "start": start,
                "end": end,
                "records": end - start,
                "bytes": log.storage.size(name, p),
            }
        )
    return {
        "name": name,
        "partitions": parts,
        "serde": config.serde,
        "schema": config.schema,
        "records": sum(p["records"] for p in parts),
        "bytes": sum(p["bytes"] or 0 for p in parts),
        "skipped": [
            {"partition": s.partition, "start": s.start, "end": s.end, "reason": s.reason}
            for s in config.skipped
        ],
    }


_WHERE = re.compile(r"\s*([A-Za-z_][\w.]*)\s*(=|!=|~)\s*(.*)\Z")


def parse_where(text: str) -> tuple[str, str, str]:
    """``field=value``, ``field!=value`` or ``field~text`` (contains) on a record's
    value fields (dotted for nested ones)."""
    match = _WHERE.match(text)
    if not match:
        raise QueryError(
            f"filter {text!r} is not FIELD=VALUE, FIELD!=VALUE or FIELD~TEXT "
            "(e.g. flag=flag-03 or user.name~ann)"
        )
    return match.group(1), match.group(2), match.group(3).strip()


def _field(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def _matches(value: Any, where: tuple[str, str, str]) -> bool:
    name, op, wanted = where
    found = _field(value, name)
    if found is _MISSING:
        return False
    text = found if isinstance(found, str) else json.dumps(jsonable(found))
    if op == "~":
        return wanted in text
    return (text == wanted) == (op == "=")


def browse(
    src: Sources,
    name: str,
    partition: int,
    *,
    offset: int | None = None,
    at_ms: int | None = None,
    key: str | None = None,
    where: str | None = None,
    limit: int = 50,
    scan: int = 10_000,
) -> dict[str, Any]:
    """Records of one partition from ``offset`` (or the first at/after ``at_ms``), those
    with ``key`` and matching ``where``; at most ``limit`` of them, looking at no more
    than ``scan`` records. Says how many it scanned of how many there are, and where
    the next page starts."""
    info = topic(src, name)
    if not 0 <= partition < len(info["partitions"]):
        raise QueryError(
            f"topic '{name}' has partitions 0..{len(info['partitions']) - 1}, not {partition}"
        )
    part = info["partitions"][partition]
    first, end = part["start"], part["end"]
    if offset is not None and at_ms is not None:
        raise QueryError("seek by offset or by time, not both")
    start = first if offset is None else max(first, min(offset, end))
    if at_ms is not None:
        start = src.log.storage.offset_for_time(name, partition, at_ms)
    condition = parse_where(where) if where else None
    wanted_key = key.encode() if key is not None else None
    log = src.log
    found: list[dict[str, Any]] = []
    scanned = 0
    position = start
    while position < end and scanned < scan and len(found) < limit:
        batch = log.read(name, partition, position, min(500, scan - scanned))
        if not batch:
            break
        for record in batch:
            scanned += 1
            position = record.offset + 1
            if wanted_key is not None and record.key != wanted_key:
                continue
            if condition is not None and not _matches(record.value, condition):
                continue
            found.append(
                {
                    "offset": record.offset,
                    "timestamp": record.timestamp.isoformat(),
                    "key": None if record.key is None else jsonable(record.key),
                    "value": jsonable(record.value),
                    "headers": {k: jsonable(v) for k, v in record.headers.items()},
                }
            )
            if len(found) >= limit or scanned >= scan:
                break
    return {
        "topic": name,
        "partition": partition,
        "from": start,
        "next": position,
        "first": first,
        "end": end,
        "records": found,
        "scanned": scanned,
        "of": end - start,
        "more": position < end,
    }
