"""``riverbed alerts check | watch``: what holds now, and forwarding it to a webhook."""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import Any

from rich.console import Console

from riverbed.cli._common import UsageError
from riverbed.config import load_config

# texts name work ids ("[1, 2]") and keys ("stream:flags:…"): neither markup nor emoji codes
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)

KINDS = (
    "chunk.failed",
    "job.retried_out",
    "stream.stopped",
    "stream.replaced",
    "stream.lagging",
    "host.down",
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="failed chunks, stopped or lagging streams, hosts down — checked, or sent to a "
        "webhook",
        description="Alerts read what the console reads; `watch` sends them to the webhook "
        "RIVERBED_ALERT_WEBHOOK names (generic JSON, or --format slack).",
    )
    cmds = p.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    for name, help_text in (
        ("check", "print the alerts that hold now (nothing is sent)"),
        ("watch", "check every --every seconds and send what changed to the webhook"),
    ):
        c = cmds.add_parser(name, help=help_text)
        c.add_argument("--lag", type=int, default=100_000, help="records behind = lagging")
        c.add_argument(
            "--skip",
            default="",
            help=f"alert kinds never reported, comma-separated ({', '.join(KINDS)})",
        )
        c.add_argument("--json", action="store_true", help="JSON lines")
        c.set_defaults(func=_check if name == "check" else _watch)
    c.add_argument("--format", choices=["json", "slack"], default="json", help="the body")
    c.add_argument("--every", default="10s", help="between checks (default 10s)")
    c.add_argument("--repeat", default="4h", help="resend a condition that still holds (0: never)")
    c.add_argument("--limit", type=int, default=20, help="notices per minute at most")
    c.add_argument("--name", default="default", help="this watcher's memory on the control plane")
    c.add_argument("--once", action="store_true", help="one round, then exit")


def _skip(text: str) -> frozenset[str]:
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    bad = sorted(kinds - set(KINDS))
    if bad:
        raise UsageError(
            f"--skip: unknown alert kind(s) {', '.join(bad)}; kinds: {', '.join(KINDS)}"
        )
    return kinds


def _check(args: argparse.Namespace) -> int:
    from riverbed.alerts import Thresholds
    from riverbed.alerts.checks import current
    from riverbed.inspect import Sources

    skip = _skip(args.skip)
    src = Sources(load_config())
    try:
        alerts = [a for a in current(src, Thresholds(lag=args.lag)) if a.kind not in skip]
    finally:
        src.close()
    for a in alerts:
        if args.json:
            out.print(json.dumps(a.__dict__), soft_wrap=True)
        else:
            out.print(f"{a.severity:7}  {a.kind:16}  {a.text}")
    if not alerts and not args.json:
        out.print("no alerts")
    return 0


def _watch(args: argparse.Namespace) -> int:
    from riverbed.alerts import Thresholds, Watcher, Webhook
    from riverbed.durations import duration_seconds
    from riverbed.inspect import Sources

    url = os.environ.get("RIVERBED_ALERT_WEBHOOK", "")
    if not url:
        raise UsageError(
            "set RIVERBED_ALERT_WEBHOOK to the webhook's URL (it is a secret: the "
            "environment, never the command line)"
        )
    try:
        every, repeat = duration_seconds(args.every), duration_seconds(args.repeat)
    except ValueError as exc:
        raise UsageError(f"--every/--repeat: {exc}") from None
    if args.limit < 1:
        raise UsageError("--limit must be at least 1 notice per minute")
    hook = Webhook(url, args.format)
    src = Sources(load_config())
    watcher = Watcher(
        src,
        hook,
        name=args.name,
        thresholds=Thresholds(lag=args.lag),
        skip=_skip(args.skip),
        repeat=repeat,
        limit=args.limit,
        per=60.0,
    )
    stop = threading.Event()
    if not args.json:
        out.print(f"alerts {args.name} → {hook.shown} ({args.format}), every {every:g}s")
    try:
        while not stop.is_set():
            for notice in watcher.round():
                a = notice.alert
                if args.json:
                    out.print(json.dumps(notice.to_dict()), soft_wrap=True)
                else:
                    what = a.text if a else f"held back by the limit: {dict(notice.held)}"
                    out.print(f"sent {notice.status:8} {what}")
            if args.once:
                break
            stop.wait(every)
    except KeyboardInterrupt:
        stop.set()
    finally:
        src.close()
    return 0
