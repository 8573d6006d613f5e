"""State: namespaces, partitions, versions, sizes, and keys as of a version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from riverbed.inspect.sources import QueryError, Sources, du, jsonable
from riverbed.stream.layout import STATE, child


def state(src: Sources) -> list[dict[str, Any]]:
    """Namespaces, their partitions, versions, snapshot and changelog bytes."""
    provider = src.state
    root = src.place(STATE)
    out = []
    for ns in provider.namespaces():
        parts = []
        for p in provider.partitions(ns):
            index = provider.index(ns, p)
            versions = [v for v in index.versions if v >= index.purged_through]
            base = child(child(root, ns), str(p))
            parts.append(
                {
                    "partition": p,
                    "latest": index.latest,
                    "oldest": min(versions, default=0),
                    "versions": len(versions),
                    "snapshots": sorted(index.snapshots),
                    "purged_through": index.purged_through,
                    "changelog_bytes": du(child(base, "changelog")),
                    # in a bucket a snapshot's files are shared between snapshots
                    "snapshot_bytes": du(child(base, "snapshot")) + du(child(base, "shared")),
                }
            )
        out.append(
            {
                "namespace": ns,
                "partitions": parts,
                "latest_version": max((p["latest"] for p in parts), default=0),
                "bytes": sum(p["changelog_bytes"] + p["snapshot_bytes"] for p in parts),
            }
        )
    return out


def state_keys(
    src: Sources,
    namespace: str,
    *,
    version: int | None = None,
    partition: int | None = None,
    prefix: str = "",
    limit: int = 100,
) -> dict[str, Any]:
    """Keys of a namespace as of ``version`` (default the newest), read from durable
    storage into a private directory — never the running job's database."""
    from riverbed.state.query import read_state

    provider = src.state
    if namespace not in provider.namespaces():
        known = ", ".join(provider.namespaces()) or "none"
        raise QueryError(f"no state namespace '{namespace}' (namespaces: {known})")
    rows: list[dict[str, Any]] = []
    more = False
    batches: Iterator[Any] = read_state(
        provider,
        namespace,
        version,
        partitions=None if partition is None else [partition],
        prefix=prefix.encode(),
    )
    for batch in batches:
        for row in batch.to_pylist():
            if len(rows) >= limit:
                more = True
                break
            rows.append(
                {
                    "partition": row["partition"],
                    "version": row["version"],
                    "key": jsonable(row["key"]),
                    "bytes": len(row["value"]),
                    "value": _preview(row["value"]),
                }
            )
        if more:
            break
    return {"namespace": namespace, "version": version, "rows": rows, "more": more}


def _preview(value: bytes) -> str:
    try:
        import msgpack

        decoded = msgpack.unpackb(value, raw=False)
        text = json.dumps(jsonable(decoded), default=lambda v: f"<{len(v)} bytes>")
    except Exception:
        text = value.decode("utf-8", "backslashreplace")
    return text if len(text) <= 200 else text[:197] + "…"
