"""One active driver per aggregation: its term, recorded in the checkpoint, fences
every write.

The driver that wins the election ``streams/<name>`` in the control plane records
its term (the election's fencing token, which only grows) before it starts the query,
as a new object ``riverbed/terms/<term>.json`` of the checkpoint's store, created once,
the newest ruling (:mod:`riverbed.stream.layout`) — in a directory and in a bucket
alike; a record of an older term arriving late never rules. Every write of a
batch — the batch record, the result directory, the SQL and topic sinks, the side
topics, the purge of old history, and each state task's commit — first checks that
the recorded term is still its own; a driver that was paused (SIGSTOP, a long GC, a
partition) and resumed after a standby took over finds a newer term and raises
:class:`DriverFencedError` instead of writing. Pure functions of the checkpoint, so
state tasks on executors check the same way the driver does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.errors import FencedError
from riverbed.stream.layout import LEGACY_DRIVER, TERMS, checkpoint_store, numbered, term_key

if TYPE_CHECKING:
    from riverbed.storage import ObjectStore

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


def _terms(store: ObjectStore) -> list[int]:
    """The terms recorded in a checkpoint, oldest first (one LIST)."""
    return numbered([i.key for i in store.list(TERMS)], TERMS, ".json")


def record_term(checkpoint: str | Path, term: int, driver: str, since: str) -> None:
    """Record the new active driver: its term's object, created once; the oldest
    beyond :data:`TERMS_KEPT` are pruned."""
    record = json.dumps({"term": term, "driver": driver, "since": since}).encode()
    store = checkpoint_store(checkpoint)
    store.put_if_absent(term_key(term), record)  # a term is recorded once
    store.delete_many(term_key(t) for t in _terms(store)[:-TERMS_KEPT])


def recorded_driver(checkpoint: str | Path) -> dict[str, Any] | None:
    """The newest driver's record (``term``, ``driver``, ``since``), or None."""
    from riverbed.storage import ObjectNotFoundError

    store = checkpoint_store(checkpoint)
    for term in reversed(_terms(store)):
        try:
            newest: dict[str, Any] = json.loads(store.get(term_key(term)))
        except ObjectNotFoundError:  # pruned between the listing and the read
            continue
        return newest
    try:  # a directory's checkpoint from before term objects: one replaced file
        legacy: dict[str, Any] = json.loads(store.get(LEGACY_DRIVER))
    except ObjectNotFoundError:
        return None
    return legacy


def check_term(checkpoint: str | Path, term: int | None, name: str) -> None:
    """Raise :class:`DriverFencedError` unless ``term`` is the recorded one (``None``:
    a query started without an election, as in tests and notebooks: not fenced)."""
    if term is None:
        return
    self_fence = _self_fences.get(term)
    if self_fence is not None:
        self_fence()
    terms = _terms(checkpoint_store(checkpoint))  # one LIST; a GET only to name a newer
    if terms and terms[-1] == term:
        return
    current = recorded_driver(checkpoint)
    if current is None or int(current["term"]) != term:
        who = (
            f"{current['driver']} (term {current['term']}) since {current['since']}"
            if current
            else "nobody"
        )
        raise DriverFencedError(
            f"this driver of '{name}' (term {term}) was replaced by {who}; it stops "
            "without writing anything"
        )
