"""The control plane: leases, transactions, watches, locks, elections and membership.

Pick a backend by URL::

    from riverbed.control import connect, Session, Lock, Election, Registry

    cp = connect("sqlite:///.riverbed/control.db")   # or "etcd://h1:2379,h2:2379", "memory://"
    with Session(cp, ttl=5) as session, Lock(session, "nightly-compaction"):
        ...
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from riverbed.control.base import (
    Compare,
    ControlPlane,
    Delete,
    Event,
    EventType,
    Get,
    KeyValue,
    LeaseGrant,
    Put,
    TxnResult,
    Watch,
)
from riverbed.control.election import Election
from riverbed.control.errors import (
    CompactedError,
    ControlError,
    InvalidURLError,
    KeyNotFoundError,
    LeaseNotFoundError,
    LockTimeoutError,
    OutcomeUnknownError,
    SessionLostError,
    UnavailableError,
)
from riverbed.control.lock import Lock
from riverbed.control.registry import Member, MembershipChange, Registry
from riverbed.control.session import Session
from riverbed.files import sqlite_path

__all__ = [
    "CompactedError",
    "Compare",
    "ControlError",
    "ControlPlane",
    "Delete",
    "Election",
    "Event",
    "EventType",
    "Get",
    "InvalidURLError",
    "KeyNotFoundError",
    "KeyValue",
    "LeaseGrant",
    "LeaseNotFoundError",
    "Lock",
    "LockTimeoutError",
    "Member",
    "MembershipChange",
    "OutcomeUnknownError",
    "Put",
    "Registry",
    "Session",
    "SessionLostError",
    "TxnResult",
    "UnavailableError",
    "Watch",
    "connect",
]

_EXAMPLES = "sqlite:///.riverbed/control.db, etcd://127.0.0.1:2379[,host:port...], memory://"


def _float_option(url: str, options: dict[str, list[str]], name: str, default: float) -> float:
    if name not in options:
        return default
    try:
        return float(options[name][-1])
    except ValueError:
        raise InvalidURLError(
            f"{url}: option {name}={options[name][-1]!r} is not a number"
        ) from None


def connect(url: str) -> ControlPlane:
    """Open the control plane named by ``url``.

    * ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's
      convention); options ``?poll=SECONDS&history=REVISIONS``;
    * ``etcd://host:port[,host:port…]``; option ``?timeout=SECONDS``;
    * ``memory://`` — private to this process and this object.
    """
    parts = urlsplit(url)
    options = parse_qs(parts.query)
    if parts.scheme == "memory":
        from riverbed.control.memory import MemoryControlPlane

        return MemoryControlPlane()
    if parts.scheme == "sqlite":
        try:
            path = sqlite_path(url, ".riverbed/control.db")
        except ValueError as exc:
            raise InvalidURLError(str(exc)) from None
        assert path is not None
        from riverbed.control.sqlite import SqliteControlPlane

        return SqliteControlPlane(
            path,
            poll=_float_option(url, options, "poll", 0.005),
            history=int(_float_option(url, options, "history", 100_000)),
        )
    if parts.scheme == "etcd":
        endpoints = [e.strip() for e in parts.netloc.split(",") if e.strip()]
        if not endpoints:
            raise InvalidURLError(f"{url}: no etcd endpoints; e.g. etcd://127.0.0.1:2379")
        for endpoint in endpoints:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise InvalidURLError(
                    f"{url}: endpoint {endpoint!r} is not host:port; e.g. etcd://127.0.0.1:2379"
                )
        from riverbed.control.etcd import EtcdControlPlane

        cp = EtcdControlPlane(endpoints, timeout=_float_option(url, options, "timeout", 10.0))
        try:
            cp.revision(timeout=min(cp.timeout, 3.0))  # fail fast on a wrong URL
        except ControlError:
            cp.close()
            raise
        return cp
    raise InvalidURLError(
        f"unknown control-plane URL {url!r} (scheme {parts.scheme!r}); use one of: {_EXAMPLES}"
    )
