"""Which host runs what: every long-running riverbed process announces itself.

A log server, a stream driver (active or standby), a jobs worker and an orchestrator
each register in the ``processes`` group of the registry — member
``<host>:<pid>:<role>`` → ``{host, role, pid, since, …}`` — on the lease of the
session it already keeps, so the entry goes when the process does (killed, or its host
lost) within that lease's TTL. The host itself is also written *without* a lease under
``riverbed/hosts/<host>`` (when it was first and last announced), so a host whose
processes are all gone still shows: as down.

A host is named by ``RIVERBED_HOST`` when set — the test bed sets it, since its hosts
share one kernel's hostname — else by the machine's hostname.

:func:`host_states` is the pure core (Hypothesis-tested): seen hosts and live
processes in, one row per host out.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from riverbed.config import inherited
from riverbed.control.base import ControlPlane
from riverbed.control.errors import ControlError
from riverbed.control.registry import Registry
from riverbed.control.session import Session

__all__ = [
    "PROCESSES",
    "SEEN",
    "Presence",
    "announce",
    "host_name",
    "host_states",
    "hosts_of",
    "processes",
]

log = logging.getLogger(__name__)

PROCESSES = "processes"  # the registry group
SEEN = b"riverbed/hosts/"  # <host> -> {"first_seen", "last_seen"}, no lease


def host_name() -> str:
    """This process's host, as riverbed names it (``RIVERBED_HOST``, else hostname)."""
    return inherited("RIVERBED_HOST") or socket.gethostname()


def announce(
    session: Session, role: str, detail: Mapping[str, Any] | None = None, host: str | None = None
) -> str:
    """Register this process as ``role`` on its host (:func:`host_name` unless named),
    for as long as ``session`` lives (again with new ``detail`` to update it, e.g. a
    standby that became active); returns the member id. Best effort: the hosts view is
    for people, so a control plane that cannot take it now is a warning, never a
    failure of the process announcing itself."""
    try:
        return _announce(session, role, detail, host)
    except ControlError as exc:
        log.warning(
            "could not announce this %s on its host (%s); the hosts view misses it", role, exc
        )
        return ""


def _announce(
    session: Session, role: str, detail: Mapping[str, Any] | None, host: str | None
) -> str:
    host = host or host_name()
    pid = os.getpid()
    member = f"{host}:{pid}:{role}"
    now = time.time()
    # The host first, then the process: a process killed between the two writes must
    # leave its host shown as down, not a live-looking process whose host vanishes
    # from the view when its lease ends.
    key = SEEN + host.encode()
    seen = session.cp.get(key)
    first = now
    if seen is not None:
        try:
            first = float(json.loads(seen.value).get("first_seen", now))
        except (ValueError, TypeError, AttributeError):
            first = now
    session.cp.put(key, json.dumps({"first_seen": first, "last_seen": now}).encode())
    Registry(session.cp, PROCESSES).register(
        session, member, {**(detail or {}), "host": host, "role": role, "pid": pid, "since": now}
    )
    return member


def host_states(
    seen: Mapping[str, Mapping[str, Any]], live: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per host that was ever announced or has a live process: ``up`` while
    any of its processes lives, else ``down``; its processes sorted by role and pid,
    and the roles they play. Hosts are sorted by name."""
    rows: dict[str, dict[str, Any]] = {}
    for host, times in seen.items():
        rows[host] = {
            "host": host,
            "first_seen": times.get("first_seen"),
            "last_seen": times.get("last_seen"),
            "processes": [],
        }
    for proc in live:
        host = str(proc.get("host") or "?")
        row = rows.setdefault(
            host, {"host": host, "first_seen": None, "last_seen": None, "processes": []}
        )
        row["processes"].append(dict(proc))
    for row in rows.values():
        row["processes"].sort(key=lambda p: (str(p.get("role")), int(p.get("pid") or 0)))
        row["roles"] = sorted({str(p.get("role")) for p in row["processes"]})
        row["state"] = "up" if row["processes"] else "down"
    return [rows[h] for h in sorted(rows)]


def processes(cp: ControlPlane) -> list[dict[str, Any]]:
    """What every live riverbed process announced (host, role, pid, since, its detail)."""
    return [dict(m.metadata) for m in Registry(cp, PROCESSES).members()]


def hosts_of(cp: ControlPlane) -> list[dict[str, Any]]:
    """The hosts riverbed has seen and what runs on each now (:func:`host_states`)."""
    seen: dict[str, Mapping[str, Any]] = {}
    for kv in cp.get_prefix(SEEN):
        try:
            value = json.loads(kv.value)
        except ValueError:
            value = {}
        seen[kv.key[len(SEEN) :].decode("utf-8", "replace")] = (
            value if isinstance(value, dict) else {}
        )
    return host_states(seen, processes(cp))


class Presence:
    """For a process that keeps no session of its own (a log server): a session of
    its own that announces ``role`` and, when the lease is lost (the control plane
    was out of reach for a TTL), a new one that announces it again."""

    def __init__(
        self, cp: ControlPlane, role: str, detail: Mapping[str, Any] | None = None, ttl: int = 10
    ) -> None:
        self.cp, self.role, self.detail, self.ttl = cp, role, dict(detail or {}), ttl
        self.session: Session | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="riverbed-presence", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.session is None or not self.session.alive:
                try:
                    session = Session(self.cp, ttl=self.ttl)
                except ControlError:  # out of reach: try again shortly
                    session = None
                if session is not None:
                    try:
                        _announce(session, self.role, self.detail, None)
                        self.session = session
                    except ControlError:
                        session.close()
            self._stop.wait(self.ttl / 5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.session is not None:
            self.session.close()
