"""Partitions kept open between loads (riverbed.state.openpool): the same database comes
back without a reopen, another process gets it once let go, and a kept copy is never
used past a version committed elsewhere."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest

from riverbed.state import StateConfig, StateProvider
from riverbed.state.errors import PartitionBusyError, StateError
from riverbed.state.openpool import held, keep_open, let_go


def _config(tmp_path: Path, engine: str = "rocksdb") -> StateConfig:
    return StateConfig(
        local_dir=tmp_path / "local",
        durable=f"file://{tmp_path / 'durable'}",
        engine=engine,
        snapshot_every=1000,
        lock_timeout=0.3,
    )


def _commit(config: StateConfig, version: int, key: bytes, value: bytes) -> None:
    """In another process: load ``version``, put, commit (what a Spark task does)."""
    provider = StateProvider(config)
    store = provider.load("ns", 0, version=version)
    store.put(key, value)
    store.commit(version + 1)


def _in_another_process(target: Any, *args: Any) -> None:
    ctx = multiprocessing.get_context("spawn")
    process = ctx.Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == 0, f"the other process failed ({process.exitcode})"


def test_a_kept_partition_comes_back_open_and_is_let_go_for_other_processes(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    provider = StateProvider(config)
    with keep_open():
        store = provider.load("ns", 0, version=0)
        first = store._live()
        store.put(b"a", b"1")
        store.commit(1)
        assert held() == [tmp_path / "local" / "ns" / "0"]
        store = provider.load("ns", 0, version=1)
        assert store._live() is first, "the partition was opened again"
        assert store.get(b"a") == b"1"
        store.put(b"b", b"2")
        store.commit(2)
        # held: another process cannot have it
        with pytest.raises(PartitionBusyError):
            provider.engine.open(tmp_path / "local" / "ns" / "0")
        let_go()
        assert held() == []
        _in_another_process(_commit, config, 2, b"c", b"3")  # it can now
        store = provider.load("ns", 0, version=3)
        assert store._live() is not first
        assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (b"1", b"2", b"3")
        store.abort()
        assert len(held()) == 1  # an abort leaves the database as it was: kept
    assert held() == [], "leaving keep_open closed what it kept"
    provider.engine.open(tmp_path / "local" / "ns" / "0").close()


def test_a_kept_copy_behind_the_durable_tier_is_brought_up_to_date(tmp_path: Path) -> None:
    """A kept database at version 1 while version 2 was committed elsewhere (from
    another directory: another machine) is not taken for version 2."""
    config = _config(tmp_path)
    provider = StateProvider(config)
    with keep_open():
        store = provider.load("ns", 0, version=0)
        store.put(b"a", b"1")
        store.commit(1)
        elsewhere = StateConfig(**{**config.__dict__, "local_dir": tmp_path / "elsewhere"})
        _in_another_process(_commit, elsewhere, 1, b"a", b"2")
        store = provider.load("ns", 0, version=2)
        assert store.version == 2 and store.get(b"a") == b"2"
        store.abort()


def test_outside_keep_open_a_partition_is_closed_after_commit(tmp_path: Path) -> None:
    provider = StateProvider(_config(tmp_path))
    store = provider.load("ns", 0, version=0)
    store.put(b"a", b"1")
    store.commit(1)
    assert held() == []
    provider.engine.open(tmp_path / "local" / "ns" / "0").close()


def test_a_commit_that_fails_closes_instead_of_keeping(tmp_path: Path) -> None:
    config = _config(tmp_path)
    provider = StateProvider(config)
    with keep_open():
        store = provider.load("ns", 0, version=0)
        store.put(b"a", b"1")
        changelogs = tmp_path / "durable" / "ns" / "0" / "changelog"
        shutil.rmtree(changelogs, ignore_errors=True)
        changelogs.parent.mkdir(parents=True, exist_ok=True)
        changelogs.write_text("a file where the directory goes: the changelog cannot be written")
        with pytest.raises((StateError, OSError)):
            store.commit(1)
        assert held() == []
        provider.engine.open(tmp_path / "local" / "ns" / "0").close()


def test_letting_one_namespace_go_keeps_the_others_open(tmp_path: Path) -> None:
    """A Spark job of one aggregation needs its partitions in other processes; the
    driver's other aggregation (a chained one) keeps its own open meanwhile."""
    from riverbed.state.provider import local_root

    config = _config(tmp_path)
    provider = StateProvider(config)
    with keep_open():
        for namespace in ("head", "headless", "next"):
            store = provider.load(namespace, 0, version=0)
            store.put(b"a", b"1")
            store.commit(1)
        kept = provider.load("next", 0, version=1)
        live = kept._live()
        kept.abort()
        let_go(local_root(config, "head"))  # not "headless", whose name starts the same
        assert held() == [tmp_path / "local" / n / "0" for n in ("headless", "next")]
        store = provider.load("next", 0, version=1)
        assert store._live() is live, "the other namespace's partition was reopened"
        store.abort()
        provider.engine.open(tmp_path / "local" / "head" / "0").close()  # let go: free
    assert held() == []
