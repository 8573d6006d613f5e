"""The election that makes one driver active per aggregation, and the standby's wait.

``riverbed stream run`` campaigns for ``streams/<name>`` in the control plane (SQLite
under ``RIVERBED_HOME`` by default, etcd in clusters) before any work. The winner
records its term in the checkpoint (:mod:`riverbed.stream.fencing`) and starts the
query; a second driver finds a leader, says so, and waits in line with its
SparkSession already started — a **hot standby** — until the active driver's lease
expires (it died, or was cut off), then records its own, higher term and resumes
from the checkpoint exactly where the committed batches end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from riverbed.control import Election, Session, connect
from riverbed.control.errors import ControlError
from riverbed.control.processes import announce, host_name
from riverbed.errors import RiverbedError
from riverbed.stream.fencing import (
    DriverFencedError,
    hold_term,
    record_term,
    recorded_driver,
    release_term,
)

_log = logging.getLogger(__name__)


class AlreadyRunningError(RiverbedError):
    """Another driver is active for this aggregation (and standing by was refused)."""


def _who(value: bytes) -> str:
    try:
        record = json.loads(value)
        return f"{record['driver']} since {record['since']}"
    except (ValueError, KeyError, TypeError):
        return "unknown driver"


class TermBehindError(RiverbedError):
    """The control plane's term is older than the checkpoint's: it is not the one this
    aggregation ran with, and its terms cannot fence the drivers of the old one."""


class DriverLease:
    """Leadership of one aggregation for this process."""

    def __init__(self, control_url: str, name: str, checkpoint: str | Path, ttl: int = 10) -> None:
        self.control_url = control_url
        self.name = name
        self.checkpoint = checkpoint
        self.ttl = ttl
        self.term: int | None = None
        self.previous: dict[str, Any] | None = None  # the driver this one took over from
        self.driver = f"{host_name()}:{os.getpid()}"
        self.cp = connect(control_url)
        self.session: Session | None = None
        self.election: Election | None = None
        self._asker = ThreadPoolExecutor(1, thread_name_prefix=f"riverbed-lead-{name}")
        self._asking: Future[bool] | None = None
        self._asked = 0.0
        self._lost_lead = False
        self._closed = threading.Event()

    def active(self) -> str | None:
        """The active driver ("host:pid since …"), if any."""
        leader = Election(self.cp, f"streams/{self.name}").leader()
        return _who(leader.value) if leader is not None else None

    def acquire(self, standby: bool = True, on_standby: Callable[[str], None] | None = None) -> int:
        """Become the active driver; returns the term. With another driver active:
        wait as its standby (``on_standby`` is told who leads), or, with
        ``standby=False``, raise :class:`AlreadyRunningError`."""
        current = self.active()
        if current is not None:
            if not standby:
                raise AlreadyRunningError(
                    f"aggregation '{self.name}' is already running: active driver {current}. "
                    "Stop it first, or run without --no-standby to wait as its hot standby"
                )
            if on_standby is not None:
                on_standby(f"standby for {self.name}; active driver {current}")
        self.session = Session(self.cp, ttl=self.ttl)
        announce(self.session, "stream-driver", {"aggregation": self.name, "state": "standby"})
        self.election = Election(self.cp, f"streams/{self.name}", self.session)
        since = datetime.now(UTC).isoformat(timespec="seconds")
        value = json.dumps({"driver": self.driver, "since": since})
        self.term = self.election.campaign(value)
        self.previous = recorded_driver(self.checkpoint)
        # the newest term recorded rules (terms are never overwritten), so a control
        # plane whose terms are behind would fence its own driver: say so instead
        behind = self.previous is not None and int(self.previous["term"]) > self.term
        if behind:
            assert self.previous is not None
            held = int(self.previous["term"])
            self.close()
            raise TermBehindError(
                f"the control plane ({self.control_url.split('@')[-1]}) elected this driver "
                f"of '{self.name}' with term {self.term}, but the checkpoint "
                f"{self.checkpoint} was last written by term {held}: this is not the "
                "control plane the aggregation ran with (a new SQLite file, a reset etcd?). "
                "Run every driver of one checkpoint against the same control plane "
                "(--control / RIVERBED_CONTROL); it must outlive the machines it elects"
            )
        record_term(self.checkpoint, self.term, self.driver, since)
        announce(
            self.session,
            "stream-driver",
            {"aggregation": self.name, "state": "active", "term": self.term},
        )
        hold_term(self.term, self.ensure_leading)
        return self.term

    @property
    def margin(self) -> float:
        """How much of its lease a driver keeps in hand: it writes nothing while less
        than this is certainly left (a quarter of the TTL: one missed refresh of three
        still leaves more, two do not)."""
        return self.ttl / 4

    def ensure_leading(self) -> None:
        """Return when this driver's own clock says its lease is certainly held for at
        least :attr:`margin` more — at once, or after a late refresh got through —
        and raise :class:`DriverFencedError` when none does while the lease may still
        be its own (no network: self-fencing)."""
        session = self.session
        if session is None:
            raise DriverFencedError(f"this driver of '{self.name}' holds no lease")
        if session.wait_remaining(self.margin, session.remaining()):
            return
        raise DriverFencedError(
            f"this driver of '{self.name}' (term {self.term}) could not refresh its lease "
            f"with the control plane within its {self.ttl}s TTL (cut off from it?); it "
            "stopped writing before a standby could take over"
        )

    def watch(self, on_lost: Callable[[], None]) -> None:
        """From a thread of its own: say when writes pause (the lease clock below
        :attr:`margin`: :meth:`ensure_leading` holds them) and resume, and when the
        lease may be gone (no refresh for a whole TTL, or the lead found lost) say so
        and call ``on_lost`` once — whatever the caller's own loop is waiting on (a
        bucket that cannot be reached either, say)."""

        def run() -> None:
            paused = False
            while self.session is not None and not self._closed.is_set():
                left = self.session.remaining()
                if left <= 0 or self._lost_lead:
                    _log.warning(
                        "this driver of %r stops: its lease may have expired (no refresh "
                        "for %ss); a standby takes over from the checkpoint",
                        self.name,
                        self.ttl,
                    )
                    on_lost()
                    return
                if (left < self.margin) != paused:
                    paused = not paused
                    if paused:
                        _log.warning(
                            "this driver of %r pauses writing: its lease could not be "
                            "refreshed for %.1fs of its %ss (cut off from the control plane?)",
                            self.name,
                            self.ttl - left,
                            self.ttl,
                        )
                    else:
                        _log.warning("this driver of %r writes again: lease refreshed", self.name)
                step = 0.05 if paused else max(left - self.margin, 0.01)
                self._closed.wait(min(step, 0.25))

        threading.Thread(target=run, name=f"riverbed-fence-{self.name}", daemon=True).start()

    def describe(self) -> str:
        """One line on this driver's term: whom it took over from, and why terms skip."""
        line = f"active driver for {self.name} (term {self.term})"
        if self.previous is None:
            return line
        return (
            f"{line}; took over from term {self.previous['term']} (driver "
            f"{self.previous['driver']}, active since {self.previous['since']}), whose "
            "lease ended. A term is the control plane's revision when the election was "
            "won: it only grows, and skips the numbers other writes took meanwhile"
        )

    def still_leading(self) -> bool:
        """Is our candidacy (and so our term) still the leader? Never blocks: False at
        once when the lease clock ran out (the lease may be gone) or when the control
        plane said another candidate leads; the control plane is asked in the
        background, at most every third of the TTL (a cut-off member can take seconds
        not to answer — longer than the clock leaves)."""
        if self.election is None or self.session is None or self._lost_lead:
            return False
        if self.session.remaining() <= 0:
            return False
        asking = self._asking
        if asking is not None and asking.done():
            self._asking = None
            with contextlib.suppress(ControlError):  # unreachable: the clock answers
                if not asking.result():
                    self._lost_lead = True
                    return False
        now = time.monotonic()
        if self._asking is None and now - self._asked >= self.ttl / 3:
            self._asked = now
            self._asking = self._asker.submit(self.election.is_leader)
        return True

    def close(self) -> None:
        self._closed.set()
        self._asker.shutdown(wait=False, cancel_futures=True)
        if self.term is not None:
            release_term(self.term)
        if self.election is not None:
            with contextlib.suppress(RiverbedError):  # the lease's expiry resigns for us
                self.election.resign()
        if self.session is not None:
            self.session.close()
        self.cp.close()
