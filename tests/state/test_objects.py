"""State on an object store: snapshots upload only new files, a machine with an empty
disk restores from the bucket, unreferenced files are swept, damage is found."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from riverbed.state import StateConfig, StateProvider
from riverbed.state.objects import SHARED, ObjectStorage
from riverbed.storage import open_store
from tests.conftest import LOCATIONS, location_of


def provider(url: str, local: Path) -> StateProvider:
    return StateProvider(
        StateConfig(local_dir=local, durable=url, snapshot_every=2, retain_versions=2)
    )


def commit(p: StateProvider, version: int, n: int, seed: int) -> None:
    store = p.load("agg", 0, version - 1)
    for i in range(n):
        store.put(b"k%06d-%d" % (i, seed), os.urandom(64))
    store.commit(version)


def contents(p: StateProvider, version: int) -> dict[bytes, bytes]:
    store = p.load("agg", 0, version)
    try:
        return dict(store.scan())
    finally:
        store.abort()


@pytest.mark.parametrize("kind", LOCATIONS)
def test_snapshots_are_incremental_and_restore_on_an_empty_disk(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """In a bucket and in a directory alike (one ObjectStorage on either store)."""
    url = location_of(kind, request, tmp_path, "durable")
    p = provider(url, tmp_path / "machine-1")
    storage = p.durable
    assert isinstance(storage, ObjectStorage)
    for version in range(1, 9):
        commit(p, version, 3000, version)
    stats = storage.stats
    assert stats.reused_files > 0, "later snapshots share the unchanged SST files"
    total = stats.uploaded_bytes + stats.reused_bytes
    assert stats.uploaded_bytes < total
    want = contents(p, 8)
    # a new machine: nothing local, only the bucket
    shutil.rmtree(tmp_path / "machine-1")
    fresh = provider(url, tmp_path / "machine-2")
    assert contents(fresh, 8) == want
    assert fresh.durable.stats.downloaded_bytes > 0  # type: ignore[attr-defined]


def test_purge_sweeps_files_no_snapshot_needs(s3_url: str, tmp_path: Path) -> None:
    p = provider(s3_url, tmp_path / "local")
    for version in range(1, 11):
        commit(p, version, 2000, version)
    store = open_store(s3_url)
    shared_before = {o.key for o in store.list(f"agg/0/{SHARED}/")}
    p.purge("agg", 0, sweep_after=0)
    p.purge("agg", 0, sweep_after=0)  # the sweep runs before the purge deletes snapshots
    shared_after = {o.key for o in store.list(f"agg/0/{SHARED}/")}
    assert shared_after < shared_before, "the purged snapshots' own files are gone"
    storage = p.durable
    assert isinstance(storage, ObjectStorage)
    for name in storage.list("agg/0/snapshot"):
        assert storage.verify_dir(f"agg/0/snapshot/{name}") == []  # nothing needed was swept
    shutil.rmtree(tmp_path / "local")
    assert len(contents(provider(s3_url, tmp_path / "again"), 10)) == 20_000


def test_a_damaged_shared_file_is_found_and_set_aside(s3_url: str, tmp_path: Path) -> None:
    p = provider(s3_url, tmp_path / "local")
    for version in range(1, 5):
        commit(p, version, 500, version)
    want = contents(p, 4)
    store = open_store(s3_url)
    victim = max(
        (o for o in store.list(f"agg/0/{SHARED}/") if ".sst." in o.key), key=lambda o: o.size
    )
    store.put(victim.key, b"\0" * victim.size)  # same size, wrong bytes
    damage = p.verify("agg", 0)
    assert damage and all(d.kind == "snapshot" for d in damage)
    assert any("fails its checksum" in d.problem for d in damage)
    p.verify("agg", 0, quarantine=True)
    assert p.verify("agg", 0) == []
    shutil.rmtree(tmp_path / "local")
    # rebuilt from the changelogs (no clean snapshot is left): the same state
    assert contents(provider(s3_url, tmp_path / "other"), 4) == want
