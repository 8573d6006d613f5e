"""A directory's sweep of interrupted writes runs beside writes under way (the stream's
maintenance runs in its own thread while the next batch commits): a temporary file
renamed into place between the listing and the look at it is a finished write, and a
stale one (a killed write's) goes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from riverbed.state.location import open_storage


def test_a_sweep_beside_writes_neither_fails_nor_removes_a_fresh_write(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    stale = tmp_path / "ns" / "0" / "changelog" / ".00000000000000000999.rbcl.0f.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"a killed write")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    stop = threading.Event()
    written: list[str] = []
    failed: list[BaseException] = []

    def writer() -> None:
        i = 0
        try:
            while not stop.is_set():
                name = f"ns/0/changelog/{i:020d}.rbcl"
                storage.write(name, os.urandom(64))
                written.append(name)
                i += 1
        except BaseException as exc:  # the test fails with it (a thread's would not)
            failed.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    sweeps = 0
    try:
        # sweeps while the writer writes — counted in sweeps and writes, not seconds (a
        # loaded host does fewer of either in a given time)
        while (sweeps < 30 or len(written) < 300) and not failed:
            # as the maintenance sweeps: only what an hour old is stale, but every
            # temporary file it lists is looked at (and may be renamed meanwhile)
            storage.sweep("ns/0", older_than=3600)
            sweeps += 1
    finally:
        stop.set()
        thread.join()
    assert not failed, failed
    leftovers = list((tmp_path / "ns" / "0").rglob(".*.tmp"))
    assert leftovers == []  # the stale one swept, none of the writer's left
    assert sorted(storage.list("ns/0/changelog")) == sorted(n.rsplit("/", 1)[1] for n in written)
