"""``RIVERBED_SPARK_MASTER=riverbed``: the Spark masters the control plane knows.

Beside each Spark standalone master runs ``riverbed control spark-master
spark://host:7077`` (:class:`MasterPresence`): while the master's web UI answers, it
registers the master in the control plane's ``processes`` group (role
``spark-master``, ``{url, state}``: the master's status, ``ALIVE`` for the leader,
``STANDBY``…, as the hosts view shows a driver's) on a lease of its own, so the entry
goes with the master's host; a master that stops answering is withdrawn once it has
been silent for the entry's TTL (one slow answer is a busy master), until it answers
again. A driver given the master ``riverbed`` asks the control plane for the live
masters and connects to all of them (``spark://a:7077,b:7077``, the leader first):
with ZooKeeper recovery it follows whichever leads — a moved or replaced master is
found without editing configuration.

:func:`master_url` and :func:`silent_too_long` are the pure choices (Hypothesis-tested).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from riverbed.control import ControlPlane, Session, connect
from riverbed.control.errors import ControlError
from riverbed.control.processes import announce, processes
from riverbed.errors import InvalidValueError

__all__ = [
    "DISCOVERED",
    "ROLE",
    "MasterPresence",
    "master_page",
    "master_url",
    "resolve",
    "silent_too_long",
]

log = logging.getLogger(__name__)

ROLE = "spark-master"
DISCOVERED = ("riverbed", "riverbed://")  # the masters' names that mean "ask"


def _address(url: str) -> str | None:
    """``host:port`` of one ``spark://host:port`` (None if it is not one)."""
    parts = urlsplit(url)
    if parts.scheme != "spark" or not parts.hostname or "," in parts.netloc:
        return None
    return f"{parts.hostname}:{parts.port or 7077}"


def master_url(announced: Iterable[Mapping[str, Any]]) -> str | None:
    """``spark://`` of every announced master (role ``spark-master``): the leading ones
    (state ``ALIVE``) first, then the others, each address once, in name order within
    each; None when none is announced."""
    leading: set[str] = set()
    others: set[str] = set()
    for entry in announced:
        if entry.get("role") != ROLE:
            continue
        address = _address(str(entry.get("url", "")))
        if address is None:
            continue
        (leading if entry.get("state") == "ALIVE" else others).add(address)
    ordered = sorted(leading) + sorted(others - leading)
    return "spark://" + ",".join(ordered) if ordered else None


def resolve(master: str, control_url: str) -> str:
    """``master`` itself, unless it is ``riverbed``: then the masters the control plane
    at ``control_url`` knows now (:func:`master_url`)."""
    if master not in DISCOVERED:
        return master
    try:
        cp = connect(control_url)
        try:
            found = master_url(processes(cp))
        finally:
            cp.close()
    except ControlError as exc:
        raise InvalidValueError(
            f"Spark master {master!r}: the control plane ({control_url}) cannot be asked "
            f"for the masters: {exc}"
        ) from None
    if found is None:
        raise InvalidValueError(
            f"Spark master {master!r}: the control plane ({control_url}) knows no Spark "
            "master; run `riverbed control spark-master spark://HOST:7077` beside each "
            "master, or give the master's spark://host:port"
        )
    return found


def master_page(ui: str) -> dict[str, Any] | None:
    """A standalone master's JSON page at its web UI ``ui`` (``status``: ``ALIVE``,
    ``STANDBY``, ``RECOVERING`` …; ``workers``, ``activeapps``), None when it does not
    answer."""
    import httpx

    try:
        page = httpx.get(f"{ui.rstrip('/')}/json/", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    return page if isinstance(page, dict) else None


def _status(ui: str) -> str | None:
    """The master's status, None when it does not answer (:func:`master_page`)."""
    status = (master_page(ui) or {}).get("status")
    return str(status) if status else None


def silent_too_long(silent_since: float | None, now: float, grace: float) -> bool:
    """Whether a master not answering since ``silent_since`` (None: it answered last)
    is to be withdrawn at ``now``: once it has been silent ``grace`` seconds. One look
    that timed out is a busy master (a GC pause, a loaded host), not a gone one — and a
    live master withdrawn for it is left out of the URL a driver starting then gets,
    which registers with the standby alone and gives up: a master kept a few seconds
    too long costs nothing, a driver connects to every master listed."""
    return silent_since is not None and now - silent_since >= grace


class MasterPresence:
    """Announce the Spark master at ``url`` (its web UI at ``ui``) while it answers,
    with its status; withdraw it once it has not answered for ``ttl`` seconds (as its
    entry would go if this process died). Polls every ``every`` seconds."""

    def __init__(
        self, cp: ControlPlane, url: str, ui: str, ttl: int = 10, every: float = 1.0
    ) -> None:
        if _address(url) is None:
            raise InvalidValueError(
                f"{url!r} is not one Spark master's URL; e.g. spark://10.0.0.1:7077"
            )
        self.cp, self.url, self.ui, self.ttl, self.every = cp, url, ui, ttl, every
        self.status: str | None = None  # as announced now (None: not announced)
        self._session: Session | None = None
        self._silent_since: float | None = None  # when it stopped answering
        self._stop = threading.Event()

    def step(self) -> str | None:
        """One look at the master: announce, update or withdraw it; its status (None
        while it does not answer)."""
        status = _status(self.ui)
        now = time.monotonic()
        if status is None:
            if self._silent_since is None:
                self._silent_since = now
            if self._session is not None and silent_too_long(self._silent_since, now, self.ttl):
                self._session.close()  # it went away: so does its entry
                self._session, self.status = None, None
                log.warning(
                    "Spark master %s has not answered for %.0f s: withdrawn",
                    self.url,
                    now - self._silent_since,
                )
            return None
        self._silent_since = None
        if self._session is None or not self._session.alive:
            self._session, self.status = Session(self.cp, ttl=self.ttl), None
        if status != self.status and announce(
            self._session, ROLE, {"url": self.url, "state": status}
        ):  # (a control plane that did not take it: announced again next time)
            log.info("Spark master %s announced: %s", self.url, status)
            self.status = status
        return status

    def run(self) -> None:
        """Until :meth:`stop`; a control plane out of reach is waited out."""
        while not self._stop.is_set():
            try:
                self.step()
            except ControlError as exc:
                log.warning("the control plane is out of reach (%s); trying again", exc)
                self._session, self.status = None, None
            self._stop.wait(self.every)
        if self._session is not None:
            self._session.close()

    def stop(self) -> None:
        self._stop.set()
