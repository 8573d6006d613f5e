"""A fair distributed lock: the etcd ``concurrency.Mutex`` recipe, on any backend.

Protocol (``acquire``):

1. put ``<prefix>/<lease-hex>`` with the session's lease, only if it does not exist
   (``create_revision == 0``); our *ticket* is its ``create_revision``;
2. list the prefix; the key with the lowest ``create_revision`` holds the lock;
3. otherwise watch the key just before ours (the predecessor) until it is deleted —
   only that waiter wakes, so there is no thundering herd — and go to 2 (also after
   :data:`RECHECK_S` of silence: a watch whose server was cut off hears nothing).

Holders are served in arrival order. The ticket doubles as a **fencing token**: it
only grows, so a store that remembers the highest token it has seen can reject a
stale holder whose lease expired while it was paused.
"""

from __future__ import annotations

import time
from types import TracebackType

from riverbed.control.base import Compare, ControlPlane, EventType, Get, KeyValue, Put
from riverbed.control.errors import LockTimeoutError, OutcomeUnknownError, SessionLostError
from riverbed.control.session import Session

# The queue is listed again this often even when the watch says nothing: a watch that
# went quiet because its server did (cut off, not closed) must not keep a waiter from
# its turn for longer than this.
RECHECK_S = 3.0
ENQUEUE_TRIES = 3


def _queue(cp: ControlPlane, prefix: bytes) -> list[KeyValue]:
    return sorted(cp.get_prefix(prefix), key=lambda kv: kv.create_revision)


def enqueue(session: Session, prefix: bytes, value: bytes) -> KeyValue:
    """Step 1: put our key under ``prefix`` (once per session) and return it."""
    key = prefix + f"{session.lease:x}".encode()
    for attempt in range(ENQUEUE_TRIES):
        try:
            result = session.cp.txn(
                [Compare.create(key) == 0], [Put(key, value, session.lease)], [Get(key)]
            )
            break
        except OutcomeUnknownError:
            # create-if-absent of our own key, else read it: safe to send again (to
            # another member: the client moved on from the one that went silent)
            if attempt == ENQUEUE_TRIES - 1:
                raise
            session.ensure_alive()
    if result.succeeded:
        return KeyValue(key, value, result.revision, result.revision, 1, session.lease)
    existing = result.responses[0]
    assert isinstance(existing, list) and existing
    return existing[0]


def wait_turn(session: Session, prefix: bytes, mine: KeyValue, timeout: float | None) -> None:
    """Steps 2-3: block until ``mine`` has the lowest create_revision under ``prefix``."""
    cp = session.cp
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        session.ensure_alive()
        queue = _queue(cp, prefix)
        ahead = [kv for kv in queue if kv.create_revision < mine.create_revision]
        if not any(kv.key == mine.key for kv in queue):
            session.ensure_alive()
            raise SessionLostError(
                f"our key {mine.key!r} vanished while waiting: its lease expired (a pause "
                "or a cut-off longer than the TTL) or someone deleted it; start a new session"
            )
        if not ahead:
            return
        predecessor = ahead[-1]
        recheck = time.monotonic() + RECHECK_S
        with cp.watch(predecessor.key, start_revision=predecessor.mod_revision + 1) as watch:
            while time.monotonic() < recheck:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise LockTimeoutError(
                        f"not acquired within {timeout}s; {len(ahead)} holder(s) ahead, "
                        f"first is {queue[0].key!r}"
                    )
                session.ensure_alive()
                event = watch.get(timeout=0.25 if left is None else min(left, 0.25))
                if event is not None and event.type is EventType.DELETE:
                    break


def take_turn(session: Session, prefix: bytes, mine: KeyValue, timeout: float | None) -> None:
    """:func:`wait_turn`, withdrawing our key if we give up (timeout, lost session, Ctrl-C)."""
    try:
        wait_turn(session, prefix, mine, timeout)
    except BaseException:
        session.cp.delete(mine.key)
        raise


class Lock:
    """``with Lock(session, "jobs/compaction"): ...`` — held by one session at a time."""

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = name
        self.prefix = f"riverbed/lock/{name}/".encode()
        self._key: KeyValue | None = None

    def acquire(self, timeout: float | None = None) -> int:
        """Block until held; returns the fencing token (our key's create_revision)."""
        mine = enqueue(self.session, self.prefix, b"")
        take_turn(self.session, self.prefix, mine, timeout)
        self._key = mine
        return mine.create_revision

    @property
    def token(self) -> int | None:
        """The fencing token while held, else ``None``."""
        return self._key.create_revision if self._key else None

    def held(self) -> bool:
        """Whether our key is still the first in line (asks the control plane)."""
        if self._key is None or not self.session.alive:
            return False
        queue = _queue(self.session.cp, self.prefix)
        return bool(queue) and queue[0].key == self._key.key

    def release(self) -> None:
        if self._key is not None:
            self.session.cp.delete(self._key.key)
            self._key = None

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
