"""Sending notices to a webhook: generic JSON, or Slack's incoming-webhook format.

One POST per notice, in order, each retried (``attempts``, doubling the wait) on a
connection error or a 5xx/429 answer; a 4xx other than 429 is the receiver refusing
the message and is not retried. The URL is a secret (a Slack webhook's path *is* its
credential): errors and logs name only its scheme and host (:meth:`Webhook.shown`).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from riverbed.alerts.gate import Notice
from riverbed.errors import InvalidValueError, RiverbedError

log = logging.getLogger(__name__)

__all__ = ["FORMATS", "AlertValueError", "RefusedError", "SendError", "Webhook", "body"]

FORMATS = ("json", "slack")
_ICON = {"firing": "🔴", "repeat": "🔁", "resolved": "✅", "summary": "⏸"}


class AlertValueError(InvalidValueError):
    """A bad alerts setting (a webhook URL, a format)."""


class SendError(RiverbedError):
    """A notice could not be delivered after every attempt."""


class RefusedError(SendError):
    """The receiver answered the notice with a 4xx (other than 429): it will refuse it
    again, so it is not sent again."""


def body(notice: Notice, fmt: str) -> dict[str, Any]:
    """The JSON a webhook receives for ``notice`` (see the module doc)."""
    if fmt == "json":
        return {"source": "riverbed", **notice.to_dict()}
    alert = notice.alert
    if alert is None:
        held = ", ".join(f"{n} {kind}" for kind, n in sorted(notice.held.items()))
        return {"text": f"{_ICON['summary']} riverbed held back {held} (rate limit)"}
    word = {"firing": "", "repeat": "still: ", "resolved": "resolved: "}[notice.status]
    return {"text": f"{_ICON[notice.status]} *{alert.kind}* {word}{alert.text}"}


@dataclass(frozen=True)
class Webhook:
    """Where notices go. ``url``: http(s); ``fmt``: ``json`` or ``slack``."""

    url: str = field(repr=False)
    fmt: Literal["json", "slack"] = "json"
    timeout: float = 10.0
    attempts: int = 3
    backoff: float = 0.5

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AlertValueError(
                f"the alerts webhook {self.shown} is not an http(s) URL; set "
                "RIVERBED_ALERT_WEBHOOK to one (e.g. https://hooks.slack.com/services/…)"
            )
        if self.fmt not in FORMATS:
            raise AlertValueError(f"alerts format {self.fmt!r} is not one of {', '.join(FORMATS)}")

    @property
    def shown(self) -> str:
        """The URL as it may be printed: scheme and host only."""
        parts = urlsplit(self.url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme or '?'}://{host}{port}/…"

    def __repr__(self) -> str:
        return f"Webhook({self.shown}, fmt={self.fmt!r})"

    def send(self, notice: Notice) -> None:
        """POST ``notice``; raises :class:`SendError` (naming the host only) when every
        attempt failed."""
        data = json.dumps(body(notice, self.fmt)).encode()
        why, refused = "", False
        for attempt in range(self.attempts):
            request = urllib.request.Request(  # noqa: S310 (http/https only: __post_init__)
                self.url, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
                    answer.read()
                    return
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
                if exc.code < 500 and exc.code != 429:
                    refused = True  # the receiver refuses this message: again won't help
                    break
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                why = type(reason).__name__ if not isinstance(reason, str) else reason
            if attempt + 1 < self.attempts:
                time.sleep(self.backoff * 2**attempt)
        error = RefusedError if refused else SendError
        raise error(f"the alerts webhook {self.shown} did not take a notice: {why}")
