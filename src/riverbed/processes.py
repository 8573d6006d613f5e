"""Stopping a process and everything it started, for the code that SIGKILLs its children.

A process group is not enough: PySpark's Python daemon (``pyspark.daemon``, started by a
Spark JVM for Python UDFs and Arrow batches) calls ``setpgid(0, 0)``, so ``killpg`` of
the driver's group spares it and its workers, which may go on writing for a while. A
*session* keeps them: a child started with ``start_new_session=True`` (or that calls
``os.setsid()``) leads a session that every descendant stays in unless it calls
``setsid`` itself, which neither Spark nor PySpark does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from riverbed.errors import RiverbedError

__all__ = ["SessionStillAliveError", "is_alive", "kill_all", "kill_session", "session_members"]


class SessionStillAliveError(RiverbedError, OSError):
    """Processes of a SIGKILLed session were still alive at the deadline."""


def _state_and_session(stat: Path) -> tuple[str, int] | None:
    """A process's state letter and session id from its ``/proc/<pid>/stat``, or None
    if it is gone."""
    try:
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and ")"
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[3])


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    found = _state_and_session(Path(f"/proc/{pid}/stat"))
    return found is not None and found[0] != "Z"


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``, from ``/proc``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        got = _state_and_session(stat)  # None: gone meanwhile
        if got is not None and got[0] != "Z" and got[1] == sid:
            found.append(int(stat.parent.name))
    return found


def kill_all(members: Callable[[], list[int]], timeout: float = 60.0) -> list[int]:
    """SIGKILL what ``members()`` lists, again and again, until it lists nothing or
    ``timeout`` passes; the survivors (none, normally). The caller itself is spared."""
    me = os.getpid()
    deadline = time.monotonic() + timeout
    while pids := [pid for pid in members() if pid != me]:
        if time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return []


def kill_session(sid: int, timeout: float = 60.0) -> None:
    """SIGKILL every process of session ``sid`` and wait until none is alive; the
    caller itself is spared (a process may end the session it leads, then exit).
    Raises :class:`SessionStillAliveError` if some are still alive after ``timeout``."""
    survivors = kill_all(lambda: session_members(sid), timeout)
    if survivors:
        raise SessionStillAliveError(f"processes {survivors} of session {sid} did not exit")
