"""Saying what a slow batch waits on, while it waits.

A batch of a running stream takes well under a second to a few seconds. One that runs
much longer is waiting on something — a task on an executor whose host is gone, a
partition another process holds, a store or a server that does not answer — and the
driver's log said nothing until it finished (or never did). :class:`SlowBatchWatch`
runs beside the loop: once a batch has run ``after_s`` it logs a warning, and again
every ``every_s``, naming the batch, how long it has run, the loop thread's innermost
riverbed call (where it is), and the batch's Spark job if one runs: each stage's tasks
done of all, failed, and on which executors' hosts tasks run now (as Spark's status
store has them: it catches up on a task's start or end, or an executor's heartbeat).

The pure core is :func:`slow_line`; the watch is the I/O around it (a thread, Spark's
status tracker, the loop thread's stack).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

AFTER_S = 30.0  # a batch running this long is reported ...
EVERY_S = 30.0  # ... and again this often while it goes on


@dataclass(frozen=True)
class StageProgress:
    stage: int
    tasks: int
    done: int
    active: int
    failed: int


def slow_line(
    name: str,
    batch_id: int,
    elapsed_s: float,
    where: str | None,
    stages: Sequence[StageProgress],
    hosts: dict[str, int],
) -> str:
    """The warning for batch ``batch_id`` of ``name``, running ``elapsed_s``: ``where``
    the loop is (a riverbed call, or None), its Spark job's ``stages``, and ``hosts``
    (executor host → tasks running there now)."""
    parts = [f"batch {batch_id} of {name} has run for {elapsed_s:.0f} s"]
    if where:
        parts.append(f"in {where}")
    if stages:
        described = [
            f"stage {s.stage}: {s.done} of {s.tasks} tasks done"
            + (f", {s.active} running" if s.active else ", none running")
            + (f", {s.failed} failed" if s.failed else "")
            for s in sorted(stages, key=lambda s: s.stage)
        ]
        parts.append("Spark job: " + "; ".join(described))
        busy = sorted((h, n) for h, n in hosts.items() if n > 0)
        if busy:
            parts.append("tasks running on " + ", ".join(f"{h} ({n})" for h, n in busy))
    else:
        parts.append("no Spark job of it running")
    return " — ".join(parts)


def innermost(frame: FrameType | None, package: str = "riverbed") -> str | None:
    """The innermost frame of ``frame``'s stack in ``package`` (not this module), as
    ``module.function:line``."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if (module == package or module.startswith(package + ".")) and module != __name__:
            return f"{module}.{frame.f_code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class SlowBatchWatch:
    """Watches the batches a loop thread runs (see the module doc)."""

    def __init__(
        self,
        spark: Any,
        name: str,
        group: str,
        after_s: float = AFTER_S,
        every_s: float = EVERY_S,
    ) -> None:
        self.spark = spark
        self.name = name
        self.group = group
        self.after_s = after_s
        self.every_s = every_s
        self._changed = threading.Condition()
        self._running: tuple[int, int, float] | None = None  # batch, thread, began
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        """Within this block the calling thread runs batch ``batch_id``."""
        with self._changed:
            self._running = (batch_id, threading.get_ident(), time.monotonic())
            if self._thread is None:  # one thread for the loop's life, started on first use
                self._thread = threading.Thread(
                    target=self._watch, name=f"riverbed {self.name} slow-batch watch", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._running = None
                self._changed.notify()

    def close(self) -> None:
        """End the watch's thread (the loop is over)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                running = self._running
                if running is None:
                    self._changed.wait()
                    continue
                due = running[2] + self.after_s  # first report, then one every every_s
                while self._running is running and not self._closed:
                    left = due - time.monotonic()
                    if left > 0:
                        self._changed.wait(left)
                        continue
                    self._changed.release()  # the batch may end meanwhile
                    try:
                        self._report(*running)
                    finally:
                        self._changed.acquire()
                    due = time.monotonic() + self.every_s

    def _report(self, batch_id: int, ident: int, began: float) -> None:
        try:
            where = innermost(sys._current_frames().get(ident))
            stages, hosts = self._spark()
            line = slow_line(self.name, batch_id, time.monotonic() - began, where, stages, hosts)
        except Exception as exc:  # a report must never harm the batch it reports on
            log.debug("describing slow batch %s: %s", batch_id, exc)
        else:
            log.warning(line)

    def _spark(self) -> tuple[list[StageProgress], dict[str, int]]:
        from riverbed.spark import is_connect
        from riverbed.spark.lazy import unstarted

        if is_connect(self.spark) or unstarted(self.spark):
            # Connect has no status tracker, and a session not started ran no stage: the
            # line says where the batch waits
            return [], {}
        sc = self.spark.sparkContext
        tracker = sc.statusTracker()
        stages = []
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None or job.status != "RUNNING":
                continue
            for stage_id in job.stageIds:
                info = tracker.getStageInfo(stage_id)
                if info is None:
                    continue  # not submitted yet (it waits for an earlier stage), or gone
                stages.append(
                    StageProgress(
                        stage_id,
                        info.numTasks,
                        info.numCompletedTasks,
                        info.numActiveTasks,
                        info.numFailedTasks,
                    )
                )
        hosts: dict[str, int] = {}
        if stages:
            for e in sc._jsc.sc().statusTracker().getExecutorInfos():
                hosts[e.host()] = hosts.get(e.host(), 0) + int(e.numRunningTasks())
        return stages, hosts


__all__ = ["AFTER_S", "EVERY_S", "SlowBatchWatch", "StageProgress", "innermost", "slow_line"]
