"""Lock, Election, Registry and Session: built once, checked on every backend."""

from __future__ import annotations

import re
import threading
import time

import pytest

from riverbed.control import (
    ControlError,
    ControlPlane,
    Election,
    Lock,
    LockTimeoutError,
    Registry,
    Session,
    SessionLostError,
)


def test_lock_excludes_and_serves_in_arrival_order(cp: ControlPlane, ns: str) -> None:
    name = ns + "lock"
    order: list[int] = []
    inside = threading.Semaphore(1)
    sessions = [Session(cp, ttl=10) for _ in range(4)]
    first = Lock(sessions[0], name)
    token0 = first.acquire()
    tokens = [token0]

    def contend(i: int) -> None:
        lock = Lock(sessions[i], name)
        tokens.append(lock.acquire(timeout=20))
        assert inside.acquire(blocking=False), "two holders at once"
        order.append(i)
        time.sleep(0.05)
        inside.release()
        lock.release()

    threads = []
    for i in range(1, 4):
        t = threading.Thread(target=contend, args=(i,))
        t.start()
        threads.append(t)
        # wait until this contender is queued so arrival order is defined
        deadline = time.monotonic() + 5
        while len(cp.get_prefix(first.prefix)) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert first.held()
    first.release()
    for t in threads:
        t.join(timeout=30)
    assert order == [1, 2, 3]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    for s in sessions:
        s.close()


def test_a_waiter_whose_key_vanishes_is_told_its_session_is_lost(cp: ControlPlane, ns: str) -> None:
    """A waiter's key gone (its lease expired while it was paused, or deleted) is a lost
    session, not a timeout: callers that stand by again tell the two apart."""
    with Session(cp, ttl=10) as a, Session(cp, ttl=10) as b:
        held = Lock(a, ns + "v")
        held.acquire()
        waiter = Lock(b, ns + "v")
        raised: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire(timeout=30)
            except BaseException as exc:
                raised.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 10
        while len(cp.get_prefix(held.prefix)) < 2:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.05)
        mine = max(cp.get_prefix(held.prefix), key=lambda kv: kv.create_revision)
        cp.delete(mine.key)
        thread.join(15)
        assert not thread.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], SessionLostError), raised
        assert "vanished while waiting" in str(raised[0])
        held.release()


def test_lock_timeout_leaves_no_waiter_behind(cp: ControlPlane, ns: str) -> None:
    with Session(cp, ttl=10) as a, Session(cp, ttl=10) as b:
        held = Lock(a, ns + "l")
        held.acquire()
        waiter = Lock(b, ns + "l")
        with pytest.raises(LockTimeoutError):
            waiter.acquire(timeout=0.3)
        assert len(cp.get_prefix(held.prefix)) == 1
        held.release()
        assert waiter.acquire(timeout=5) > 0


def test_lock_passes_on_when_holder_session_expires(cp: ControlPlane, ns: str) -> None:
    dying = Session(cp, ttl=1)
    Lock(dying, ns + "l").acquire()
    dying.close(revoke=False)  # stop keepalives: the lease runs out like a crash
    with Session(cp, ttl=10) as s:
        started = time.monotonic()
        Lock(s, ns + "l").acquire(timeout=10)
        assert time.monotonic() - started < 1 + 1.5


def test_election_campaign_resign_and_observe(cp: ControlPlane, ns: str) -> None:
    name = ns + "e"
    with Session(cp, ttl=10) as s1, Session(cp, ttl=10) as s2:
        e1, e2 = Election(cp, name, s1), Election(cp, name, s2)
        observer = Election(cp, name)
        seen = observer.observe(timeout=5)
        assert next(seen) is None
        term1 = e1.campaign("alpha")
        assert e1.is_leader()
        leader = next(seen)
        assert leader is not None and leader.value == b"alpha"
        e1.proclaim("alpha-2")
        leader = next(seen)
        assert leader is not None and leader.value == b"alpha-2"
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(e2.campaign("beta", timeout=10)))
        t.start()
        time.sleep(0.2)
        assert not result, "second candidate elected while the first leads"
        assert not e2.is_leader()
        e1.resign()
        t.join(timeout=10)
        assert result and result[0] > term1
        assert e2.is_leader() and not e1.is_leader()
        leader = next(seen)
        assert leader is not None and leader.value == b"beta"
        seen.close()
        with pytest.raises(SessionLostError):
            e1.proclaim("not leader")


def test_campaign_needs_a_session(cp: ControlPlane, ns: str) -> None:
    with pytest.raises(ValueError, match="Session"):
        Election(cp, ns + "e").campaign("x")


def test_registry_tracks_joins_and_departures(cp: ControlPlane, ns: str) -> None:
    group = ns.strip("/").replace("/", "-")
    registry = Registry(cp, group)
    members, rev = registry.snapshot()
    assert members == []
    s1, s2 = Session(cp, ttl=10), Session(cp, ttl=1)
    registry.register(s1, "w1", {"host": "a"})
    registry.register(s2, "w2", {"host": "b"})
    assert [(m.id, m.metadata["host"]) for m in registry.members()] == [("w1", "a"), ("w2", "b")]
    with pytest.raises(ControlError, match="already registered"):
        registry.register(s1, "w2")
    registry.register(s1, "w1", {"host": "a2"})  # own entry: update
    s2.close(revoke=False)  # w2 "crashes": its lease expires
    changes = registry.changes(start_revision=rev + 1, timeout=5)
    got = [(c.kind, c.member.id) for c in (next(changes) for _ in range(4))]
    assert got == [("joined", "w1"), ("joined", "w2"), ("updated", "w1"), ("left", "w2")]
    changes.close()
    assert [m.id for m in registry.members()] == ["w1"]
    s1.close()
    assert registry.members() == []


def test_session_notices_its_lease_was_revoked(cp: ControlPlane) -> None:
    session = Session(cp, ttl=1)
    cp.revoke(session.lease)
    assert session.lost.wait(timeout=3)
    # the reason says what the keeper saw: the control plane no longer has the lease,
    # and how late its refreshes were (a starved process, or a slow control plane)
    assert session.lost_reason is not None
    assert "expired or was revoked" in session.lost_reason
    assert re.search(
        r"the last refresh that got through was sent \d+\.\d s before; this one woke "
        r"-?\d+\.\d s late and was answered in \d+\.\d s",
        session.lost_reason,
    )
    with pytest.raises(SessionLostError, match="expired or was revoked"):
        session.ensure_alive()
    session.close()
