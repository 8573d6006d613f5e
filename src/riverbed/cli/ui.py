"""``riverbed ui``: the web console; ``riverbed status``: its overview as JSON or text."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console

from riverbed.config import load_config
from riverbed.errors import ConfigError

out = Console(highlight=False, soft_wrap=True)


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("ui", help="serve the web console (topics, groups, streams, state, jobs)")
    c.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    c.add_argument("--port", type=int, default=8077, help="port (default 8077; 0: any free)")
    c.add_argument(
        "--token",
        help="visitors must present this token (default: RIVERBED_UI_TOKEN); required to "
        "bind anything but loopback",
    )
    c.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the page cancel and rerun jobs (POST with a CSRF token); read-only otherwise",
    )
    c.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    c.set_defaults(func=_ui)

    s = sub.add_parser("status", help="what is wrong now: lag, failing jobs, drivers, disk")
    s.add_argument("--json", action="store_true", help="the console's overview as JSON")
    s.set_defaults(func=_status)


def _ui(args: argparse.Namespace) -> int:
    import uvicorn

    from riverbed.inspect import Sources
    from riverbed.net import is_loopback, port_problem
    from riverbed.ui.app import create_app
    from riverbed.ui.console import Console as UiConsole

    token = args.token or os.environ.get("RIVERBED_UI_TOKEN") or None
    if not is_loopback(args.host) and not token:
        raise ConfigError(
            f"refusing to serve the console on {args.host} without a token: anyone who reaches "
            "this machine could read every topic and job. Pass --token (or set "
            "RIVERBED_UI_TOKEN), or bind 127.0.0.1"
        )
    problem = port_problem(args.host, args.port)
    if problem:
        raise ConfigError(f"cannot serve the console on {args.host}:{args.port}: {problem}")
    config = load_config()
    console = UiConsole(Sources(config), interval=args.interval)
    app = create_app(console, token=token, allow_actions=args.allow_actions)
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else host  # noqa: S104
    # a token from the environment is not echoed into logs; one typed on the line is
    shown_token = args.token or ("$RIVERBED_UI_TOKEN" if token else None)
    link = f"http://{shown}:{args.port}/" + (f"?token={shown_token}" if shown_token else "")
    mode = "actions allowed" if args.allow_actions else "read-only"
    guard = "token required" if token else "loopback only"
    out.print(f"riverbed ui at {link} ({mode}, {guard}) — home {config.home.resolve()}")
    sys.stdout.flush()
    server.run()  # SIGINT / SIGTERM: uvicorn shuts down gracefully
    return 0


def _status(args: argparse.Namespace) -> int:
    from riverbed.inspect import Sources
    from riverbed.ui.console import Console as UiConsole

    sources = Sources(load_config())
    try:
        overview = UiConsole(sources).overview()
    finally:
        sources.close()
    if args.json:
        print(json.dumps(overview, default=str))
        return 0
    worst = overview["worst_lag"]
    out.print(
        "worst lag: "
        + (
            f"{worst['lag']:,} ({worst['kind']} {worst['name']}, {worst['drain']})"
            if worst
            else "—"
        )
    )
    out.print(f"failed chunks: {overview['failed_chunks']}")
    gap = overview["widest_watermark_gap"]
    out.print(
        "largest watermark gap: " + (f"{gap['seconds']:.0f} s ({gap['name']})" if gap else "—")
    )
    out.print("stopped drivers: " + (", ".join(overview["stopped_drivers"]) or "none"))
    disk = overview["disk"]
    out.print(
        f"disk: log {overview['log_bytes']:,} B, state {disk.get('state_durable') or 0:,} B "
        f"durable + {disk.get('state_local') or 0:,} B local"
    )
    for problem in overview["errors"]:
        out.print(f"[red]could not read[/red] {problem}")
    return 1 if overview["errors"] else 0
