"""The control plane: leaders, locks, registrations."""

from __future__ import annotations

from typing import Any

from riverbed.inspect.sources import Sources


def control(src: Sources) -> dict[str, Any]:
    return control_of(src.control, src.config.control_url)


def control_of(cp: Any, url: str) -> dict[str, Any]:
    """Elections (leader, term, candidates), locks (holder, waiting), registries
    (members) and the leases behind them, from the control plane's keys."""
    elections: dict[str, list[Any]] = {}
    locks: dict[str, list[Any]] = {}
    registries: dict[str, list[Any]] = {}
    for kv in cp.get_prefix(b"riverbed/"):
        key = kv.key.decode("utf-8", "backslashreplace")
        kind, _, rest = key.removeprefix("riverbed/").partition("/")
        name, _, _ = rest.rpartition("/")
        target = {"election": elections, "lock": locks, "registry": registries}.get(kind)
        if target is not None and name:
            target.setdefault(name, []).append(kv)
    leases: dict[int, int | None] = {}

    def ttl(lease: int) -> int | None:
        if lease and lease not in leases:
            leases[lease] = cp.time_to_live(lease)
        return leases.get(lease)

    def holder(kv: Any) -> dict[str, Any]:
        return {
            "key": kv.key.decode("utf-8", "backslashreplace"),
            "value": kv.value.decode("utf-8", "backslashreplace")[:200],
            "lease": f"{kv.lease:x}",
            "ttl": ttl(kv.lease),
            "since_revision": kv.create_revision,
        }

    out_elections = []
    for name, kvs in sorted(elections.items()):
        kvs.sort(key=lambda kv: kv.create_revision)
        out_elections.append(
            {
                "name": name,
                "leader": holder(kvs[0]),
                "term": kvs[0].create_revision,
                "candidates": [holder(kv) for kv in kvs[1:]],
            }
        )
    out_locks = []
    for name, kvs in sorted(locks.items()):
        kvs.sort(key=lambda kv: kv.create_revision)
        out_locks.append(
            {"name": name, "holder": holder(kvs[0]), "waiting": [holder(kv) for kv in kvs[1:]]}
        )
    out_registries = [
        {"group": name, "members": [holder(kv) for kv in sorted(kvs, key=lambda k: k.key)]}
        for name, kvs in sorted(registries.items())
    ]
    return {
        "url": url,
        "elections": out_elections,
        "locks": out_locks,
        "registries": out_registries,
        "leases": [{"lease": f"{k:x}", "ttl": v} for k, v in sorted(leases.items())],
    }
