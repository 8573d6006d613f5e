"""Damaged state: a changelog or snapshot that fails its checksum is a clear error with a
documented recovery — never a silent fallback — and nothing else is lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from riverbed.state import CorruptStateError, StateConfig, StateProvider
from tests.cli import run_cli


def make(tmp_path: Path, engine: str = "rocksdb") -> StateProvider:
    return StateProvider(
        StateConfig(
            local_dir=tmp_path / "local",
            durable=tmp_path / "durable",
            engine=engine,
            snapshot_every=3,
            retain_versions=100,
            lock_timeout=0.5,
        )
    )


def fill(provider: StateProvider, partition: int, versions: int) -> None:
    for v in range(1, versions + 1):
        store = provider.load("ns", partition)
        store.put(f"k{v}".encode(), f"v{v}".encode())
        store.put(b"last", str(v).encode())
        store.commit()


def state_at(
    provider: StateProvider, partition: int, version: int | None = None
) -> dict[bytes, bytes]:
    store = provider.load("ns", partition, version)
    try:
        return dict(store.scan())
    finally:
        store.abort()


def expected(version: int) -> dict[bytes, bytes]:
    return {
        **{f"k{v}".encode(): f"v{v}".encode() for v in range(1, version + 1)},
        b"last": str(version).encode(),
    }


def flip(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x20
    path.write_bytes(bytes(data))


def fresh_machine(tmp_path: Path, provider: StateProvider) -> StateProvider:
    """Another machine: the same durable store, an empty local directory."""
    shutil.rmtree(tmp_path / "local")
    return make(tmp_path, provider.config.engine)


@pytest.mark.parametrize("engine", ["rocksdb", "memory"])
def test_a_damaged_changelog_is_named_and_versions_before_it_still_load(
    tmp_path: Path, engine: str
) -> None:
    provider = make(tmp_path, engine)
    fill(provider, 0, 7)
    fill(provider, 1, 7)
    changelog = tmp_path / "durable" / "ns" / "0" / "changelog" / f"{5:020d}.rbcl"
    flip(changelog)
    provider = fresh_machine(tmp_path, provider)
    with pytest.raises(CorruptStateError) as caught:
        state_at(provider, 0, 5)
    message = str(caught.value)
    assert f"{5:020d}.rbcl failed its checksum" in message
    assert "version 5 of ns/0" in message and "riverbed state verify ns" in message
    assert state_at(provider, 0, 4) == expected(4)  # the history before it is whole
    assert state_at(provider, 1) == expected(7)  # other partitions are untouched
    damage = provider.verify("ns", 0)
    assert [(d.kind, d.name.rsplit("/", 1)[1]) for d in damage] == [("changelog", f"{5:020d}.rbcl")]
    assert provider.verify("ns", 1) == []


def test_a_damaged_snapshot_is_named_then_quarantined_and_rebuilt_without_it(
    tmp_path: Path,
) -> None:
    provider = make(tmp_path)
    fill(provider, 0, 7)
    partition = tmp_path / "durable" / "ns" / "0"
    snapshots = sorted((partition / "snapshot").iterdir())
    assert [s.name.split("-")[0] for s in snapshots] == [f"{3:020d}", f"{6:020d}"]
    # an SST file only the newest snapshot has (snapshots share unchanged files)
    older, newer = (
        set(json.loads((s / "MANIFEST.riverbed.json").read_text())["objects"].values())
        for s in snapshots
    )
    stored = max(
        (partition.parent.parent / key for key in newer - older if ".sst." in key),
        key=lambda f: f.stat().st_size,
    )
    sst = Path(stored.name.split(".sst.")[0] + ".sst")  # the file's name in the snapshot
    flip(stored)
    provider = fresh_machine(tmp_path, provider)
    with pytest.raises(CorruptStateError) as caught:
        state_at(provider, 0)
    message = str(caught.value)
    assert f"{sst.name} fails its checksum" in message
    assert "riverbed state verify ns --quarantine" in message
    [damage] = provider.verify("ns", 0)
    assert damage.kind == "snapshot" and sst.name in damage.problem
    [moved] = provider.verify("ns", 0, quarantine=True)
    assert moved.moved_to is not None and (tmp_path / "durable" / moved.moved_to).exists()
    assert provider.verify("ns", 0) == []
    # rebuilt from snapshot 3 and changelogs 4..7: exactly the committed state
    assert state_at(provider, 0) == expected(7)
    assert state_at(provider, 0, 6) == expected(6)


def test_state_verify_from_the_cli(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ck"
    provider = StateProvider(
        StateConfig(local_dir=tmp_path / "local", durable=checkpoints / "state", snapshot_every=3)
    )
    fill(provider, 0, 4)
    env = {**os.environ, "RIVERBED_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("state", *args, "--checkpoints", str(checkpoints), env=env)

    assert cli("verify").returncode == 0
    flip(checkpoints / "state" / "ns" / "0" / "changelog" / f"{2:020d}.rbcl")
    result = cli("verify", "ns")
    assert result.returncode == 1
    assert "damaged changelog" in result.stdout and f"{2:020d}.rbcl" in result.stdout
    assert "Traceback" not in result.stderr
