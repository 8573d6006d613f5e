"""A partition another process on this machine holds for good (a paused driver) is
loaded into a private copy rebuilt from the durable tier — after ``private_after``, not
never; one this process holds itself never is; the copy goes when its store ends, and
one a killed process left is swept."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from riverbed.state import StateConfig, StateProvider
from riverbed.state.errors import PartitionBusyError
from riverbed.state.provider import PRIVATE, RESTORE, STAGING


def _config(tmp_path: Path, **kw: Any) -> StateConfig:
    return StateConfig(
        local_dir=tmp_path / "local",
        durable=f"file://{tmp_path / 'durable'}",
        snapshot_every=3,
        **{"lock_timeout": 5.0, "private_after": 0.3, **kw},
    )


def _hold(config: StateConfig, ready: Any) -> None:
    """In another process: load partition 0 and keep it (then be paused or killed)."""
    store = StateProvider(config).load("ns", 0)
    ready.set()
    time.sleep(600)
    store.abort()


def _commit(provider: StateProvider, value: bytes, version: int) -> None:
    store = provider.load("ns", 0)
    assert store.version == version - 1
    store.put(b"k", value)
    store.commit(version)


def test_a_partition_a_paused_process_holds_is_loaded_into_a_private_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = StateProvider(_config(tmp_path))
    for v in range(1, 5):  # history in the durable tier: a snapshot at 3, changelog 4
        _commit(provider, str(v).encode(), v)
    shared = tmp_path / "local" / "ns" / "0"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=_hold, args=(_config(tmp_path), ready))
    process.start()
    try:
        assert ready.wait(120)
        os.kill(process.pid, signal.SIGSTOP)
        caplog.set_level(logging.WARNING, logger="riverbed.state.provider")
        began = time.monotonic()
        store = provider.load("ns", 0)
        waited = time.monotonic() - began
        assert 0.3 <= waited < 5.0  # private_after, not lock_timeout
        assert store.version == 4 and store.get(b"k") == b"4"
        assert "another process on this machine has held it" in caplog.text
        privates = list((tmp_path / "local" / PRIVATE).iterdir())
        assert len(privates) == 1 and privates[0].name.startswith(f"{os.getpid()}-")
        store.put(b"k", b"5")
        store.commit(5)
        assert list((tmp_path / "local" / PRIVATE).iterdir()) == []  # gone with its store
        again = provider.load("ns", 0)  # still held: a private copy again, at version 5
        assert again.version == 5 and again.get(b"k") == b"5"
        again.abort()
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
    store = provider.load("ns", 0)  # let go: the shared copy, caught up from the durable tier
    assert store.version == 5 and store.get(b"k") == b"5"
    store.abort()
    assert shared.exists()


def test_without_private_copies_a_held_partition_waits_then_fails(tmp_path: Path) -> None:
    config = _config(tmp_path, private_after=None, lock_timeout=1.0)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=_hold, args=(config, ready))
    process.start()
    try:
        assert ready.wait(120)
        began = time.monotonic()
        with pytest.raises(PartitionBusyError, match="another process") as caught:
            StateProvider(config).load("ns", 0)
        assert caught.value.elsewhere and time.monotonic() - began >= 1.0
    finally:
        process.kill()
        process.join(30)


def test_this_processs_own_second_load_is_refused_not_copied(tmp_path: Path) -> None:
    provider = StateProvider(_config(tmp_path, lock_timeout=0.6))
    held = provider.load("ns", 0)
    with pytest.raises(PartitionBusyError, match="already open in this process") as caught:
        provider.load("ns", 0)
    assert not caught.value.elsewhere
    assert not (tmp_path / "local" / PRIVATE).exists()
    held.abort()
    provider.load("ns", 0).abort()  # let go: loads again


def test_the_purge_sweeps_what_killed_loads_and_uploads_left(tmp_path: Path) -> None:
    provider = StateProvider(_config(tmp_path))
    _commit(provider, b"1", 1)
    local = tmp_path / "local"
    old, fresh = time.time() - 7200, time.time()
    for folder in (PRIVATE, RESTORE, STAGING):
        for name, when in (("stale", old), ("live", fresh)):
            leftover = local / folder / name
            (leftover / "ns").mkdir(parents=True)
            (leftover / "ns" / "f").write_bytes(b"x")
            os.utime(leftover, (when, when))
    provider.purge("ns", 0, sweep_after=3600)
    for folder in (PRIVATE, RESTORE, STAGING):
        assert sorted(p.name for p in (local / folder).iterdir()) == ["live"], folder
