"""A 3-node etcd cluster: kill the raft leader while clients work."""

from __future__ import annotations

import threading
import time

import pytest

from riverbed.control import Session, UnavailableError
from riverbed.control.etcd import EtcdControlPlane
from riverbed.testing import EtcdCluster

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def test_clients_continue_and_lose_no_acknowledged_write_when_leader_dies(
    etcd_cluster: EtcdCluster,
) -> None:
    leader = etcd_cluster.leader_index()
    # Put the leader first, so the client is talking to it when it dies.
    order = [leader] + [i for i in range(3) if i != leader]
    cp = EtcdControlPlane([etcd_cluster.endpoints[i] for i in order], timeout=15)
    start_rev = cp.revision() + 1
    watch = cp.watch("fo/", prefix=True, start_revision=start_rev)
    session = Session(cp, ttl=5)

    acked: dict[int, int] = {}  # key number -> revision
    unknown: list[int] = []
    killed = threading.Event()
    acked_after_kill = 0
    stop = threading.Event()

    def write() -> None:
        nonlocal acked_after_kill
        i = 0
        while not stop.is_set():
            try:
                acked[i] = cp.put(f"fo/{i:06d}", str(i))
                if killed.is_set():
                    acked_after_kill += 1
            except UnavailableError:
                unknown.append(i)  # outcome unknown: allowed, but must not be "acked"
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 30
    while not acked and time.monotonic() < deadline:  # the client is writing
        time.sleep(0.01)
    etcd_cluster.kill(leader)
    killed.set()
    # writes go on until some were acknowledged by the new leader (not for a fixed
    # time: a new leader takes ~0.6-1.5 s here, longer on a loaded host), and a little
    # beyond, so the client works through the failover and after it
    deadline = time.monotonic() + 60
    while acked_after_kill < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    writer.join(timeout=30)

    assert acked_after_kill > 0, "client did not continue after the leader died"
    stored = {int(kv.key[3:]): kv for kv in cp.get_prefix("fo/")}
    missing = [i for i in acked if i not in stored]
    assert not missing, f"acknowledged writes lost: {missing[:10]}"
    assert all(stored[i].value == str(i).encode() for i in acked)
    assert all(stored[i].mod_revision == rev for i, rev in acked.items())

    # The watch followed the failover: every stored write, once, in revision order.
    seen: list[int] = []
    while len(seen) < len(stored):
        event = watch.get(timeout=10)
        assert event is not None, f"watch delivered {len(seen)} of {len(stored)} events"
        seen.append(event.revision)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert set(seen) == {kv.mod_revision for kv in stored.values()}

    assert session.alive, "session lease was lost across an etcd leader failover"
    ttl = cp.time_to_live(session.lease)
    assert ttl is not None and ttl > 0
    session.close()
    watch.close()
    cp.close()
