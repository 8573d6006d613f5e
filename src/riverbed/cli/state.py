"""``riverbed state …``: look into versioned state without stopping the job."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from riverbed.cli._common import Subcommands, shared_options
from riverbed.config import load_config

if TYPE_CHECKING:  # the state's modules load pyarrow: only `riverbed state` pays
    from riverbed.state import StateProvider

out = Console(highlight=False, soft_wrap=True)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "state",
        help="list, describe and dump versioned state",
        description="Inspect state in the checkpoint location (--checkpoints, else "
        "RIVERBED_CHECKPOINTS, else riverbed.toml, else RIVERBED_HOME/checkpoints).",
    )
    common = shared_options(
        p,
        (
            "--checkpoints",
            {"help": "durable location: a path, file:///path or s3://bucket/prefix"},
        ),
        ("--json", {"action": "store_true", "help": "JSON lines"}),
    )
    p.add_argument("--engine", default="rocksdb", choices=["rocksdb", "memory"])
    cmds = Subcommands(
        p.add_subparsers(dest="state_command", metavar="COMMAND", required=True), common
    )
    c = cmds.add_parser("ls", help="namespaces, their partitions and latest versions")
    c.set_defaults(run=_ls)
    c = cmds.add_parser("describe", help="versions and snapshots of each partition")
    c.add_argument("namespace")
    c.set_defaults(run=_describe)
    c = cmds.add_parser("dump", help="print the key/value pairs of a version")
    c.add_argument("namespace")
    c.add_argument("--version", type=int, help="newest version at or before this (default: latest)")
    c.add_argument("--partition", type=int, action="append", help="only these partitions")
    c.add_argument("--limit", type=int, help="stop after this many pairs")
    c.set_defaults(run=_dump)
    c = cmds.add_parser(
        "verify", help="check every changelog and snapshot (checksums); exit 1 if damaged"
    )
    c.add_argument("namespace", nargs="?", help="default: every namespace")
    c.add_argument(
        "--quarantine",
        action="store_true",
        help="move damaged snapshots aside (loads then rebuild from older ones + changelogs)",
    )
    c.set_defaults(run=_verify)
    p.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    from riverbed.state import StateConfig, StateProvider
    from riverbed.stream.layout import state_url

    config = load_config()
    checkpoints = args.checkpoints or config.checkpoints_url
    provider = StateProvider(
        StateConfig(local_dir=config.state_dir, durable=state_url(checkpoints), engine=args.engine)
    )
    code: int = args.run(provider, args)
    return code


def _need(provider: StateProvider, namespace: str) -> None:
    from riverbed.state import StateError

    if namespace not in provider.namespaces():
        known = ", ".join(provider.namespaces()) or "none"
        raise StateError(
            f"no state namespace '{namespace}' in {provider.durable.url} (known: {known})"
        )


def _ls(provider: StateProvider, args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for ns in provider.namespaces():
        parts = provider.partitions(ns)
        latest = max((provider.index(ns, p).latest for p in parts), default=0)
        rows.append({"namespace": ns, "partitions": len(parts), "latest_version": latest})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    table = Table(title=f"state in {provider.durable.url}")
    for col in ("namespace", "partitions", "latest version"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["namespace"], str(row["partitions"]), str(row["latest_version"]))
    out.print(table)
    return 0


def _describe(provider: StateProvider, args: argparse.Namespace) -> int:
    _need(provider, args.namespace)
    table = Table(title=f"state namespace '{args.namespace}'")
    for col in ("partition", "versions", "latest", "snapshots", "purged through"):
        table.add_column(col)
    for p in provider.partitions(args.namespace):
        index = provider.index(args.namespace, p)
        versions = [v for v in index.versions if v >= index.purged_through]
        row: dict[str, Any] = {
            "partition": p,
            "versions": len(versions),
            "oldest": min(versions, default=0),
            "latest": index.latest,
            "snapshots": sorted(index.snapshots),
            "purged_through": index.purged_through,
        }
        if args.json:
            print(json.dumps(row))
            continue
        span = f"{row['oldest']}..{row['latest']} ({len(versions)})" if versions else "-"
        snaps = ", ".join(map(str, row["snapshots"][-5:])) or "-"
        table.add_row(str(p), span, str(index.latest), snaps, str(index.purged_through))
    if not args.json:
        out.print(table)
    return 0


def _verify(provider: StateProvider, args: argparse.Namespace) -> int:
    if args.namespace:
        _need(provider, args.namespace)
    namespaces = [args.namespace] if args.namespace else provider.namespaces()
    damaged = 0
    for ns in namespaces:
        parts = provider.partitions(ns)
        found = [(p, d) for p in parts for d in provider.verify(ns, p, args.quarantine)]
        for p, d in found:
            if args.json:
                print(json.dumps({"namespace": ns, "partition": p, **d.__dict__}))
                continue
            out.print(f"[red]damaged {d.kind}:[/red] {ns}/{p}: {d.problem}")
            if d.moved_to:
                out.print(f"  moved aside to {d.moved_to}; loads rebuild without it")
        changelog_damage = [d for _, d in found if d.kind == "changelog"]
        snapshot_damage = [d for _, d in found if d.kind == "snapshot" and not d.moved_to]
        damaged += len(changelog_damage) + len(snapshot_damage)
        if not args.json:
            state = "[green]ok[/green]" if not found else "[red]DAMAGED[/red]"
            out.print(f"{ns}: {state} ({len(parts)} partitions checked)")
            if snapshot_damage:
                out.print(f"  fix: riverbed state verify {ns} --quarantine")
            if changelog_damage:
                out.print(
                    "  a damaged changelog cannot be repaired from the store: restore it "
                    "from a backup or rebuild the state by replaying its input "
                    "(docs/stream.md, 'Failure model')"
                )
    return 1 if damaged else 0


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def _dump(provider: StateProvider, args: argparse.Namespace) -> int:
    from riverbed.state.query import read_state

    _need(provider, args.namespace)
    shown = 0
    for batch in read_state(provider, args.namespace, args.version, partitions=args.partition):
        for row in batch.to_pylist():
            if args.limit is not None and shown >= args.limit:
                return 0
            if args.json:
                print(
                    json.dumps(
                        {
                            "partition": row["partition"],
                            "version": row["version"],
                            "key": _text(row["key"]),
                            "value_b64": base64.b64encode(row["value"]).decode(),
                        }
                    )
                )
            else:
                out.print(
                    f"{row['partition']}@{row['version']}  {_text(row['key'])}  "
                    f"{_text(row['value'])[:120]}",
                    markup=False,
                )
            shown += 1
    sys.stdout.flush()
    return 0
