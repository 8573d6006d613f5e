"""The state-store contract, on the RocksDB and memory engines."""

from __future__ import annotations

import shutil

import pytest

from riverbed.state import (
    PartitionBusyError,
    StateProvider,
    StoreClosedError,
    VersionNotFoundError,
)


def commit_items(provider: StateProvider, items: dict[bytes, bytes], version: int) -> None:
    store = provider.load("ns", 0, version - 1)
    for k, v in items.items():
        store.put(k, v)
    store.commit(version)


def test_new_partition_is_empty_at_version_zero(provider: StateProvider) -> None:
    store = provider.load("ns", 0)
    assert store.version == 0
    assert store.get(b"x") is None and list(store.scan()) == []
    store.abort()


def test_staged_reads_see_own_writes_and_commit_makes_a_version(provider: StateProvider) -> None:
    store = provider.load("ns", 0)
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    store.delete(b"a")
    assert store.get(b"a") is None and store.get(b"b") == b"2"
    assert store.commit() == 1
    with pytest.raises(StoreClosedError):
        store.get(b"b")
    again = provider.load("ns", 0)
    assert again.version == 1
    assert list(again.scan()) == [(b"b", b"2")]
    again.abort()


def test_put_many_is_each_put_in_order(provider: StateProvider) -> None:
    store = provider.load("ns", 0)
    store.put(b"a", b"0")
    store.put_many([(b"b", b"1"), (b"a", b"2"), (b"b", b"3")])
    assert store.get(b"a") == b"2" and store.get(b"b") == b"3"
    store.commit()
    again = provider.load("ns", 0)
    assert list(again.scan()) == [(b"a", b"2"), (b"b", b"3")]
    again.abort()


def test_abort_discards(provider: StateProvider) -> None:
    commit_items(provider, {b"a": b"1"}, 1)
    store = provider.load("ns", 0)
    store.put(b"a", b"changed")
    store.put(b"z", b"new")
    store.abort()
    store = provider.load("ns", 0)
    assert store.version == 1 and list(store.scan()) == [(b"a", b"1")]
    store.abort()


def test_leaving_a_with_block_without_commit_aborts(provider: StateProvider) -> None:
    with provider.load("ns", 0) as store:
        store.put(b"a", b"1")
    with provider.load("ns", 0) as store:
        assert store.version == 0 and store.get(b"a") is None


def test_scan_by_prefix_and_range_merges_staged_changes(provider: StateProvider) -> None:
    commit_items(provider, {b"w1/a": b"1", b"w1/c": b"3", b"w2/a": b"9", b"x": b"0"}, 1)
    store = provider.load("ns", 0)
    store.put(b"w1/b", b"2")
    store.delete(b"w1/c")
    store.put(b"w1/d", b"4")
    assert list(store.scan(b"w1/")) == [(b"w1/a", b"1"), (b"w1/b", b"2"), (b"w1/d", b"4")]
    assert [k for k, _ in store.scan(start=b"w1/b", end=b"w2/b")] == [b"w1/b", b"w1/d", b"w2/a"]
    assert store.get_many([b"w1/a", b"w1/c", b"w1/d", b"nope"]) == [b"1", None, b"4", None]
    store.abort()


def test_delete_range_expires_old_windows_and_later_puts_survive(provider: StateProvider) -> None:
    commit_items(provider, {f"t{h:02d}/k".encode(): b"x" for h in range(10)}, 1)
    store = provider.load("ns", 0)
    store.put(b"t03/new", b"staged before the range delete")
    store.delete_range(b"t00", b"t05")
    store.put(b"t04/late", b"written after it")
    assert store.get(b"t03/new") is None and store.get(b"t02/k") is None
    keys = [k for k, _ in store.scan()]
    assert keys == [b"t04/late"] + [f"t{h:02d}/k".encode() for h in range(5, 10)]
    store.commit()
    store = provider.load("ns", 0)
    assert [k for k, _ in store.scan()] == keys
    store.abort()


def test_any_older_version_loads_exactly(provider: StateProvider) -> None:
    for v in range(1, 8):
        store = provider.load("ns", 0)
        store.put(b"counter", str(v).encode())
        store.put(f"k{v}".encode(), b"x")
        store.commit()
    for v in [7, 2, 5, 1, 6, 3, 7]:
        store = provider.load("ns", 0, v)
        assert store.version == v
        assert store.get(b"counter") == str(v).encode()
        assert len(list(store.scan(b"k"))) == v
        store.abort()


def test_rerunning_a_batch_gives_the_same_version(provider: StateProvider) -> None:
    """Load v-1 again after v exists (a retried task) and redo the batch: same result."""
    commit_items(provider, {b"a": b"1"}, 1)
    for _ in range(3):
        store = provider.load("ns", 0, 1)
        store.put(b"a", b"2")
        store.put(b"b", b"2")
        store.commit(2)
    store = provider.load("ns", 0)
    assert store.version == 2 and list(store.scan()) == [(b"a", b"2"), (b"b", b"2")]
    store.abort()


def test_sparse_versions_load_the_newest_at_or_before(provider: StateProvider) -> None:
    commit_items(provider, {b"a": b"1"}, 3)
    commit_items(provider, {b"b": b"2"}, 8)
    assert provider.versions("ns", 0) == [3, 8]
    for asked, got in [(2, 0), (3, 3), (7, 3), (8, 8), (100, 8)]:
        store = provider.load("ns", 0, asked)
        assert store.version == got
        store.abort()
    with pytest.raises(ValueError, match="versions only grow"):
        provider.load("ns", 0, 8).commit(5)


