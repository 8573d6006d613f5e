"""Hosts: which host runs what, and which are down (:mod:`riverbed.control.processes`)."""

from __future__ import annotations

from typing import Any

from riverbed.control.processes import hosts_of
from riverbed.inspect.sources import Sources


def hosts(src: Sources) -> dict[str, Any]:
    """Every host riverbed has seen: up while a riverbed process on it lives (log
    server, stream driver, jobs worker, orchestrator), else down; what runs there."""
    rows = hosts_of(src.control)
    return {
        "hosts": rows,
        "up": sum(r["state"] == "up" for r in rows),
        "down": sum(r["state"] == "down" for r in rows),
    }
