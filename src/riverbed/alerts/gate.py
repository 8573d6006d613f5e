"""Which alerts to send now: de-duplicated, repeated, resolved and rate-limited (pure).

A check (:mod:`riverbed.alerts.checks`) answers, each time it runs, with the alerts
that hold *now*. Two kinds:

* a **condition** (a stream without a driver, a lagging stream, a host down) holds
  for a while: it is sent once when it starts (``firing``), again every ``repeat``
  seconds while it holds (``repeat``; ``0``: never), and once when it stops
  (``resolved``);
* an **event** (a chunk failed, a driver was replaced) happened once: it is sent once,
  ever — the gate remembers the keys it sent (the newest :data:`EVENTS_KEPT`).

At most ``limit`` notices go out per ``per`` seconds (a token bucket). Notices over
the limit are never dropped silently: they are held back and, once the bucket refills,
a ``summary`` notice names how many were held and of which kinds (the conditions among
them still firing are sent again at their next repeat or resolution).

The gate's memory (:meth:`Gate.to_dict`) is stored by the watcher after each send, so
a restarted watcher neither repeats what it sent nor forgets a condition it reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["EVENTS_KEPT", "Alert", "Gate", "Notice"]

EVENTS_KEPT = 10_000  # event keys remembered (sent); older ones are forgotten
Severity = Literal["warning", "error"]
Status = Literal["firing", "repeat", "resolved", "summary"]


@dataclass(frozen=True)
class Alert:
    """Something that holds now. ``key`` identifies it across checks (``stream:clicks:
    stopped``); ``kind`` groups keys (``stream.stopped``); ``event``: it happened once
    (never resolved) rather than holds for a while."""

    key: str
    kind: str
    severity: Severity
    subject: str  # what it is about: a stream, a job's chunk, a host
    text: str  # one line for a person
    event: bool = False


@dataclass(frozen=True)
class Notice:
    """One message to send. ``alert`` is None for a ``summary`` (``held``: how many
    notices were held back, by kind)."""

    status: Status
    at: float
    alert: Alert | None = None
    held: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "at": self.at}
        if self.alert is not None:
            out.update(asdict(self.alert))
        if self.held:
            out["held"] = dict(self.held)
        return out


@dataclass
class Gate:
    """The de-duplication and rate-limit state (see the module doc)."""

    repeat: float = 4 * 3600.0
    limit: int = 20
    per: float = 60.0
    # condition key -> (its alert as last sent, when it was last sent)
    firing: dict[str, tuple[Alert, float]] = field(default_factory=dict)
    sent_events: dict[str, float] = field(default_factory=dict)  # key -> when (insertion order)
    tokens: float = -1.0  # -1: full (a new gate)
    refilled_at: float = 0.0
    held: dict[str, int] = field(default_factory=dict)  # kind -> notices held back

    def decide(self, now: float, holding: Iterable[Alert]) -> list[Notice]:
        """The notices to send at ``now`` given the alerts ``holding`` now; the gate
        assumes they are sent (store it after the send, see the module doc)."""
        self._refill(now)
        wanted: list[Notice] = []
        current: dict[str, Alert] = {}
        for alert in holding:
            if alert.event:
                if alert.key not in self.sent_events:
                    wanted.append(Notice("firing", now, alert))
            else:
                current.setdefault(alert.key, alert)
        for key, alert in current.items():
            if key not in self.firing:
                wanted.append(Notice("firing", now, alert))
            elif self.repeat > 0 and now - self.firing[key][1] >= self.repeat:
                wanted.append(Notice("repeat", now, alert))
        for key, (alert, _) in self.firing.items():
            if key not in current:
                wanted.append(Notice("resolved", now, alert))
        out: list[Notice] = []
        if self.held and self.tokens >= 1:
            self.tokens -= 1
            out.append(Notice("summary", now, held=dict(self.held)))
            self.held = {}
        for notice in wanted:
            kind = notice.alert.kind if notice.alert is not None else "summary"
            if self.tokens >= 1:
                self.tokens -= 1
                out.append(notice)
                self._sent(notice, now)
            else:  # held back and counted, then taken as sent: never held twice
                self.held[kind] = self.held.get(kind, 0) + 1
                self._sent(notice, now)
        return out

    def mark(self, notice: Notice, now: float) -> None:
        """Record ``notice`` as sent (its token spent) on a gate that did not decide it:
        the gate as it was before a round whose sending failed part-way."""
        self._refill(now)
        self.tokens = max(0.0, self.tokens - 1)
        if notice.alert is None:
            self.held = {}
        else:
            self._sent(notice, now)

    def _sent(self, notice: Notice, now: float) -> None:
        alert = notice.alert
        assert alert is not None
        if alert.event:
            self.sent_events[alert.key] = now
            while len(self.sent_events) > EVENTS_KEPT:
                del self.sent_events[next(iter(self.sent_events))]
        elif notice.status == "resolved":
            self.firing.pop(alert.key, None)
        else:
            self.firing[alert.key] = (alert, now)

    def _refill(self, now: float) -> None:
        if self.tokens < 0:
            self.tokens, self.refilled_at = float(self.limit), now
            return
        gained = (now - self.refilled_at) * self.limit / self.per
        self.tokens = min(float(self.limit), self.tokens + max(0.0, gained))
        self.refilled_at = max(self.refilled_at, now)

    def remember(self, holding: Iterable[Alert], now: float) -> int:
        """Mark the events ``holding`` as sent without sending them (a new watcher's
        first look: failures from before it are history, not news); returns how many."""
        n = 0
        for alert in holding:
            if alert.event and alert.key not in self.sent_events:
                self.sent_events[alert.key] = now
                n += 1
        return n

    def to_dict(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "limit": self.limit,
            "per": self.per,
            "firing": {k: [asdict(a), at] for k, (a, at) in self.firing.items()},
            "sent_events": self.sent_events,
            "tokens": self.tokens,
            "refilled_at": self.refilled_at,
            "held": self.held,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], **settings: Any) -> Gate:
        """A stored gate; ``settings`` (repeat, limit, per) as configured now win."""
        gate = cls(
            repeat=float(data.get("repeat", 4 * 3600.0)),
            limit=int(data.get("limit", 20)),
            per=float(data.get("per", 60.0)),
            firing={k: (Alert(**a), float(at)) for k, (a, at) in data.get("firing", {}).items()},
            sent_events={str(k): float(v) for k, v in data.get("sent_events", {}).items()},
            tokens=float(data.get("tokens", -1.0)),
            refilled_at=float(data.get("refilled_at", 0.0)),
            held={str(k): int(v) for k, v in data.get("held", {}).items()},
        )
        for name, value in settings.items():
            setattr(gate, name, value)
        return gate
