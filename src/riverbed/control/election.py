"""Leader election: the etcd ``concurrency.Election`` recipe, on any backend.

Candidates queue under ``riverbed/election/<name>/`` exactly like :class:`Lock`
waiters; the candidate with the lowest ``create_revision`` is the leader and its value
is the leader's value. The leader's ``create_revision`` is its **term** — a fencing
token that only grows across failovers. A leader whose session dies loses its key
with the lease, and the next candidate in line takes over.
"""

from __future__ import annotations

from collections.abc import Iterator

from riverbed.control.base import (
    Bytes,
    Compare,
    ControlPlane,
    Delete,
    EventType,
    Get,
    KeyValue,
    Put,
)
from riverbed.control.base import to_bytes as _b
from riverbed.control.errors import ControlValueError, SessionLostError
from riverbed.control.lock import enqueue, take_turn
from riverbed.control.session import Session


def _leader_of(kvs: dict[bytes, KeyValue]) -> KeyValue | None:
    return min(kvs.values(), key=lambda kv: kv.create_revision, default=None)


def _identity(kv: KeyValue | None) -> tuple[bytes, bytes] | None:
    return (kv.key, kv.value) if kv else None


class Election:
    """Campaign for, observe, and give up leadership of ``name``."""

    def __init__(self, cp: ControlPlane, name: str, session: Session | None = None) -> None:
        self.cp = cp
        self.name = name
        self.session = session
        self.prefix = f"riverbed/election/{name}/".encode()
        self._key: KeyValue | None = None

    def campaign(self, value: Bytes, timeout: float | None = None) -> int:
        """Block until elected; returns the term (fencing token). Needs a session."""
        session = self._need_session()
        mine = enqueue(session, self.prefix, _b(value))
        if mine.value != _b(value):
            mine = self._put_value(session, mine, _b(value))
        take_turn(session, self.prefix, mine, timeout)
        self._key = mine
        return mine.create_revision

    @property
    def term(self) -> int | None:
        return self._key.create_revision if self._key else None

    def fence(self) -> Compare:
        """A transaction guard that holds only while our candidacy (and so our term) lives.

        Put it in every write made as the leader: once our lease is gone — we were paused,
        partitioned, or resigned — the write fails instead of overwriting a newer leader's.
        """
        if self._key is None:
            raise SessionLostError(f"not a candidate in election '{self.name}'; campaign first")
        return Compare.create(self._key.key) == self._key.create_revision

    def is_leader(self) -> bool:
        """Whether we are the leader right now (asks the control plane)."""
        if self._key is None or self.session is None or not self.session.alive:
            return False
        current = self.leader()
        return current is not None and current.key == self._key.key

    def proclaim(self, value: Bytes) -> None:
        """Change the leader's value without giving up leadership."""
        if self._key is None:
            raise SessionLostError(f"not the leader of election '{self.name}'; campaign first")
        self._key = self._put_value(self._need_session(), self._key, _b(value))

    def _put_value(self, session: Session, mine: KeyValue, value: bytes) -> KeyValue:
        result = self.cp.txn(
            [Compare.create(mine.key) == mine.create_revision],
            [Put(mine.key, value, session.lease)],
        )
        if not result.succeeded:
            self._key = None
            raise SessionLostError(
                f"our candidacy key {mine.key!r} in election '{self.name}' is gone (lease lost)"
            )
        return KeyValue(
            mine.key, value, mine.create_revision, result.revision, mine.version + 1, session.lease
        )

    def resign(self) -> None:
        """Step down (or withdraw the candidacy); the next candidate takes over."""
        if self._key is not None:
            # Only our own candidacy: a key re-created by someone else is not ours to delete.
            self.cp.txn(
                [Compare.create(self._key.key) == self._key.create_revision],
                [Delete(self._key.key)],
            )
            self._key = None

    def leader(self) -> KeyValue | None:
        """The current leader's key/value, or ``None`` when nobody campaigns."""
        return _leader_of({kv.key: kv for kv in self.cp.get_prefix(self.prefix)})

    def observe(self, timeout: float | None = None) -> Iterator[KeyValue | None]:
        """Yield the leader now and on every change (``None``: no leader).

        Ends after ``timeout`` seconds without a change, if given.
        """
        snap = self.cp.txn(success=[Get(self.prefix, prefix=True)])
        kvs_list = snap.responses[0]
        assert isinstance(kvs_list, list)
        kvs = {kv.key: kv for kv in kvs_list}
        current = _leader_of(kvs)
        yield current
        with self.cp.watch(self.prefix, prefix=True, start_revision=snap.revision + 1) as watch:
            for event in watch.events(idle_timeout=timeout):
                if event.type is EventType.PUT:
                    kvs[event.kv.key] = event.kv
                else:
                    kvs.pop(event.kv.key, None)
                leader = _leader_of(kvs)
                if _identity(leader) != _identity(current):
                    current = leader
                    yield current

    def _need_session(self) -> Session:
        if self.session is None:
            raise ControlValueError(
                "campaigning needs a Session: Election(cp, name, session=Session(cp))"
            )
        return self.session
