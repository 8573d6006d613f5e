"""Alerts: warnings and errors forwarded to a webhook (generic JSON or Slack).

:mod:`~riverbed.alerts.checks` reads what holds now from the read model
(:mod:`riverbed.inspect`) — failed chunks, jobs retried out, streams without a driver or
lagging, replaced drivers, hosts down; :mod:`~riverbed.alerts.gate` (pure) decides what
to send — each alert once, repeats, resolutions, a rate limit that counts what it holds
back; :mod:`~riverbed.alerts.webhook` sends; :mod:`~riverbed.alerts.watch` runs the
rounds and keeps the gate on the control plane. ``riverbed alerts watch`` is the CLI.
"""

from riverbed.alerts.checks import Thresholds
from riverbed.alerts.gate import Alert, Gate, Notice
from riverbed.alerts.watch import Watcher
from riverbed.alerts.webhook import Webhook

__all__ = ["Alert", "Gate", "Notice", "Thresholds", "Watcher", "Webhook"]
