"""``riverbed chaos …``: break hosts of a test bed (and only of a test bed).

Acts on the bed in ``--bed`` (else ``RIVERBED_TESTBED``, else ``RIVERBED_HOME/testbed``,
where ``riverbed demo cluster`` makes it); refuses a directory that is not one and a
host the bed does not have. Every action is appended with its time to the bed's
``actions.log`` (``riverbed chaos log``), so results can be read against it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from riverbed.cli._common import Subcommands, UsageError, shared_options
from riverbed.config import load_config

if TYPE_CHECKING:
    from riverbed.testing.testbed import TestBed

out = Console(highlight=False, soft_wrap=True)
BED_HELP = "the test bed's directory (default: RIVERBED_TESTBED, else RIVERBED_HOME/testbed)"


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).astimezone().strftime("%H:%M:%S.%f")[:-3]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "chaos",
        help="test bed only: kill, partition, slow or restart a host",
        description="Break hosts of a test bed that riverbed made (riverbed demo cluster, "
        "the tests). It touches nothing the bed did not start.",
    )
    common = shared_options(
        p,
        ("--bed", {"help": BED_HELP}),
        ("--json", {"action": "store_true", "help": "machine-readable output"}),
    )
    actions = p.add_subparsers(dest="chaos_command", metavar="ACTION", required=True)
    cmds = Subcommands(actions, common)
    c = cmds.add_parser("status", help="the bed's hosts, what runs on each, which are down")
    c.set_defaults(run=_status)
    c = cmds.add_parser("kill-host", help="SIGKILL every process of HOST, delete its disk")
    c.add_argument("host")
    c.set_defaults(run=_on_host("kill_host"))
    c = cmds.add_parser("partition", help="cut HOST's links (until `heal`, or --for)")
    c.add_argument("host")
    c.add_argument("--for", dest="seconds", help="heal after this long, e.g. 20s")
    c.set_defaults(run=_partition)
    c = cmds.add_parser("heal", help="give a partitioned HOST its links back")
    c.add_argument("host")
    c.set_defaults(run=_on_host("heal"))
    c = cmds.add_parser("slow", help="slow HOST's link: --delay 200ms (netem) or --rate 1mbit")
    c.add_argument("host")
    c.add_argument("--delay", help="added delay each way, e.g. 200ms (needs sch_netem)")
    c.add_argument("--rate", help="bandwidth each way, e.g. 1mbit")
    c.set_defaults(run=_slow)
    c = cmds.add_parser("unslow", help="take HOST's slowing off")
    c.add_argument("host")
    c.set_defaults(run=_on_host("unslow"))
    c = cmds.add_parser("restart-host", help="bring HOST back, empty disk, its servers again")
    c.add_argument("host")
    c.set_defaults(run=_on_host("restart_host"))
    c = cmds.add_parser("log", help="every action on the bed, with its time")
    c.set_defaults(run=_log)
    c = cmds.add_parser("destroy", help="stop everything the bed started and delete its hosts")
    c.set_defaults(run=_destroy)
    p.set_defaults(func=lambda args: args.run(args))


def bed_path(args: argparse.Namespace) -> Path:
    given = getattr(args, "bed", None) or os.environ.get("RIVERBED_TESTBED")
    return Path(given) if given else load_config().home / "testbed"


def _open(args: argparse.Namespace) -> TestBed:
    # the cluster module registers the restart hooks (an etcd member rejoining)
    from riverbed.testing.cluster import Cluster  # noqa: F401
    from riverbed.testing.testbed import TestBed

    bed = TestBed.open(bed_path(args))
    if getattr(args, "host", None) is not None:
        bed.host(args.host)  # an unknown host: the error lists the bed's hosts
    return bed


def _done(args: argparse.Namespace, bed: TestBed) -> int:
    last = bed.actions()[-1]
    if args.json:
        print(json.dumps(last))
    else:
        when = _clock(last["t"])
        extra = f" ({last['how']})" if "how" in last else ""
        out.print(f"{when} {last['action']} {last['host']}{extra}")
    return 0


def _on_host(action: str) -> Callable[[argparse.Namespace], int]:
    """A command that does ``bed.<action>(HOST)`` and prints what the bed logged."""

    def run(args: argparse.Namespace) -> int:
        bed = _open(args)
        getattr(bed, action)(args.host)
        return _done(args, bed)

    return run


def _status(args: argparse.Namespace) -> int:
    st = _open(args).status()
    if args.json:
        print(json.dumps(st))
        return 0
    out.print(f"test bed {st['root']} — {st['mode']} ({st['why']}); shared servers at "
              f"{st['gateway']}")  # fmt: skip
    for h in st["hosts"]:
        flags = [w for w in ("down", "partitioned", "slowed") if h[w]]
        out.print(f"  {h['name']} {h['address']} {' '.join(flags) or 'up'}")
        for s in h["services"]:
            out.print(
                f"      {s['name']:<14} pid {s['pid']:<8} {'alive' if s['alive'] else 'dead'}"
            )
    return 0


def _partition(args: argparse.Namespace) -> int:
    from riverbed.durations import duration_seconds

    bed = _open(args)
    seconds = duration_seconds(args.seconds) if args.seconds else None
    if seconds is not None and seconds <= 0:
        raise UsageError(f"--for must be a positive duration (e.g. 20s), not {args.seconds!r}")
    bed.partition(args.host)
    _done(args, bed)
    if seconds is None:
        return 0
    try:
        time.sleep(seconds)
    finally:  # Ctrl-C heals too: a partition never outlives the command that timed it
        bed.heal(args.host)
    return _done(args, bed)


def _slow(args: argparse.Namespace) -> int:
    from riverbed.durations import duration_ms

    bed = _open(args)
    bed.slow(args.host, delay_ms=duration_ms(args.delay) if args.delay else None, rate=args.rate)
    return _done(args, bed)


def _log(args: argparse.Namespace) -> int:
    for a in _open(args).actions():
        if args.json:
            print(json.dumps(a))
            continue
        when = _clock(a["t"])
        rest = {k: v for k, v in a.items() if k not in ("t", "action", "host")}
        out.print(f"{when} {a['action']:<13} {a['host']:<4} {json.dumps(rest) if rest else ''}")
    return 0


def _destroy(args: argparse.Namespace) -> int:
    from riverbed.testing.cluster import Cluster

    bed = _open(args)
    bed.destroy()
    gateway = Cluster.stop_gateway(bed)
    also = f"; its gateway's {' and '.join(gateway)} stopped" if gateway else ""
    out.print(f"test bed {bed.root} destroyed: its processes, namespaces and links are gone{also}")
    return 0
