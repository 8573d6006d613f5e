"""Starting a Spark streaming query and waiting until its sources are initialized, with
the transient start-up failures of Python streaming sources retried: what the
DataFrame path of an aggregation (:mod:`riverbed.stream.dataframe`) and a join of
DataFrames (:mod:`riverbed.stream.joinframes`) start their queries with."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)


# Spark gives the Python processes a query starts 10 s to start and connect back
# (hard-coded in its PythonWorkerFactory): a Python streaming source's, and over Spark
# Connect the server's ``foreachBatch`` worker. On a machine busy enough for a Python
# start-up to take that long, a source's failure ends the query before its first batch,
# and a ``foreachBatch`` worker's fails the start itself (the server refuses the query).
# Nothing was planned yet either way, so starting again from the checkpoint is safe.
# How long a start is retried: a CI-like host (0.4 CPU) once failed 3 starts in a row,
# and a one-core suite run (three workers, a Connect server) five over ~70 s
# (2026-12-08). A failed start costs nothing (nothing ran), and a user's query on a busy
# shared Spark would rather start late than not: the waits between the tries double
# from 2 s up to 30 s, until they add up to PATIENCE_S.
FIRST_WAIT_S, MOST_WAIT_S, PATIENCE_S = 2.0, 30.0, 150.0


def start_waits(
    first: float = FIRST_WAIT_S, most: float = MOST_WAIT_S, patience: float = PATIENCE_S
) -> list[float]:
    """The waits before each start after the first: doubling from ``first``, at most
    ``most`` each, until they add up to ``patience`` (the last one cut to fit)."""
    waits: list[float] = []
    wait, left = first, patience
    while left > 0:
        if min(wait, most) >= left:
            waits.append(left)  # the last: cut to fit
            break
        waits.append(min(wait, most))
        left -= waits[-1]
        wait *= 2
    return waits


START_ATTEMPTS = 1 + len(start_waits())  # the first start and one after each wait
_TRANSIENT_START = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)


def transient_start_failure(failure: str) -> bool:
    """Whether a query that died while initializing its sources with this failure may
    simply be started again (a Python worker too slow to start, not a bad source)."""
    return any(text in failure for text in _TRANSIENT_START)


def start_query(writer: Any, name: str, *, init_timeout: float = 120.0) -> Any:
    """Start the query and wait until its sources are initialized; a query that died of a
    transient start-up failure is started again (up to :data:`START_ATTEMPTS` times, the
    waits between them :func:`start_waits`)."""
    waits = start_waits()
    for attempt in range(1, START_ATTEMPTS + 1):
        last = attempt == START_ATTEMPTS
        try:
            query = writer.start()
        except Exception as exc:  # over Connect: the server's foreachBatch worker
            if last or not transient_start_failure(str(exc)):
                raise
            worker = "its foreachBatch function's Python worker (on the Connect server)"
        else:
            failure = _initialization_failure(query, init_timeout)
            if failure is None or not transient_start_failure(failure) or last:
                return query
            worker = "its source's Python worker"
        log.warning(
            "query %r failed while starting: %s did not connect back within Spark's 10 s "
            "(is the machine overloaded?); starting it again from its checkpoint "
            "(attempt %d of %d)",
            name,
            worker,
            attempt + 1,
            START_ATTEMPTS,
        )
        time.sleep(waits[attempt - 1])  # let the load that starved it pass
    raise AssertionError("unreachable")  # pragma: no cover


# The status a query's thread sets the moment it fails or is stopped, before it stops its
# sources and turns TERMINATED: a query seen between the two is ending, not initialized
# (taken for initialized, a failed start went unretried: CI, stop 65).
_ENDING = ("Terminated with exception", "Stopped")


def start_phase(active: bool, message: object) -> str:
    """Where a starting query is, from its ``isActive`` and status message:
    ``initializing`` its sources, ``running`` (initialized), or ``ending`` — ended, or
    failed or stopped and still stopping its sources (active, its message already set)."""
    text = str(message or "")
    if not active or text.startswith(_ENDING):
        return "ending"
    return "initializing" if text.startswith("Initializing") else "running"


def _initialization_failure(query: Any, timeout: float) -> str | None:
    """The text of the exception a query died of while initializing its sources, or None
    once they are initialized (or after ``timeout`` s: the caller watches it from then)."""
    deadline = time.monotonic() + timeout
    while (phase := start_phase(query.isActive, query.status.get("message"))) == "initializing":
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    if phase == "running":
        return None
    # ended: wait for its termination to complete before asking why — its state turns
    # TERMINATED before everything of its end is in place, and a query asked in between
    # said it had no exception (a failed start then went unretried: a fresh-clone run)
    try:
        query.awaitTermination(60)
    except Exception as exc:  # the StreamingQueryException it died of
        return str(exc)
    error = query.exception()
    return None if error is None else str(error)


__all__ = [
    "START_ATTEMPTS",
    "start_phase",
    "start_query",
    "start_waits",
    "transient_start_failure",
]
