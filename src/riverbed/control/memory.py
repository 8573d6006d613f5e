"""``memory://``: the control plane inside one process, for tests and notebooks.

Same semantics as the other backends (it runs the shared engine); nothing survives
the process. Share one :class:`MemoryControlPlane` object between the components
that should see each other.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence

from riverbed.control import _engine
from riverbed.control._watch import KeyFilter
from riverbed.control.base import (
    Bytes,
    Compare,
    ControlPlane,
    Event,
    KeyValue,
    LeaseGrant,
    Op,
    TxnResult,
    Watch,
    to_bytes,
)
from riverbed.control.errors import CompactedError


class _MemoryStorage(_engine.Storage):
    def __init__(self) -> None:
        self.kv: dict[bytes, KeyValue] = {}
        self.keys: list[bytes] = []  # sorted, for ranges
        self.leases: dict[int, tuple[int, float]] = {}
        self.lease_keys: dict[int, set[bytes]] = {}
        self.events: list[Event] = []
        self.event_revs: list[int] = []
        self.revision = 1
        self.compact_revision = 0

    def read(self, key: bytes) -> KeyValue | None:
        return self.kv.get(key)

    def read_range(self, start: bytes, end: bytes) -> list[KeyValue]:
        lo = bisect.bisect_left(self.keys, start)
        hi = len(self.keys) if end == b"" else bisect.bisect_left(self.keys, end)
        return [self.kv[k] for k in self.keys[lo:hi]]

    def write(self, kv: KeyValue) -> None:
        prev = self.kv.get(kv.key)
        if prev is None:
            bisect.insort(self.keys, kv.key)
        elif prev.lease:
            self.lease_keys.get(prev.lease, set()).discard(kv.key)
        self.kv[kv.key] = kv
        if kv.lease:
            self.lease_keys.setdefault(kv.lease, set()).add(kv.key)

    def remove(self, key: bytes) -> None:
        prev = self.kv.pop(key)
        del self.keys[bisect.bisect_left(self.keys, key)]
        if prev.lease:
            self.lease_keys.get(prev.lease, set()).discard(key)

    def append_events(self, events: Sequence[Event]) -> None:
        self.events.extend(events)
        self.event_revs.extend(e.revision for e in events)

    def get_revision(self) -> int:
        return self.revision

    def set_revision(self, revision: int) -> None:
        self.revision = revision

    def lease_deadline(self, lease: int) -> float | None:
        entry = self.leases.get(lease)
        return entry[1] if entry else None

    def put_lease(self, lease: int, ttl: int, deadline: float) -> None:
        self.leases[lease] = (ttl, deadline)

    def drop_lease(self, lease: int) -> None:
        self.leases.pop(lease, None)
        self.lease_keys.pop(lease, None)

    def lease_ttl(self, lease: int) -> int:
        return self.leases[lease][0]

    def expired_leases(self, now: float) -> list[int]:
        return [lease for lease, (_, deadline) in self.leases.items() if deadline <= now]

    def keys_of_lease(self, lease: int) -> list[bytes]:
        return sorted(self.lease_keys.get(lease, ()))

    def next_deadline(self) -> float | None:
        return min((d for _, d in self.leases.values()), default=None)


class MemoryControlPlane(ControlPlane):
    """An in-process control plane; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.url = "memory://"
        self._clock = clock
        self._cond = threading.Condition()
        self._s = _MemoryStorage()

    def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        with self._cond:
            result, events = _engine.apply_txn(self._s, compare, success, failure, self._clock())
            if events:
                self._cond.notify_all()
            return result

    def revision(self) -> int:
        with self._cond:
            return self._s.revision

    def compact(self, revision: int) -> None:
        with self._cond:
            revision = min(revision, self._s.revision)
            if revision <= self._s.compact_revision:
                return
            cut = bisect.bisect_left(self._s.event_revs, revision)
            del self._s.events[:cut]
            del self._s.event_revs[:cut]
            self._s.compact_revision = revision

    def grant(self, ttl: int) -> LeaseGrant:
        with self._cond:
            lease = _engine.grant(self._s, ttl, self._clock())
            self._cond.notify_all()  # watchers re-plan their next reap
            return LeaseGrant(lease, ttl)

    def keepalive(self, lease: int) -> int:
        with self._cond:
            try:
                return _engine.keepalive(self._s, lease, self._clock())
            finally:
                self._cond.notify_all()

    def revoke(self, lease: int) -> None:
        with self._cond:
            if _engine.revoke(self._s, lease, self._clock()):
                self._cond.notify_all()

    def time_to_live(self, lease: int) -> int | None:
        with self._cond:
            return _engine.time_to_live(self._s, lease, self._clock())

    def watch(
        self, key: Bytes, *, prefix: bool = False, start_revision: int | None = None
    ) -> Watch:
        with self._cond:
            start = self._s.revision + 1 if start_revision is None else start_revision
            return _MemoryWatch(self, KeyFilter(to_bytes(key), prefix), start)

    def close(self) -> None:
        pass

    # used by _MemoryWatch, under self._cond
    def _next_events(self, match: KeyFilter, start: int) -> list[Event]:
        s = self._s
        if start < s.compact_revision:
            raise CompactedError(start, s.compact_revision)
        i = bisect.bisect_left(s.event_revs, start)
        return [e for e in s.events[i:] if match(e.kv.key)]

    def _wait(self, timeout: float | None) -> None:
        """Wait for a write, or until the next lease deadline, then reap what expired."""
        deadline = self._s.next_deadline()
        now = self._clock()
        if deadline is not None:
            until = max(0.0, deadline - now) + 0.001
            timeout = until if timeout is None else min(timeout, until)
        self._cond.wait(timeout)
        if _engine.reap(self._s, self._clock()):
            self._cond.notify_all()


class _MemoryWatch(Watch):
    def __init__(self, cp: MemoryControlPlane, match: KeyFilter, start: int) -> None:
        super().__init__()
        self._cp = cp
        self._match = match
        self._next = start
        self._pending: list[Event] = []

    def get(self, timeout: float | None = None) -> Event | None:
        end = None if timeout is None else time.monotonic() + timeout
        with self._cp._cond:
            while not self.closed:
                if not self._pending:
                    self._pending = self._cp._next_events(self._match, self._next)
                    if self._pending:
                        self._next = self._cp._s.revision + 1
                if self._pending:
                    return self._pending.pop(0)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cp._wait(left if left is None else min(left, 0.5))
        return None

    def close(self) -> None:
        super().close()
        with self._cp._cond:
            self._cp._cond.notify_all()
