"""One fencing primitive: a term that only grows, recorded where the writes go, checked
before every write.

Three kinds of riverbed process elect one active writer, and each fences the writes of
the one it replaced the same way:

* a stream driver, in the checkpoint's store (:class:`StoreFence`: a create-only object
  per term — a directory or a bucket, whatever holds the checkpoint);
* a time-range driver, in the control plane (:class:`ControlFence`: one key, moved by
  compare-and-swap; :meth:`ControlFence.guard` puts the check *inside* the transaction
  that publishes a chunk);
* the jobs orchestrator, in the jobs database (``riverbed.jobs.termfence.SqlFence``: one
  row; the check runs inside each grooming transaction).

The **term** is always the election's fencing token (:mod:`riverbed.control.election`:
the leader key's create revision, which only grows across failovers). A :class:`Fence`
keeps the newest term claimed and who claimed it:

``claim(term, holder)``
    make ``term`` the acting one. A term older than the recorded one is refused with
    :class:`~riverbed.errors.FencedError` naming the newer holder; claiming the recorded
    term again changes nothing.
``check(term)``
    return when ``term`` is the newest recorded, raise ``FencedError`` otherwise.
``current()``
    the newest :class:`Term`, or ``None``.

A writer claims right after it is elected and before it reads anything it will build
on, then checks before (or inside) each write: whatever a paused or cut-off writer
does after a newer one claimed is refused. ``tests/test_fencing.py`` is the contract
every backend passes.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from riverbed.errors import FencedError, InvalidValueError

if TYPE_CHECKING:
    from riverbed.control.base import Compare, ControlPlane
    from riverbed.storage import ObjectStore


def now_text() -> str:
    """A claim's time as recorded: UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Term:
    """A claimed term: its number, who holds it, since when (UTC, ISO 8601)."""

    term: int
    holder: str
    since: str

    def __str__(self) -> str:
        return f"{self.holder} (term {self.term}) since {self.since}"


class Fence(ABC):
    """The newest claimed term of one writer's role (see the module's docstring).

    ``subject`` names the role in errors ("this driver of 'clicks'"); ``error`` is the
    :class:`FencedError` subclass raised (each package's own)."""

    def __init__(self, subject: str, error: type[FencedError] = FencedError) -> None:
        self.subject = subject
        self.error = error

    @abstractmethod
    def current(self) -> Term | None:
        """The newest claimed term, or ``None`` before the first claim."""

    @abstractmethod
    def _record(self, term: int, holder: str, since: str) -> bool:
        """Record ``term`` unless a newer one is recorded; False when one is."""

    def claim(self, term: int, holder: str, since: str | None = None) -> Term:
        """Make ``term`` the acting term (see the module's docstring)."""
        if term < 0:
            raise InvalidValueError(f"a term is a non-negative number, not {term}")
        since = since or now_text()
        if not self._record(term, holder, since):
            raise self.refused(term, self.current())
        return Term(term, holder, since)

    def check(self, term: int) -> None:
        """Raise unless ``term`` is the newest claimed."""
        current = self.current()
        if current is None or current.term != term:
            raise self.refused(term, current)

    def refused(self, term: int, current: Term | None) -> FencedError:
        """The error for a write (or claim) of ``term`` while ``current`` acts."""
        who = str(current) if current is not None else "nobody"
        return self.error(
            f"{self.subject} (term {term}) was replaced by {who}; it stops without writing anything"
        )


# -- in an object store: one create-only object per term ---------------------------------


class StoreFence(Fence):
    """Terms as create-only objects ``<prefix><term:020d>.json`` of an ObjectStore (a
    directory or a bucket): a term is recorded once and never overwritten, so a claim
    needs no compare-and-swap — the newest object rules, and a claim whose term is not
    the newest after its put is refused (a record of an older term arriving late never
    rules). The oldest beyond ``kept`` are pruned on each claim.

    The record is ``{"term", "driver", "since"}`` (the stream checkpoint's format since
    its first release); ``legacy`` names one older, replaced-in-place record read when
    no term object exists."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        subject: str,
        error: type[FencedError] = FencedError,
        kept: int = 5,
        legacy: str | None = None,
    ) -> None:
        super().__init__(subject, error)
        self.store, self.prefix, self.kept, self.legacy = store, prefix, kept, legacy

    def key(self, term: int) -> str:
        return f"{self.prefix}{term:020d}.json"

    def terms(self) -> list[int]:
        """The recorded terms, oldest first (one LIST)."""
        from riverbed.storage.base import numbered

        return numbered([i.key for i in self.store.list(self.prefix)], self.prefix, ".json")

    def _record(self, term: int, holder: str, since: str) -> bool:
        body = json.dumps({"term": term, "driver": holder, "since": since}).encode()
        self.store.put_if_absent(self.key(term), body)  # recorded once
        terms = self.terms()
        self.store.delete_many(self.key(t) for t in terms[: -self.kept])
        return terms[-1] == term

    def check(self, term: int) -> None:
        terms = self.terms()  # one LIST; a GET only to name a newer holder
        if terms and terms[-1] == term:
            return
        super().check(term)

    def current(self) -> Term | None:
        from riverbed.storage import ObjectNotFoundError

        keys = [self.key(t) for t in reversed(self.terms())]
        for key in [*keys, *([self.legacy] if self.legacy else [])]:
            try:
                record = json.loads(self.store.get(key))
            except ObjectNotFoundError:  # pruned between the listing and the read
                continue
            return Term(int(record["term"]), str(record["driver"]), str(record["since"]))
        return None


# -- in the control plane: one key, moved by compare-and-swap -----------------------------


def _encoded(term: int) -> bytes:
    return b"%020d" % term


class ControlFence(Fence):
    """The term as one control-plane key ``riverbed/fence/<name>``, its value the
    zero-padded term, a space and the holder's record — so byte order is term order and
    the etcd-style value compares of :class:`~riverbed.control.base.Compare` decide."""

    def __init__(
        self,
        cp: ControlPlane,
        name: str,
        subject: str,
        error: type[FencedError] = FencedError,
    ) -> None:
        super().__init__(subject, error)
        self.cp = cp
        self.key = f"riverbed/fence/{name}".encode()

    def guard(self, term: int) -> list[Compare]:
        """Transaction guards that hold only while ``term`` is the newest claimed: put
        them in a transaction's compares and the check is one with the write."""
        from riverbed.control.base import Compare

        return [
            Compare.value(self.key) > _encoded(term),
            Compare.value(self.key) < _encoded(term + 1),
        ]

    def _record(self, term: int, holder: str, since: str) -> bool:
        from riverbed.control.base import Compare, Put

        value = _encoded(term) + b" " + json.dumps({"holder": holder, "since": since}).encode()
        put = [Put(self.key, value)]
        # Each failed swap means another claim moved the key: to a newer term (then this
        # one is refused below) or an older one (then the next swap holds) — no livelock.
        while True:
            if self.cp.txn([Compare.version(self.key) == 0], put).succeeded:
                return True
            current = self.current()
            if current is None:  # never deleted; only a racing first claim gets here
                continue
            if current.term > term:
                return False
            if current.term == term:
                return True  # claimed again: the holder of the term changes nothing
            if self.cp.txn([Compare.value(self.key) < _encoded(term)], put).succeeded:
                return True

    def current(self) -> Term | None:
        kv = self.cp.get(self.key)
        if kv is None:
            return None
        digits, _, rest = kv.value.partition(b" ")
        record = json.loads(rest)
        return Term(int(digits), str(record["holder"]), str(record["since"]))
