"""Which host runs what (riverbed.control.processes): the pure core under Hypothesis, then
announcements on every backend — a host stays listed after its processes go, as down."""

from __future__ import annotations

import time
import uuid

from hypothesis import given
from hypothesis import strategies as st

from riverbed.control import Session
from riverbed.control.processes import (
    PROCESSES,
    Presence,
    announce,
    host_name,
    host_states,
    hosts_of,
)
from riverbed.control.processes import (
    SEEN as SEEN_PREFIX,
)
from riverbed.control.registry import Registry

HOSTS = st.sampled_from(["h1", "h2", "h3", "db", "edge-7"])
ROLES = st.sampled_from(["log-server", "stream-driver", "jobs-worker", "orchestrator"])
PROCS = st.lists(
    st.fixed_dictionaries({"host": HOSTS, "role": ROLES, "pid": st.integers(1, 99999)}),
    max_size=12,
)
SEEN = st.dictionaries(
    HOSTS, st.fixed_dictionaries({"first_seen": st.floats(0, 1e9), "last_seen": st.floats(0, 1e9)})
)


@given(SEEN, PROCS)
def test_every_host_once_up_exactly_while_a_process_of_it_lives(seen, procs):
    rows = host_states(seen, procs)
    names = [r["host"] for r in rows]
    assert names == sorted(set(seen) | {p["host"] for p in procs})  # once each, sorted
    for row in rows:
        mine = [p for p in procs if p["host"] == row["host"]]
        assert len(row["processes"]) == len(mine)
        assert row["state"] == ("up" if mine else "down")
        assert row["roles"] == sorted({p["role"] for p in mine})
        if row["host"] in seen:
            assert row["last_seen"] == seen[row["host"]]["last_seen"]


def test_a_host_is_up_while_its_process_lives_and_down_after(cp, monkeypatch):
    host = f"host-{uuid.uuid4().hex[:8]}"  # the etcd server is shared by the run
    monkeypatch.setenv("RIVERBED_HOST", host)
    assert host_name() == host

    def row() -> dict:
        return {r["host"]: r for r in hosts_of(cp)}[host]

    session = Session(cp, ttl=5)
    announce(session, "stream-driver", {"aggregation": "flags", "state": "standby"})
    assert row()["state"] == "up"
    # a standby that became active updates its entry, it does not add one
    announce(session, "stream-driver", {"aggregation": "flags", "state": "active"})
    (proc,) = row()["processes"]
    assert (proc["role"], proc["state"]) == ("stream-driver", "active")
    assert proc["aggregation"] == "flags"
    first = row()["first_seen"]
    session.close()
    gone = row()
    assert gone["state"] == "down" and gone["processes"] == []
    assert gone["first_seen"] == first and gone["last_seen"] >= first


def test_the_host_is_recorded_before_its_process_so_a_kill_between_leaves_it_down(cp, monkeypatch):
    """A process SIGKILLed between its two announce writes must not leave a host that
    shows up while the process's lease lives and then vanishes (a CI failure: the
    alerts test killed its worker there and waited for "h9 down" forever)."""
    host = f"host-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RIVERBED_HOST", host)
    session = Session(cp, ttl=5)
    try:
        member = announce(session, "jobs-worker")
        seen = cp.get(SEEN_PREFIX + host.encode())
        proc = cp.get(Registry(cp, PROCESSES).prefix + member.encode())
        assert seen is not None and proc is not None
        assert seen.mod_revision < proc.mod_revision
    finally:
        session.close()


def test_presence_announces_again_after_its_lease_was_lost(cp, monkeypatch):
    host = f"host-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RIVERBED_HOST", host)
    presence = Presence(cp, "log-server", {"url": "flight://x:1"}, ttl=2)
    try:
        deadline = time.monotonic() + 10
        while presence.session is None or not any(
            r["host"] == host and r["state"] == "up" for r in hosts_of(cp)
        ):
            assert time.monotonic() < deadline, "never announced"
            time.sleep(0.05)
        lost = presence.session
        cp.revoke(lost.lease)  # as if the control plane had been out of reach for a TTL
        deadline = time.monotonic() + 15
        while presence.session is lost or not any(
            r["host"] == host and r["state"] == "up" for r in hosts_of(cp)
        ):
            assert time.monotonic() < deadline, "not announced again"
            time.sleep(0.05)
    finally:
        presence.close()
    assert {r["host"]: r for r in hosts_of(cp)}[host]["state"] == "down"