def test_restore_after_losing_the_local_directory(provider: StateProvider) -> None:
    for v in range(1, 11):
        commit_items(provider, {f"k{v:03d}".encode(): bytes([v]) * 100}, v)
    before = provider.load("ns", 0)
    expected = list(before.scan())
    before.abort()
    shutil.rmtree(provider.local_dir)
    reset = getattr(provider.engine, "reset", None)
    if provider.engine.name == "memory" and reset is not None:
        reset(provider.local_dir / "ns" / "0")  # memory "disk" lost too
    after = provider.load("ns", 0)
    assert after.version == 10 and list(after.scan()) == expected
    after.abort()


def test_a_second_holder_waits_then_fails_clearly(provider: StateProvider) -> None:
    held = provider.load("ns", 0)
    with pytest.raises(PartitionBusyError, match="open"):
        provider.load("ns", 0)
    held.abort()
    provider.load("ns", 0).abort()


def test_partitions_and_namespaces_are_independent(provider: StateProvider) -> None:
    for ns, part in [("a", 0), ("a", 1), ("b", 0)]:
        store = provider.load(ns, part)
        store.put(b"who", f"{ns}{part}".encode())
        store.commit()
    assert provider.namespaces() == ["a", "b"]
    assert provider.partitions("a") == [0, 1]
    for ns, part in [("a", 0), ("a", 1), ("b", 0)]:
        store = provider.load(ns, part)
        assert store.get(b"who") == f"{ns}{part}".encode()
        store.abort()


def test_maintain_purges_but_keeps_retained_versions(provider: StateProvider) -> None:
    for v in range(1, 13):
        commit_items(provider, {b"v": str(v).encode()}, v)
    purged = provider.maintain("ns", 0)  # retain 4 (9..12): needs snapshot <= 9
    assert purged == 9
    assert provider.versions("ns", 0) == [9, 10, 11, 12]
    for v in [9, 12, 10]:
        store = provider.load("ns", 0, v)
        assert store.get(b"v") == str(v).encode()
        store.abort()
    with pytest.raises(VersionNotFoundError, match="purged"):
        provider.load("ns", 0, 5)


def test_purge_runs_while_a_writer_holds_the_partition(provider: StateProvider) -> None:
    """purge() only touches durable files: it neither waits for the partition nor
    snapshots it, and the writer's next commit and loads still work."""
    for v in range(1, 11):
        commit_items(provider, {b"v": str(v).encode()}, v)
    writer = provider.load("ns", 0)  # holds the partition (lock_timeout is 0.5 s)
    assert provider.purge("ns", 0) == 6  # retain 4 (7..10): the snapshot at 6
    assert provider.versions("ns", 0) == [6, 7, 8, 9, 10]
    writer.put(b"v", b"11")
    writer.commit(11)
    store = provider.load("ns", 0, 7)
    assert store.get(b"v") == b"7"
    store.abort()


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "-lead"])
def test_bad_namespace_names(provider: StateProvider, bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        provider.load(bad, 0)


def test_the_last_key_of_a_range_is_the_greatest_one_a_scan_gives(
    provider: StateProvider,
) -> None:
    """``last(start, end)`` — committed keys (one seek) and staged puts, deletes and
    deleted ranges alike — is the greatest key ``scan`` gives in ``[start, end)``."""
    import random

    rng = random.Random(7)
    alphabet = [bytes([a, b]) for a in (0, 1, 2, 250) for b in (0, 7, 255)]
    for version in range(1, 6):
        store = provider.load("ns", 0, version - 1)
        for _ in range(6):
            store.put(rng.choice(alphabet), b"v")
        store.commit(version)
        store = provider.load("ns", 0, version)
        for staged in (False, True):
            if staged:  # the same questions with changes staged
                store.put(rng.choice(alphabet), b"w")
                store.delete(rng.choice(alphabet))
                lo, hi = sorted(rng.sample(alphabet, 2))
                store.delete_range(lo, hi)
            for _ in range(30):
                start, end = sorted(rng.sample([*alphabet, b"", b"\x03"], 2))
                keys = [k for k, _ in store.scan(start=start, end=end)]
                assert store.last(start, end) == (keys[-1] if keys else None), (start, end)
        store.abort()


def test_a_version_committed_again_with_the_same_changes_writes_nothing(
    provider: StateProvider,
) -> None:
    """A retried task, or a driver that lost its lead while paused between its fence
    and its commit, commits the same changelog again: the object is left as it is (a
    directory's file keeps its inode); other changes replace it."""
    from pathlib import Path

    durable = provider.durable
    commit_items(provider, {b"a": b"1"}, 1)
    commit_items(provider, {b"a": b"2"}, 2)
    [name] = [n for n in durable.list("ns/0/changelog") if int(n.split(".")[0]) == 2]
    key = f"ns/0/changelog/{name}"
    first = durable.read(key)
    where = Path(durable.url.removeprefix("file://")) / key
    inode = where.stat().st_ino if where.exists() else None
    assert not durable.write_once(key, first)
    commit_items(provider, {b"a": b"2"}, 2)  # the batch re-run
    assert durable.read(key) == first
    if inode is not None:
        assert where.stat().st_ino == inode
    commit_items(provider, {b"a": b"3"}, 2)  # another history: replaced, as before
    assert durable.read(key) != first
    store = provider.load("ns", 0)
    assert store.version == 2 and list(store.scan()) == [(b"a", b"3")]
    store.abort()
