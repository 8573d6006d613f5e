"""A partition stays held while a restore swaps its directory: another process that
tries to open it meanwhile (a task of a driver that lost its lead) is refused, and the
restore's database is whole."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from riverbed.state.errors import PartitionBusyError
from riverbed.state.memory import MemoryEngine
from riverbed.state.rocksdb import RocksEngine

RESTORES = 120


def _probe(path: str, ready: Any, stop: Any, opened: Any) -> None:
    """Open the partition as often as it can until told to stop; count the successes."""
    engine = RocksEngine()
    ready.set()
    while not stop.is_set():
        try:
            db = engine.open(Path(path))
        except PartitionBusyError:
            continue
        with opened.get_lock():
            opened.value += 1
        db.close()


def test_no_other_process_opens_a_partition_while_a_restore_replaces_it(tmp_path: Path) -> None:
    """Old code closed the database, replaced its directory and opened it again: in
    between, an opener in another process got the partition (and a database it then
    deleted files from, or created afresh under the restore)."""
    engine = RocksEngine()
    path = tmp_path / "local" / "ns" / "0"
    db = engine.open(path)
    db.apply([("put", b"k", b"v2")], version=2, tag=12)

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    opened = ctx.Value("i", 0)
    prober = ctx.Process(target=_probe, args=(str(path), ready, stop, opened))
    prober.start()
    try:
        assert ready.wait(60), "the prober did not start"
        time.sleep(0.2)
        for i in range(RESTORES):
            if i % 2 == 0:  # a snapshot of the database itself: what a download brings
                copy: Path | None = tmp_path / f"copy-{i}"
                db.checkpoint(copy)
            else:  # a rebuild from the changelogs starts empty
                copy = None
            db = engine.replace(db, path, copy)
            assert copy is None or not copy.exists(), "the checkpoint was not consumed"
            assert db.marker == ((2, 12) if copy is not None else (0, 0))
            db.apply([("put", b"k", b"v2")], version=2, tag=12)
    finally:
        stop.set()
        prober.join(30)
        db.close()
    assert opened.value == 0, f"another process opened the partition {opened.value} times"
    # let go at close: the next opener gets it
    again = engine.open(path)
    assert again.get(b"k") == b"v2"
    again.close()


def test_a_replace_that_fails_lets_the_partition_go(tmp_path: Path) -> None:
    engine = RocksEngine()
    path = tmp_path / "ns" / "0"
    db = engine.open(path)
    db.apply([("put", b"k", b"v")], version=1, tag=1)
    with pytest.raises(FileNotFoundError):
        engine.replace(db, path, tmp_path / "no-such-checkpoint")
    other = engine.open(path)  # not refused as busy: the failed restore let go
    assert other.marker == (0, 0)  # its old directory was already gone
    other.close()


@pytest.mark.parametrize("make", [RocksEngine, MemoryEngine], ids=["rocksdb", "memory"])
def test_a_partition_is_held_across_a_replace_in_this_process_too(
    tmp_path: Path, make: Any
) -> None:
    engine = make()
    path = tmp_path / "ns" / "0"
    db = engine.open(path)
    db.apply([("put", b"k", b"v")], version=1, tag=1)
    snap = tmp_path / "snap"
    db.checkpoint(snap)
    db = engine.replace(db, path, snap)
    with pytest.raises(PartitionBusyError):
        engine.open(path)
    assert db.marker == (1, 1) and db.get(b"k") == b"v"
    db = engine.replace(db, path, None)
    assert db.marker == (0, 0) and db.get(b"k") is None
    with pytest.raises(PartitionBusyError):
        engine.open(path)
    db.close()
    engine.open(path).close()
