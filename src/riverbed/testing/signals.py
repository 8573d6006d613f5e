"""Pausing real processes in tests without stalling the others.

SQLite's writers on one machine take turns on a lock file
(:func:`riverbed.files.writer_lock`); a process SIGSTOPped inside a write transaction
holds every other writer of that database back until it resumes — no lease of the
control plane expires, no other worker claims a chunk. A test that pauses a process to
stand for a hung machine pauses it outside a write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import ExitStack

from riverbed.files import flocked, sqlite_path, writer_lock

__all__ = ["is_stopped", "stop_outside_writes", "wait_stopped"]


def stop_outside_writes(pid: int, *urls: str) -> None:
    """SIGSTOP process ``pid`` while holding the writer lock of each SQLite database among
    ``urls`` (the control plane's, the jobs queue's; etcd and PostgreSQL need none): it
    is then outside a write of them, or waiting to begin one."""
    with ExitStack() as held:
        for url in urls:
            database = sqlite_path(url, "control.db")
            if database is not None:
                held.enter_context(flocked(writer_lock(database)))
        os.kill(pid, signal.SIGSTOP)


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP: state ``T`` in ``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def wait_stopped(process: subprocess.Popen[str], timeout: float, what: str) -> None:
    """Until ``process`` has stopped itself (SIGSTOP at the point a test wants it
    paused); an AssertionError saying ``what`` did not happen if it exits first (with
    its output) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not is_stopped(process.pid):
        if process.poll() is not None:
            raise AssertionError(f"{what}: the process exited, {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f}s")
        time.sleep(0.05)
