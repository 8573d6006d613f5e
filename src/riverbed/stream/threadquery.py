"""A loop on a driver thread that looks like Spark's ``StreamingQuery``: what riverbed's
own trigger loops share — a log-native aggregation's (:class:`riverbed.stream.loop.
DirectQuery`) and a stream-stream join's (:class:`riverbed.stream.joinquery.JoinQuery`).

A subclass sets itself up, then calls :meth:`ThreadQuery._start`; its :meth:`_body`
runs on the thread inside a Spark job group (so :meth:`stop` can cancel the running
batch's job) with the state partitions kept open between batches and snapshot uploads
off the batch's thread, and drives :meth:`_triggered` — the trigger loop: plan, run,
wait — reporting each batch (:meth:`_add_progress`). What stopped the loop (unless
:meth:`stop` did) is kept and raised by :meth:`awaitTermination`, as Spark's is.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from riverbed.spark import tasks
from riverbed.state import uploads
from riverbed.state.openpool import keep_open

if TYPE_CHECKING:
    from riverbed.stream.plan import Trigger

log = logging.getLogger(__name__)

PROGRESS_KEPT = 100  # like spark.sql.streaming.numRecentProgressUpdates
# how often an idle query with processingTime 0 looks at its input again: new input is
# seen within this, and an idle driver does not spin on the log's offsets
IDLE_POLL_S = 0.01


class ThreadQuery:
    """The ``StreamingQuery`` part of a loop on a driver thread (see the module doc)."""

    kind = "query"  # how errors name it: "aggregation", "join"

    def __init__(self, spark: Any, name: str, group: str, trigger: Trigger) -> None:
        self.spark = spark
        self.name = name
        self.trigger = trigger
        self.id = str(uuid.uuid4())
        self._group = f"{group}-{self.id}"
        self._stop = threading.Event()
        self._done = threading.Event()
        self._idle = threading.Event()  # set while no input is waiting
        self._exception: BaseException | None = None
        self._progress: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._main, name=f"riverbed {name}")
        self._thread.daemon = True

    def _start(self) -> None:
        self._thread.start()

    def _body(self) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            tasks.tag(self.spark, self._group, f"riverbed {self.name}")
            # the partitions of batches run here stay open between them (a Spark job's
            # batch lets them go first); all are closed when the loop ends. Their
            # snapshots upload off the batch's thread; the loop's end waits.
            with keep_open(), uploads.in_background():
                self._body()
        except BaseException as exc:
            if not self._stop.is_set():  # a cancelled job is how stop() ends a batch
                self._exception = exc
                log.error("%s %s stopped: %s", self.kind, self.name, exc)
        finally:
            self._idle.set()
            self._done.set()

    def _triggered(
        self,
        plan: Callable[[], tuple[Any, ...] | None],
        run: Callable[..., None],
    ) -> None:
        """The trigger loop: ``plan()`` the next batch (the newest again if it did not
        finish; ``None``: no input — with ``availableNow`` the loop ends, else it waits a
        trigger interval) and ``run`` it (what ``plan`` gave — its id and record — and
        when the trigger began),
        one batch per ``processingTime`` interval at most, until stopped. A stop while
        planning leaves the plan for the next start."""
        while not self._stop.is_set():
            began = time.perf_counter()
            planned = plan()
            if planned is None:  # nothing to read
                self._idle.set()
                if self.trigger.available_now:
                    return
                self._stop.wait(max(self.trigger.interval_s, IDLE_POLL_S))
                continue
            if self._stop.is_set():  # stopped while planning: the plan waits for the next start
                return
            run(*planned, began)
            if not self.trigger.available_now:
                rest = self.trigger.interval_s - (time.perf_counter() - began)
                if rest > 0:
                    self._stop.wait(rest)

    def _add_progress(self, entry: dict[str, Any]) -> None:
        self._progress.append(entry)
        del self._progress[:-PROGRESS_KEPT]

    # -- StreamingQuery ---------------------------------------------------------------

    @property
    def isActive(self) -> bool:
        return not self._done.is_set()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the loop to end (``timeout`` seconds at most: then ``True`` if it
        ended); raise what stopped it, as Spark's does."""
        ended = self._done.wait(timeout)
        if ended and self._exception is not None:
            raise self._exception
        return ended if timeout is not None else None

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the loop to end; whether it did (what
        stopped it, if anything: :meth:`exception`)."""
        return self._done.wait(timeout)

    def processAllAvailable(self) -> None:
        """Block until every record in the topic(s) now has been processed (or the loop
        ended: then raise what stopped it)."""
        self._idle.clear()
        while not self._idle.wait(0.05):
            if self._done.is_set():
                break
        if self._exception is not None:
            raise self._exception

    def stop(self) -> None:
        """Stop: the running batch's Spark job is cancelled (it runs again, from its
        record, at the next start) and the loop ends."""
        self._stop.set()
        if self._thread.is_alive():
            try:
                tasks.interrupt(self.spark, self._group)
            except Exception as exc:  # a stopped SparkContext has no jobs to cancel
                log.debug("cancelling %s: %s", self._group, exc)
            self._thread.join()

    def exception(self) -> BaseException | None:
        return self._exception

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return list(self._progress)

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self._progress[-1] if self._progress else None


__all__ = ["IDLE_POLL_S", "PROGRESS_KEPT", "ThreadQuery"]
