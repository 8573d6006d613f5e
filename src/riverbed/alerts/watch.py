"""The alerts watcher: every ``every`` seconds, check, decide, send, remember.

Run one watcher per name (``riverbed alerts watch``; two of one name would each send).
Its gate (:mod:`~riverbed.
alerts.gate`) is stored on the control plane under ``riverbed/alerts/<name>`` after
each round's sends, so a watcher that restarts — here or on another host — neither
repeats what was sent nor forgets a condition it reported. A notice whose send failed
is not remembered as sent: the next round tries it again (at least once) — unless the
receiver refused it (a 4xx other than 429: it would refuse it again), which is logged
and dropped.

A watcher that starts with no stored gate takes the failures already recorded as
history (it says how many in its log) and reports what happens from then on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from riverbed.alerts.checks import Thresholds, current
from riverbed.alerts.gate import Alert, Gate, Notice
from riverbed.alerts.webhook import RefusedError, SendError, Webhook
from riverbed.inspect.sources import Sources

log = logging.getLogger(__name__)

__all__ = ["GATE_PREFIX", "Watcher"]

GATE_PREFIX = "riverbed/alerts/"  # <name> -> the stored gate (JSON)


@dataclass
class Watcher:
    """Checks ``src`` and sends to ``webhook`` (see the module doc)."""

    src: Sources
    webhook: Webhook
    name: str = "default"
    thresholds: Thresholds = field(default_factory=Thresholds)
    skip: frozenset[str] = frozenset()  # alert kinds never sent
    repeat: float = 4 * 3600.0
    limit: int = 20
    per: float = 60.0
    clock: Callable[[], float] = time.time

    @property
    def key(self) -> bytes:
        return f"{GATE_PREFIX}{self.name}".encode()

    def _load(self) -> Gate | None:
        kv = self.src.control.get(self.key)
        if kv is None:
            return None
        return self._gate(json.loads(kv.value))

    def _gate(self, data: dict[str, object]) -> Gate:
        return Gate.from_dict(data, repeat=self.repeat, limit=self.limit, per=self.per)

    def _store(self, gate: Gate) -> None:
        self.src.control.put(self.key, json.dumps(gate.to_dict()).encode())

    def holding(self) -> list[Alert]:
        return [a for a in current(self.src, self.thresholds) if a.kind not in self.skip]

    def round(self) -> list[Notice]:
        """One round: check, decide, send in order, store; returns what was sent. A
        failed send stops the round there and keeps the gate as before it (the next
        round decides again)."""
        gate = self._load()
        holding = self.holding()
        now = self.clock()
        if gate is None:
            gate = Gate(repeat=self.repeat, limit=self.limit, per=self.per)
            old = gate.remember(holding, now)
            if old:
                log.info(
                    "alerts %s: %d event(s) from before this watcher: not sent", self.name, old
                )
        before = json.dumps(gate.to_dict())
        notices = gate.decide(now, holding)
        sent: list[Notice] = []
        try:
            for notice in notices:
                try:
                    self.webhook.send(notice)
                except RefusedError as exc:  # it would be refused forever: log it, go on
                    log.warning("alerts %s: %s; this notice is dropped", self.name, exc)
                sent.append(notice)
        except SendError as exc:
            log.warning("alerts %s: %s; trying again next round", self.name, exc)
            gate = self._gate(json.loads(before))  # as before the round, but for what went out
            for notice in sent:
                gate.mark(notice, now)
        self._store(gate)
        for notice in sent:
            alert = notice.alert
            log.info(
                "alerts %s: sent %s %s", self.name, notice.status, alert.key if alert else "summary"
            )
        return sent

    def run(self, every: float, stop: threading.Event) -> None:
        """Rounds every ``every`` seconds until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()
            self.round()
            stop.wait(max(0.0, every - (time.monotonic() - started)))
