"""A worker's decisions, with no I/O: what the worker knows goes in, what to do comes out.

:class:`~riverbed.jobs.worker.Worker` is the shell around these — executors, pipes, the
jobs database, the publication of outputs. Every choice it makes about a chunk is one
of the functions here, so each can be property-tested on its own
(``tests/jobs/test_decisions.py``):

* :func:`ending` — how an ended chunk is recorded: a success (published, then DONE), a
  failure (with the error a user reads and whether it was a cancel), or *fenced* (the
  attempt is no longer this worker's: nothing recorded, nothing published);
* :func:`claims_wanted` — how many chunks to claim now;
* :func:`stop_reason` — whether a heartbeat's answer (or the chunk's age) stops a
  running chunk, and why;
* :func:`defers` / :func:`flush_due` — whether a short success waits to be recorded with
  others in one transaction, and when that batch is due;
* :func:`wait_time` — how long the loop may sleep before something is due.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from riverbed.jobs.errors import JobsValueError

STOP_REASONS = ("cancel", "lost", "timeout")  # why a running chunk is being stopped
DEFER_AT_MOST = 0.05  # seconds a deferred success waits for its batch


@dataclass(frozen=True)
class Succeed:
    output: bool  # the chunk staged an output to publish


@dataclass(frozen=True)
class Fail:
    error: str
    cancelled: bool


@dataclass(frozen=True)
class Fenced:
    reason: str


Ending = Succeed | Fail | Fenced


def ending(answer: Mapping[str, Any] | None, stopping: str | None, timeout: float | None) -> Ending:
    """How a chunk that ended is recorded. ``answer`` is its executor's reply (``None``
    when the executor died or was killed), ``stopping`` why the worker stopped it, if
    it did. A chunk the worker was stopping never counts as a success, even if its
    answer arrived meanwhile; a reclaimed one (``lost``) records nothing."""
    if stopping is not None and stopping not in STOP_REASONS:
        raise JobsValueError(f"unknown stop reason {stopping!r}")
    if stopping is None and answer is not None and answer.get("ok"):
        return Succeed(bool(answer.get("output")))
    if stopping == "lost":
        return Fenced("reclaimed")
    if stopping == "timeout":
        return Fail(f"timed out after {timeout or 0:.0f}s", cancelled=False)
    if stopping == "cancel":
        return Fail("cancelled by request", cancelled=True)
    if answer is None:
        return Fail("the executor process died while running the chunk", cancelled=False)
    return Fail(str(answer.get("error") or "failed"), cancelled=False)


def claims_wanted(concurrency: int, running: int, held: int, prefetch: int, short: bool) -> int:
    """Free slots, plus up to ``prefetch`` held ahead while chunks are short, less what
    is held already; never negative."""
    ahead = prefetch if short else 0
    return max(0, concurrency - running + ahead - held)


def stop_reason(status: str, started: float, now: float, timeout: float | None) -> str | None:
    """What a heartbeat's ``status`` for a running chunk means: ``None`` to let it run,
    else why to stop it — the database's answer (``cancel``, ``lost``) first, then the
    chunk's own timeout."""
    if status != "ok":
        if status not in STOP_REASONS:
            raise JobsValueError(f"unknown heartbeat status {status!r}")
        return status
    if timeout is not None and now - started > timeout:
        return "timeout"
    return None


def defers(
    prefetch: int,
    answer: Mapping[str, Any] | None,
    stopping: str | None,
    ran_for: float,
    prefetch_below: float,
) -> bool:
    """Whether an ended chunk's success waits to be recorded with others (``prefetch``
    ≥ 2 and the chunk short): only a success the worker did not stop."""
    return (
        prefetch >= 2
        and answer is not None
        and bool(answer.get("ok"))
        and stopping is None
        and ran_for < prefetch_below
    )


def flush_due(deferred: int, held: int, since: float, now: float) -> bool:
    """Whether the deferred successes are recorded now: when no work is held to run
    meanwhile, or the oldest has waited :data:`DEFER_AT_MOST`."""
    return deferred > 0 and (held == 0 or now >= since + DEFER_AT_MOST)


def wait_time(
    now: float,
    next_beat: float,
    free_slots: int,
    next_retry: float | None,
    deferred_since: float | None,
) -> float:
    """How long the loop may wait for an answer or a wake-up: until the next heartbeat;
    with a free slot, no longer than until backed-off work becomes claimable; with
    deferred successes, no longer than their batch may wait."""
    wait = max(0.0, next_beat - now)
    if free_slots > 0 and next_retry is not None:
        wait = min(wait, next_retry)
    if deferred_since is not None:
        wait = min(wait, max(0.0, deferred_since + DEFER_AT_MOST - now))
    return wait


__all__ = [
    "DEFER_AT_MOST",
    "STOP_REASONS",
    "Ending",
    "Fail",
    "Fenced",
    "Succeed",
    "claims_wanted",
    "defers",
    "ending",
    "flush_due",
    "stop_reason",
    "wait_time",
]
