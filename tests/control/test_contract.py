"""One contract, every backend: memory, sqlite and etcd must behave the same."""

from __future__ import annotations

import threading
import time

import pytest

from riverbed.control import (
    CompactedError,
    Compare,
    ControlPlane,
    Delete,
    EventType,
    Get,
    LeaseNotFoundError,
    Put,
)

# -- key/value ---------------------------------------------------------------------


def test_put_get_tracks_revisions_and_versions(cp: ControlPlane, ns: str) -> None:
    key = ns + "a"
    assert cp.get(key) is None
    r1 = cp.put(key, "one")
    kv = cp.get(key)
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"one", r1, r1, 1)
    r2 = cp.put(key, b"two")
    assert r2 == r1 + 1
    kv = cp.get(key)
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"two", r1, r2, 2)
    assert cp.revision() == r2


def test_delete_counts_and_does_not_bump_revision_when_nothing_deleted(
    cp: ControlPlane, ns: str
) -> None:
    cp.put(ns + "x", "1")
    before = cp.revision()
    assert cp.delete(ns + "missing") == 0
    assert cp.revision() == before
    assert cp.delete(ns + "x") == 1
    assert cp.revision() == before + 1
    assert cp.get(ns + "x") is None
    # re-created key starts a new life: version 1, new create_revision
    rev = cp.put(ns + "x", "again")
    kv = cp.get(ns + "x")
    assert kv is not None and kv.version == 1 and kv.create_revision == rev


def test_prefix_range_is_sorted_and_bounded(cp: ControlPlane, ns: str) -> None:
    for name in ["b", "a", "c/1", "c/2"]:
        cp.put(ns + "p/" + name, name)
    cp.put(ns + "q", "outside")
    cp.put(ns + "p", "the prefix itself is not under p/")
    keys = [kv.key.decode() for kv in cp.get_prefix(ns + "p/")]
    assert keys == [ns + "p/a", ns + "p/b", ns + "p/c/1", ns + "p/c/2"]
    assert [kv.value for kv in cp.get_prefix(ns + "p/c/")] == [b"c/1", b"c/2"]
    assert cp.delete(ns + "p/c/", prefix=True) == 2
    assert len(cp.get_prefix(ns + "p/")) == 2


def test_txn_applies_all_operations_at_one_revision(cp: ControlPlane, ns: str) -> None:
    cp.put(ns + "gone", "x")
    start = cp.revision()
    result = cp.txn(success=[Put.of(ns + "a", "1"), Put.of(ns + "b", "2"), Delete.of(ns + "gone")])
    assert result.succeeded
    assert result.revision == start + 1
    a, b = cp.get(ns + "a"), cp.get(ns + "b")
    assert a is not None and b is not None
    assert a.mod_revision == b.mod_revision == start + 1
    assert result.responses[2] == 1


def test_txn_compare_picks_branch(cp: ControlPlane, ns: str) -> None:
    key = ns + "k"
    # missing key: version == 0, value compare is false
    missing = cp.txn([Compare.version(key) == 0], [Put.of(key, "v1")], [Get.of(key)])
    assert missing.succeeded
    created = cp.get(key)
    assert created is not None
    assert not cp.txn([Compare.value(key) == "nope"], [Put.of(key, "bad")]).succeeded
    failed = cp.txn([Compare.version(key) == 0], [Put.of(key, "bad")], [Get.of(key)])
    assert not failed.succeeded
    got = failed.responses[0]
    assert isinstance(got, list) and got[0].value == b"v1"
    assert cp.txn([Compare.create(key) == created.create_revision], [Put.of(key, "v2")]).succeeded
    assert cp.txn([Compare.mod(key) > created.mod_revision - 1], [Put.of(key, "v3")]).succeeded
    assert cp.txn([Compare.version(key) < 10, Compare.value(key) != "x"], []).succeeded
    assert not cp.txn([Compare.version(key) < 3, Compare.value(key) == "v3"], []).succeeded
    final = cp.get(key)
    assert final is not None and final.value == b"v3" and final.version == 3
    # a failed compare writes nothing and keeps the revision
    rev = cp.revision()
    assert not cp.txn([Compare.value(key) == "old"], [Put.of(key, "x")]).succeeded
    assert cp.revision() == rev


