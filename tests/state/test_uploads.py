"""Snapshot uploads in the background (riverbed.state.uploads): a commit that takes a
snapshot does not wait for its upload, a partition has one upload at a time, the
snapshots arrive whole once the block ends, and a failed upload loses nothing."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from riverbed.state import StateConfig, StateProvider, uploads
from riverbed.state.openpool import keep_open
from riverbed.state.provider import STAGING


def _commits(provider: StateProvider, versions: range) -> None:
    for v in versions:
        store = provider.load("ns", 0, version=v - 1)
        store.put(f"k{v}".encode(), f"v{v}".encode())
        store.commit(v)


def _fresh(provider: StateProvider, tmp_path: Path, name: str) -> StateProvider:
    """The same durable tier seen from another machine (an empty local disk)."""
    config = provider.config
    return StateProvider(
        StateConfig(
            local_dir=tmp_path / name,
            durable=config.durable,
            engine=config.engine,
            snapshot_every=config.snapshot_every,
            retain_versions=config.retain_versions,
        )
    )


def test_snapshots_uploaded_in_the_background_arrive_whole_and_rebuild_the_state(
    provider: StateProvider, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with keep_open(), uploads.in_background():
        _commits(provider, range(1, 8))  # snapshot_every=3: due at 3 and 6 (or later)
    assert uploads.wait_all(0), "leaving the block waits for the uploads"
    index = provider.index("ns", 0)
    assert index.snapshots, "no snapshot arrived"
    assert max(index.snapshots) >= 3
    assert not list((tmp_path / "local" / STAGING).glob("*")), "a checkpoint was left"
    caplog.set_level(logging.INFO, logger="riverbed.state.provider")
    other = _fresh(provider, tmp_path, "other")
    store = other.load("ns", 0, version=7)
    assert {k: store.get(k) for k in (b"k1", b"k7")} == {b"k1": b"v1", b"k7": b"v7"}
    store.abort()
    assert f"from snapshot {max(index.snapshots)}" in caplog.text


class _Gated:
    """The real durable storage, whose directory uploads wait for ``gate`` (and fail
    while ``fail`` is set): what a slow or failing bucket looks like to the commit."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.fail = False
        self.started = threading.Event()

    def upload_dir(self, local: Path, name: str) -> None:
        self.started.set()
        assert self.gate.wait(30)
        if self.fail:
            raise OSError("the bucket said no")
        self.inner.upload_dir(local, name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _gated(tmp_path: Path) -> tuple[StateProvider, _Gated]:
    provider = StateProvider(
        StateConfig(
            local_dir=tmp_path / "local",
            durable=f"file://{tmp_path / 'durable'}",
            snapshot_every=3,
        )
    )
    gated = _Gated(provider.durable)
    provider.durable = gated  # type: ignore[assignment]
    return provider, gated


def test_a_commit_does_not_wait_for_its_snapshot_and_takes_no_second_one_meanwhile(
    tmp_path: Path,
) -> None:
    provider, gated = _gated(tmp_path)
    with keep_open(), uploads.in_background():
        _commits(provider, range(1, 4))  # version 3's commit starts the upload and returns
        assert gated.started.wait(10)
        assert not provider.index("ns", 0).snapshots, "the upload was let through"
        _commits(provider, range(4, 8))  # 6 would be due: one upload at a time
        gated.gate.set()
    assert set(provider.index("ns", 0).snapshots) == {3}
    other = _fresh(provider, tmp_path, "other")
    store = other.load("ns", 0, version=7)
    assert store.get(b"k3") == b"v3" and store.get(b"k7") == b"v7"
    store.abort()


def test_a_failed_background_upload_loses_nothing_and_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider, gated = _gated(tmp_path)
    gated.fail = True
    gated.gate.set()
    with keep_open(), uploads.in_background():
        _commits(provider, range(1, 4))
        assert uploads.wait_all(10)
        assert "snapshot upload" in caplog.text and "failed" in caplog.text
        assert not provider.index("ns", 0).snapshots
        assert not list((tmp_path / "local" / STAGING).glob("*"))
        gated.fail = False
        _commits(provider, range(4, 7))  # three versions after the last one seen
    assert set(provider.index("ns", 0).snapshots) == {6}
    other = _fresh(provider, tmp_path, "other")
    store = other.load("ns", 0, version=6)
    assert [store.get(f"k{v}".encode()) for v in range(1, 7)] == [
        f"v{v}".encode() for v in range(1, 7)
    ]
    store.abort()


def test_outside_the_block_a_commit_uploads_its_snapshot_itself(tmp_path: Path) -> None:
    provider, gated = _gated(tmp_path)
    gated.gate.set()
    _commits(provider, range(1, 4))
    assert set(provider.index("ns", 0).snapshots) == {3}, "not there when commit returned"


def test_a_checkpoint_left_by_a_killed_upload_is_swept_once_stale(
    provider: StateProvider, tmp_path: Path
) -> None:
    """A process killed while it uploaded leaves its checkpoint (hard links that pin
    replaced files); the purge sweeps the stale ones, never one of a live upload."""
    _commits(provider, range(1, 3))
    staging = tmp_path / "local" / STAGING
    old, young = staging / "old", staging / "young"
    for folder in (old, young):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "000001.sst").write_bytes(b"x" * 100)
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    provider.purge("ns", 0, sweep_after=3600)
    assert not old.exists(), "a stale checkpoint was kept"
    assert (young / "000001.sst").exists(), "a live upload's checkpoint was swept"
    store = provider.load("ns", 0)
    assert store.version == 2 and store.get(b"k2") == b"v2"
    store.abort()
