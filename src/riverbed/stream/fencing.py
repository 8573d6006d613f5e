"""One active driver per aggregation: its term, recorded in the checkpoint, fences
every write.

The driver that wins the election ``streams/<name>`` in the control plane claims its
term (the election's fencing token, which only grows) in the checkpoint's store before
it starts the query: :func:`checkpoint_fence`, a :class:`riverbed.fencing.StoreFence`
under ``riverbed/terms/`` (:mod:`riverbed.stream.layout`) — in a directory and in a
bucket alike. Every write of a batch — the batch record, the result table, the SQL and
topic sinks, the side topics, the purge of old history, and each state task's commit —
first checks that the recorded term is still its own; a driver that was paused
(SIGSTOP, a long GC, a partition) and resumed after a standby took over finds a newer
term and raises :class:`DriverFencedError` instead of writing. Pure functions of the
checkpoint, so state tasks on executors check the same way the driver does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from riverbed.errors import FencedError
from riverbed.fencing import StoreFence
from riverbed.stream.layout import LEGACY_DRIVER, TERMS, checkpoint_store

TERMS_KEPT = 5  # term records kept (older ones are pruned on takeover)

# Self-fencing: the driver process registers, per term it holds, a check of its own
# lease clock (DriverLease). Every write check of that term in this process runs it
# first, without the network: a driver cut off from the control plane stops writing
# before its lease could expire and a standby be elected — the recorded term, checked
# next, is what stops a driver that did not notice in time.
_self_fences: dict[int, Callable[[], None]] = {}


def hold_term(term: int, check: Callable[[], None]) -> None:
    """Run ``check`` (raising :class:`DriverFencedError`) before every write of ``term``
    checked in this process."""
    _self_fences[term] = check


def release_term(term: int) -> None:
    _self_fences.pop(term, None)


class DriverFencedError(FencedError):
    """A newer driver took over this aggregation: this one must not write."""


def checkpoint_fence(checkpoint: str | Path, name: str = "") -> StoreFence:
    """The fence of a checkpoint's drivers: their terms as create-only objects
    ``riverbed/terms/<term>.json`` of its store (a directory's checkpoint from before
    term objects has one replaced ``riverbed/driver.json``, still read)."""
    return StoreFence(
        checkpoint_store(checkpoint),
        TERMS,
        f"this driver of '{name}'",
        DriverFencedError,
        kept=TERMS_KEPT,
        legacy=LEGACY_DRIVER,
    )


def record_term(checkpoint: str | Path, term: int, driver: str, since: str) -> None:
    """Record the new active driver (:meth:`StoreFence.claim`)."""
    checkpoint_fence(checkpoint).claim(term, driver, since)


def recorded_driver(checkpoint: str | Path) -> dict[str, Any] | None:
    """The newest driver's record (``term``, ``driver``, ``since``), or None."""
    current = checkpoint_fence(checkpoint).current()
    if current is None:
        return None
    return {"term": current.term, "driver": current.holder, "since": current.since}


def check_term(checkpoint: str | Path, term: int | None, name: str) -> None:
    """Raise :class:`DriverFencedError` unless ``term`` is the recorded one (``None``:
    a query started without an election, as in tests and notebooks: not fenced)."""
    if term is None:
        return
    self_fence = _self_fences.get(term)
    if self_fence is not None:
        self_fence()
    checkpoint_fence(checkpoint, name).check(term)