def test_compare_and_swap_from_threads_loses_no_increment(cp: ControlPlane, ns: str) -> None:
    key = ns + "counter"
    cp.put(key, "0")

    def bump(n: int) -> None:
        done = 0
        while done < n:
            kv = cp.get(key)
            assert kv is not None
            if cp.compare_and_swap(key, kv.value, str(int(kv.value) + 1)):
                done += 1

    threads = [threading.Thread(target=bump, args=(25,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = cp.get(key)
    assert final is not None and final.value == b"100" and final.version == 101


def test_writing_a_key_twice_in_one_txn_is_rejected(cp: ControlPlane, ns: str) -> None:
    with pytest.raises(Exception, match=r"twice|duplicate"):
        cp.txn(success=[Put.of(ns + "d", "1"), Put.of(ns + "d", "2")])
    assert cp.get(ns + "d") is None


# -- leases ------------------------------------------------------------------------


def test_lease_attach_keepalive_revoke(cp: ControlPlane, ns: str) -> None:
    lease = cp.grant(30)
    assert lease.ttl == 30
    ttl = cp.time_to_live(lease.id)
    assert ttl is not None and 28 <= ttl <= 30
    cp.put(ns + "a", "1", lease=lease.id)
    cp.put(ns + "b", "2", lease=lease.id)
    kv = cp.get(ns + "a")
    assert kv is not None and kv.lease == lease.id
    assert cp.keepalive(lease.id) == 30
    cp.revoke(lease.id)
    assert cp.get(ns + "a") is None and cp.get(ns + "b") is None
    assert cp.time_to_live(lease.id) is None
    with pytest.raises(LeaseNotFoundError):
        cp.keepalive(lease.id)
    cp.revoke(lease.id)  # revoking twice is harmless


def test_put_with_unknown_lease_fails_and_writes_nothing(cp: ControlPlane, ns: str) -> None:
    with pytest.raises(LeaseNotFoundError):
        cp.put(ns + "a", "1", lease=0x1234567)
    assert cp.get(ns + "a") is None


def test_expired_lease_deletes_its_keys_and_watchers_see_it(cp: ControlPlane, ns: str) -> None:
    lease = cp.grant(1)
    cp.put(ns + "eph", "here", lease=lease.id)
    cp.put(ns + "stays", "here")
    with cp.watch(ns, prefix=True) as watch:
        started = time.monotonic()
        event = watch.get(timeout=5)
        waited = time.monotonic() - started
    assert event is not None
    assert event.type is EventType.DELETE
    assert event.kv.key == (ns + "eph").encode()
    assert event.prev_kv is not None and event.prev_kv.value == b"here"
    assert waited < 1 + 1.5  # etcd checks expiry every 500 ms
    assert cp.get(ns + "eph") is None
    assert cp.get(ns + "stays") is not None
    with pytest.raises(LeaseNotFoundError):
        cp.keepalive(lease.id)


def test_keepalive_extends_a_lease_past_its_ttl(cp: ControlPlane, ns: str) -> None:
    lease = cp.grant(1)
    cp.put(ns + "k", "v", lease=lease.id)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        cp.keepalive(lease.id)
        time.sleep(0.3)
    assert cp.get(ns + "k") is not None
    cp.revoke(lease.id)


# -- watches -----------------------------------------------------------------------


def test_watch_replays_history_in_order_and_resumes_without_gaps(cp: ControlPlane, ns: str) -> None:
    start = cp.revision() + 1
    for i in range(5):
        cp.put(ns + "w", str(i))
    cp.delete(ns + "w")
    with cp.watch(ns + "w", start_revision=start) as watch:
        first = [watch.get(timeout=5) for _ in range(3)]
    assert all(e is not None for e in first)
    assert [e.kv.value for e in first if e] == [b"0", b"1", b"2"]
    last = first[-1]
    assert last is not None
    with cp.watch(ns + "w", start_revision=last.revision + 1) as watch:
        rest = [watch.get(timeout=5) for _ in range(3)]
        assert watch.get(timeout=0.3) is None
    assert [(e.type, e.kv.value) for e in rest if e] == [
        (EventType.PUT, b"3"),
        (EventType.PUT, b"4"),
        (EventType.DELETE, b""),
    ]
    revisions = [e.revision for e in first + rest if e]
    assert revisions == list(range(start, start + 6))


def test_watch_without_start_sees_only_new_events_filtered_by_prefix(
    cp: ControlPlane, ns: str
) -> None:
    cp.put(ns + "dir/old", "x")
    with cp.watch(ns + "dir/", prefix=True) as watch:
        cp.put(ns + "other", "ignored")
        cp.put(ns + "dir/new", "y")
        cp.txn(success=[Put.of(ns + "dir/a", "1"), Put.of(ns + "dir/b", "2")])
        got = [watch.get(timeout=5) for _ in range(3)]
    assert [e.kv.key.decode()[len(ns) :] for e in got if e] == ["dir/new", "dir/a", "dir/b"]
    assert got[1] is not None and got[2] is not None
    assert got[1].revision == got[2].revision


def test_watch_delivers_events_written_concurrently(cp: ControlPlane, ns: str) -> None:
    n = 200
    with cp.watch(ns, prefix=True) as watch:
        writer = threading.Thread(
            target=lambda: [cp.put(ns + f"k{i % 7}", str(i)) for i in range(n)]
        )
        writer.start()
        values = []
        while len(values) < n:
            event = watch.get(timeout=10)
            assert event is not None, f"only {len(values)} of {n} events arrived"
            values.append(int(event.kv.value))
        writer.join()
    assert values == list(range(n))


def test_watch_from_compacted_revision_raises(cp: ControlPlane, ns: str) -> None:
    old = cp.put(ns + "c", "1")
    cp.put(ns + "c", "2")
    newest = cp.put(ns + "c", "3")
    cp.compact(newest)
    with cp.watch(ns + "c", start_revision=old) as watch, pytest.raises(CompactedError):
        watch.get(timeout=5)
    with cp.watch(ns + "c", start_revision=newest) as watch:
        event = watch.get(timeout=5)
    assert event is not None and event.kv.value == b"3"
