"""etcd v3 semantics over simple storage primitives, shared by the embedded backends.

The memory and SQLite backends differ only in *where* rows live. Everything that
decides *what* a transaction does — compare evaluation, revision bumps, versions,
lease attachment, lease expiry, the events a watch will see — is written once here
against :class:`Storage`, the handful of primitives a backend provides inside one
exclusive write transaction.

Lease expiry (there is no server to expire leases on time):

1. every write transaction first reaps expired leases, deleting their keys at a new
   revision, so compares never see a key whose lease is dead;
2. reads skip keys whose lease has expired but was not reaped yet, so a dead
   holder's key disappears exactly at its deadline;
3. watches reap when the earliest lease deadline passes, so the delete event reaches
   watchers within their poll interval even when nobody writes.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence

from riverbed.control.base import (
    Compare,
    Delete,
    Event,
    EventType,
    Get,
    KeyValue,
    Op,
    OpResult,
    Put,
    TxnResult,
    prefix_end,
)
from riverbed.control.errors import ControlValueError, LeaseNotFoundError


class Storage(ABC):
    """Row primitives of one backend, valid inside one transaction."""

    @abstractmethod
    def read(self, key: bytes) -> KeyValue | None:
        """The stored row for ``key`` (expired or not)."""

    @abstractmethod
    def read_range(self, start: bytes, end: bytes) -> list[KeyValue]:
        """Stored rows with ``start <= key < end`` (``end == b""``: no bound), by key."""

    @abstractmethod
    def write(self, kv: KeyValue) -> None: ...

    @abstractmethod
    def remove(self, key: bytes) -> None: ...

    @abstractmethod
    def append_events(self, events: Sequence[Event]) -> None: ...

    @abstractmethod
    def get_revision(self) -> int: ...

    @abstractmethod
    def set_revision(self, revision: int) -> None: ...

    @abstractmethod
    def lease_deadline(self, lease: int) -> float | None:
        """When the lease expires (clock seconds), or ``None`` if it does not exist."""

    @abstractmethod
    def put_lease(self, lease: int, ttl: int, deadline: float) -> None: ...

    @abstractmethod
    def drop_lease(self, lease: int) -> None: ...

    @abstractmethod
    def lease_ttl(self, lease: int) -> int: ...

    @abstractmethod
    def expired_leases(self, now: float) -> list[int]: ...

    @abstractmethod
    def keys_of_lease(self, lease: int) -> list[bytes]: ...


def _alive(storage: Storage, kv: KeyValue | None, now: float) -> KeyValue | None:
    if kv is None or kv.lease == 0:
        return kv
    deadline = storage.lease_deadline(kv.lease)
    return kv if deadline is not None and deadline > now else None


def read_key(storage: Storage, key: bytes, now: float) -> KeyValue | None:
    return _alive(storage, storage.read(key), now)


def read_range(storage: Storage, start: bytes, end: bytes, now: float) -> list[KeyValue]:
    rows = storage.read_range(start, end)
    if not any(kv.lease for kv in rows):
        return rows
    return [kv for kv in rows if _alive(storage, kv, now) is not None]


def _targets(op: Get | Delete) -> tuple[bytes, bytes | None]:
    """(start, end) for a ranged op, or (key, None) for a single key."""
    if op.prefix:
        return op.key, prefix_end(op.key)
    return op.key, None


def read_only(ops: Sequence[Op]) -> bool:
    return all(isinstance(op, Get) for op in ops)


def evaluate(storage: Storage, compare: Sequence[Compare], now: float) -> bool:
    return all(c.evaluate(read_key(storage, c.key, now)) for c in compare)


def run_reads(storage: Storage, ops: Sequence[Op], now: float) -> list[OpResult]:
    out: list[OpResult] = []
    for op in ops:
        assert isinstance(op, Get)
        start, end = _targets(op)
        if end is None:
            kv = read_key(storage, start, now)
            out.append([kv] if kv else [])
        else:
            out.append(read_range(storage, start, end, now))
    return out


def _check_duplicates(ops: Sequence[Op]) -> None:
    seen: set[bytes] = set()
    for op in ops:
        if isinstance(op, Put):
            if op.key in seen:
                raise ControlValueError(f"key {op.key!r} is written twice in one transaction")
            seen.add(op.key)


def apply_txn(
    storage: Storage,
    compare: Sequence[Compare],
    success: Sequence[Op],
    failure: Sequence[Op],
    now: float,
) -> tuple[TxnResult, list[Event]]:
    """Run one transaction inside an exclusive write section; returns it and its events."""
    reaped = reap(storage, now)
    succeeded = evaluate(storage, compare, now)
    ops = success if succeeded else failure
    _check_duplicates(ops)
    revision = storage.get_revision()
    new_rev = revision + 1
    responses: list[OpResult] = []
    events: list[Event] = []
    for op in ops:
        if isinstance(op, Get):
            responses.extend(run_reads(storage, [op], now))
        elif isinstance(op, Put):
            if op.lease and storage.lease_deadline(op.lease) is None:
                raise LeaseNotFoundError(
                    f"lease {op.lease:x} does not exist (expired or revoked); grant a new one"
                )
            prev = storage.read(op.key)
            kv = KeyValue(
                key=op.key,
                value=op.value,
                create_revision=prev.create_revision if prev else new_rev,
                mod_revision=new_rev,
                version=prev.version + 1 if prev else 1,
                lease=op.lease,
            )
            storage.write(kv)
            events.append(Event(EventType.PUT, kv, prev))
            responses.append(prev)
        else:
            start, end = _targets(op)
            victims = storage.read_range(start, end) if end is not None else []
            if end is None:
                one = storage.read(start)
                victims = [one] if one else []
            for prev in victims:
                storage.remove(prev.key)
                events.append(_delete_event(prev, new_rev))
            responses.append(len(victims))
    if events:
        storage.set_revision(new_rev)
        storage.append_events(events)
    return TxnResult(succeeded, new_rev if events else revision, responses), reaped + events


def _delete_event(prev: KeyValue, revision: int) -> Event:
    return Event(EventType.DELETE, KeyValue(prev.key, b"", 0, revision, 0, 0), prev)


def reap(storage: Storage, now: float) -> list[Event]:
    """Delete the keys of every expired lease at one new revision."""
    expired = storage.expired_leases(now)
    if not expired:
        return []
    return _drop_leases(storage, expired)


def _drop_leases(storage: Storage, leases: Sequence[int]) -> list[Event]:
    victims: list[KeyValue] = []
    for lease in leases:
        for key in storage.keys_of_lease(lease):
            kv = storage.read(key)
            if kv is not None:
                victims.append(kv)
        storage.drop_lease(lease)
    if not victims:
        return []
    revision = storage.get_revision() + 1
    events = []
    for kv in sorted(victims, key=lambda kv: kv.key):
        storage.remove(kv.key)
        events.append(_delete_event(kv, revision))
    storage.set_revision(revision)
    storage.append_events(events)
    return events


def grant(storage: Storage, ttl: int, now: float) -> int:
    if ttl < 1:
        raise ControlValueError(f"lease TTL must be at least 1 second, got {ttl}")
    while True:
        lease = secrets.randbits(62) | 1
        if storage.lease_deadline(lease) is None:
            break
    storage.put_lease(lease, ttl, now + ttl)
    return lease


def keepalive(storage: Storage, lease: int, now: float) -> int:
    deadline = storage.lease_deadline(lease)
    if deadline is None or deadline <= now:
        reap(storage, now)
        raise LeaseNotFoundError(f"lease {lease:x} has expired or was revoked")
    ttl = storage.lease_ttl(lease)
    storage.put_lease(lease, ttl, now + ttl)
    return ttl


def revoke(storage: Storage, lease: int, now: float) -> list[Event]:
    events = reap(storage, now)
    if storage.lease_deadline(lease) is None:
        return events
    return events + _drop_leases(storage, [lease])


def time_to_live(storage: Storage, lease: int, now: float) -> int | None:
    deadline = storage.lease_deadline(lease)
    if deadline is None or deadline <= now:
        return None
    return max(0, round(deadline - now))
