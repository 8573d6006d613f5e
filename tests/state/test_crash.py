"""Real processes killed with SIGKILL mid-commit and mid-snapshot."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from riverbed.state.provider import STAGING
from tests.state.procs import expected, provider

pytestmark = pytest.mark.slow
PROCS = Path(__file__).with_name("procs.py")


def uploading(root: Path) -> bool:
    """A snapshot is being made: its checkpoint is staged on the writer's disk until its
    files and manifest are stored (the window a kill leaves a partial upload in)."""
    staged = root / "local" / STAGING
    return staged.is_dir() and any(staged.iterdir())


def snapshot_entries(partition: Path) -> list[Path]:
    """The partition's snapshot directories (none before a first manifest is written)."""
    snapshots = partition / "snapshot"
    return list(snapshots.iterdir()) if snapshots.exists() else []


def run_and_kill(
    root: Path, env: dict[str, str], after: float, when: Callable[[], bool] | None = None
) -> int:
    """Start the writer; SIGKILL it after ``after`` seconds, or as soon as ``when()`` holds
    once ``after`` has passed. Returns the last acknowledged version."""
    child = subprocess.Popen(
        [sys.executable, str(PROCS), str(root)], stdout=subprocess.PIPE, text=True, env=env
    )
    acked: list[int] = []

    def read() -> None:
        assert child.stdout is not None
        acked.extend(int(line) for line in child.stdout)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(after)
    deadline = time.monotonic() + 20
    while when is not None and not when() and time.monotonic() < deadline:
        time.sleep(0.0005)  # watching another process's files: nothing to wait on
    if when is not None:
        assert when(), "the moment to kill never came"
    child.kill()
    child.wait()
    reader.join()
    return acked[-1] if acked else 0


def test_killed_writer_leaves_exactly_a_committed_version(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    rng = random.Random(7)
    last_acked = 0
    for round_no in range(8):
        # odd rounds: kill exactly during a snapshot upload; even rounds: at random
        when = (lambda: uploading(tmp_path)) if round_no % 2 else None
        acked = run_and_kill(tmp_path, subprocess_env, rng.uniform(0.8, 2.0), when)
        last_acked = max(last_acked, acked)
        if round_no % 3 == 2:
            shutil.rmtree(tmp_path / "local")  # and sometimes the machine is gone too
        store = provider(tmp_path).load("crash", 0)
        try:
            assert store.version >= last_acked, "an acknowledged commit was lost"
            assert dict(store.scan()) == expected(store.version), "partial version served"
        finally:
            store.abort()
    assert last_acked > 8, "the writer made too little progress to test anything"


def test_every_retained_version_reloads_exactly_after_crashes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    for after in (1.0, 1.3):
        run_and_kill(tmp_path, subprocess_env, after, lambda: uploading(tmp_path))
    p = provider(tmp_path)
    versions = p.versions("crash", 0)
    assert versions == list(range(1, versions[-1] + 1))
    for v in random.Random(3).sample(versions, min(6, len(versions))):
        store = p.load("crash", 0, v)
        assert store.version == v and dict(store.scan()) == expected(v)
        store.abort()
    # an interrupted upload leaves files no manifest names, and perhaps the temporary
    # file of its manifest (killed while writing it, before the link that creates it):
    # a snapshot counts only with its manifest, written last. On a slow host both kills
    # can land in the first uploads' files, before any manifest: no snapshot directory
    partition = tmp_path / "durable" / "crash" / "0"
    for entry in snapshot_entries(partition):
        names = [f.name for f in entry.iterdir()]
        assert "MANIFEST.riverbed.json" in names or all(n.endswith(".tmp") for n in names)
    # maintenance sweeps them, and the checkpoints the killed writer was uploading from
    # (age 0 here: no writer is running)
    p.maintain("crash", 0, sweep_after=0)
    assert not [e for e in partition.rglob(".*") if e.is_file()], "a temporary file was left"
    for entry in snapshot_entries(partition):  # what is left is whole snapshots
        assert (entry / "MANIFEST.riverbed.json").exists(), sorted(entry.iterdir())
    assert p.versions("crash", 0) == versions  # and nothing a snapshot needs went
    assert not list((tmp_path / "local" / STAGING).glob("*")), "a staged checkpoint was left"
