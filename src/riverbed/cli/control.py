"""``riverbed control …``: the control plane from a shell, shaped like ``etcdctl``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from typing import Any

from rich.console import Console

from riverbed.cli._common import Subcommands, UsageError, shared_options
from riverbed.config import load_config
from riverbed.control import (
    ControlPlane,
    Election,
    Event,
    KeyValue,
    Lock,
    Registry,
    Session,
    connect,
)
from riverbed.control.errors import KeyNotFoundError

out = Console(highlight=False, soft_wrap=True)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "control",
        help="the control plane: keys, leases, watches, locks, elections, members",
        description="Talk to the control plane (like etcdctl). The backend comes from --url, "
        "else RIVERBED_CONTROL, else riverbed.toml, else sqlite under RIVERBED_HOME.",
    )
    common = shared_options(
        p,
        ("--url", {"help": "sqlite:///path.db | etcd://host:port[,host:port] | memory://"}),
        ("--json", {"action": "store_true", "help": "machine-readable output (JSON lines)"}),
    )
    cmds = Subcommands(
        p.add_subparsers(dest="control_command", metavar="COMMAND", required=True), common
    )

    c = cmds.add_parser("put", help="set KEY to VALUE")
    c.add_argument("key")
    c.add_argument("value")
    c.add_argument("--lease", help="attach to this lease (hex id, as printed by lease grant)")
    c.set_defaults(run=_put)

    c = cmds.add_parser("get", help="print KEY (or every key under it with --prefix)")
    c.add_argument("key")
    c.add_argument("--prefix", action="store_true")
    c.add_argument("--keys-only", action="store_true")
    c.set_defaults(run=_get)

    c = cmds.add_parser("del", help="delete KEY (or every key under it with --prefix)")
    c.add_argument("key")
    c.add_argument("--prefix", action="store_true")
    c.set_defaults(run=_del)

    c = cmds.add_parser("watch", help="print changes to KEY until interrupted")
    c.add_argument("key")
    c.add_argument("--prefix", action="store_true")
    c.add_argument("--rev", type=int, help="start at this revision (replays history)")
    c.add_argument("--count", type=int, help="exit after this many events")
    c.set_defaults(run=_watch)

    lease = cmds.add_parser("lease", help="grant, keep alive, revoke or inspect leases")
    lcmds = Subcommands(
        lease.add_subparsers(dest="lease_command", metavar="ACTION", required=True), common
    )
    c = lcmds.add_parser("grant", help="grant a lease of TTL seconds; prints its id")
    c.add_argument("ttl", type=int)
    c.set_defaults(run=_lease_grant)
    c = lcmds.add_parser("keepalive", help="keep a lease alive until interrupted")
    c.add_argument("id")
    c.add_argument("--once", action="store_true", help="refresh once and exit")
    c.set_defaults(run=_lease_keepalive)
    c = lcmds.add_parser("revoke", help="revoke a lease, deleting its keys")
    c.add_argument("id")
    c.set_defaults(run=_lease_revoke)
    c = lcmds.add_parser("timetolive", help="seconds left on a lease")
    c.add_argument("id")
    c.set_defaults(run=_lease_ttl)

    c = cmds.add_parser("lock", help="hold lock NAME (while COMMAND runs, or until killed)")
    c.add_argument("name")
    c.add_argument("cmd", nargs="*", help="command to run while holding the lock (after --)")
    c.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    c.add_argument("--timeout", type=float, help="give up after this many seconds")
    c.set_defaults(run=_lock)

    c = cmds.add_parser("elect", help="campaign in election NAME with VALUE; lead until killed")
    c.add_argument("name")
    c.add_argument("value", nargs="?")
    c.add_argument("--listen", action="store_true", help="only print leaders as they change")
    c.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    c.set_defaults(run=_elect)

    c = cmds.add_parser("status", help="leaders and terms, locks, members and their leases")
    c.set_defaults(run=_status)

    c = cmds.add_parser("hosts", help="which host runs what (riverbed's processes), which are down")
    c.set_defaults(run=_hosts)

    c = cmds.add_parser(
        "spark-master",
        help="announce a Spark standalone master while it answers (RIVERBED_SPARK_MASTER="
        "riverbed finds it); run beside each master until killed",
    )
    c.add_argument("master", help="the master's URL, e.g. spark://10.0.0.1:7077")
    c.add_argument("--ui", help="its web UI (default: http://<its host>:8080)")
    c.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    c.set_defaults(run=_spark_master)

    c = cmds.add_parser("members", help="list (or --watch) live members of a registry group")
    c.add_argument("--group", default="workers")
    c.add_argument("--register", metavar="ID", help="join as ID and stay until killed")
    c.add_argument("--meta", default="{}", help="JSON metadata for --register")
    c.add_argument("--watch", action="store_true", help="print joins and departures")
    c.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    c.set_defaults(run=_members)

    p.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    url = args.url or load_config().control_url
    cp = connect(url)
    try:
        code: int = args.run(cp, args)
        return code
    finally:
        cp.close()


def _lease_id(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        raise UsageError(f"lease id {text!r} is not hex (as printed by `lease grant`)") from None


def _kv_json(kv: KeyValue) -> dict[str, Any]:
    return {
        "key": kv.key.decode("utf-8", "replace"),
        "value": kv.value.decode("utf-8", "replace"),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": f"{kv.lease:x}",
    }


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data), flush=True)
    else:
        out.print(text, markup=False)
        sys.stdout.flush()


def _put(cp: ControlPlane, args: argparse.Namespace) -> int:
    rev = cp.put(args.key, args.value, lease=_lease_id(args.lease) if args.lease else 0)
    _emit(args, {"revision": rev}, "OK")
    return 0


def _get(cp: ControlPlane, args: argparse.Namespace) -> int:
    if args.prefix:
        kvs = cp.get_prefix(args.key)
    else:
        one = cp.get(args.key)
        if one is None:
            raise KeyNotFoundError(f"key '{args.key}' not found")
        kvs = [one]
    for kv in kvs:
        text = kv.key.decode("utf-8", "replace")
        if not args.keys_only:
            text += "\n" + kv.value.decode("utf-8", "replace")
        _emit(args, _kv_json(kv), text)
    return 0


def _del(cp: ControlPlane, args: argparse.Namespace) -> int:
    n = cp.delete(args.key, prefix=args.prefix)
    _emit(args, {"deleted": n}, str(n))
    return 0


def _event_json(e: Event) -> dict[str, Any]:
    data = {"type": e.type.value, "revision": e.revision, **_kv_json(e.kv)}
    if e.prev_kv is not None:
        data["prev_value"] = e.prev_kv.value.decode("utf-8", "replace")
    return data


def _watch(cp: ControlPlane, args: argparse.Namespace) -> int:
    seen = 0
    with cp.watch(args.key, prefix=args.prefix, start_revision=args.rev) as watch:
        for event in watch:
            key = event.kv.key.decode("utf-8", "replace")
            value = event.kv.value.decode("utf-8", "replace")
            _emit(args, _event_json(event), f"{event.type.value}\n{key}\n{value}".rstrip("\n"))
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    return 0


def _lease_grant(cp: ControlPlane, args: argparse.Namespace) -> int:
    grant = cp.grant(args.ttl)
    _emit(
        args,
        {"id": f"{grant.id:x}", "ttl": grant.ttl},
        f"lease {grant.id:x} granted with TTL({grant.ttl}s)",
    )
    return 0


def _lease_keepalive(cp: ControlPlane, args: argparse.Namespace) -> int:
    lease = _lease_id(args.id)
    stop = threading.Event()  # never set: waits between refreshes, Ctrl-C ends them
    while True:
        ttl = cp.keepalive(lease)
        _emit(args, {"id": args.id, "ttl": ttl}, f"lease {args.id} keepalived with TTL({ttl})")
        if args.once or stop.wait(max(ttl / 3, 0.5)):
            return 0


def _lease_revoke(cp: ControlPlane, args: argparse.Namespace) -> int:
    cp.revoke(_lease_id(args.id))
    _emit(args, {"id": args.id, "revoked": True}, f"lease {args.id} revoked")
    return 0


def _lease_ttl(cp: ControlPlane, args: argparse.Namespace) -> int:
    ttl = cp.time_to_live(_lease_id(args.id))
    if ttl is None:
        _emit(args, {"id": args.id, "ttl": -1}, f"lease {args.id} already expired")
        return 1
    _emit(args, {"id": args.id, "ttl": ttl}, f"lease {args.id} remaining({ttl}s)")
    return 0


def _hold(session: Session) -> int:
    """Keep what the session holds until the process is stopped (Ctrl-C / SIGTERM unwind
    and release it) or the lease is lost, which is an error."""
    session.lost.wait()
    session.ensure_alive()
    return 1


def _lock(cp: ControlPlane, args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    with Session(cp, ttl=args.ttl) as session:
        lock = Lock(session, args.name)
        token = lock.acquire(timeout=args.timeout)
        try:
            key = f"riverbed/lock/{args.name}/{session.lease:x}"
            _emit(args, {"name": args.name, "key": key, "token": token}, key)
            if cmd:
                env = dict(os.environ, RIVERBED_LOCK_TOKEN=str(token))
                try:
                    return subprocess.run(cmd, env=env, check=False).returncode
                except OSError as exc:
                    raise UsageError(f"cannot run {cmd[0]!r} under the lock: {exc}") from exc
            return _hold(session)
        finally:
            lock.release()


def _elect(cp: ControlPlane, args: argparse.Namespace) -> int:
    if args.listen:
        election = Election(cp, args.name)
        for leader in election.observe():
            if leader is not None:
                _emit(args, _kv_json(leader), leader.value.decode("utf-8", "replace"))
        return 0
    if args.value is None:
        raise UsageError("elect needs a VALUE to campaign with (or --listen to observe)")
    with Session(cp, ttl=args.ttl) as session:
        election = Election(cp, args.name, session)
        term = election.campaign(args.value)
        try:
            data = {"name": args.name, "value": args.value, "term": term}
            _emit(args, data, args.value)
            return _hold(session)
        finally:
            election.resign()


def _status(cp: ControlPlane, args: argparse.Namespace) -> int:
    from riverbed.inspect import control_of

    info = control_of(cp, args.url or load_config().control_url)
    if args.json:
        print(json.dumps(info))
        return 0
    for e in info["elections"]:
        out.print(f"leader of {e['name']}: {e['leader']['value']} (term {e['term']}, "
                  f"{len(e['candidates'])} waiting)")  # fmt: skip
    for lock in info["locks"]:
        out.print(f"lock {lock['name']}: held by {lock['holder']['key']} "
                  f"({len(lock['waiting'])} waiting)")  # fmt: skip
    for r in info["registries"]:
        out.print(f"group {r['group']}: {len(r['members'])} member(s)")
    if not (info["elections"] or info["locks"] or info["registries"]):
        out.print("nothing held: no leaders, locks or members")
    return 0


def _hosts(cp: ControlPlane, args: argparse.Namespace) -> int:
    from riverbed.control.processes import hosts_of

    rows = hosts_of(cp)
    if args.json:
        print(json.dumps({"hosts": rows}))
        return 0
    if not rows:
        out.print("no hosts seen: no log server, stream driver, jobs worker or orchestrator "
                  "has run against this control plane")  # fmt: skip
    for row in rows:
        what = ", ".join(
            f"{p['role']}{' (' + p['state'] + ')' if p.get('state') else ''} pid {p['pid']}"
            for p in row["processes"]
        )
        out.print(f"{row['host']}: {row['state']}" + (f" — {what}" if what else ""))
    return 0


def _spark_master(cp: ControlPlane, args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from riverbed.errors import InvalidValueError
    from riverbed.spark.discovery import MasterPresence

    ui = args.ui or f"http://{urlsplit(args.master).hostname}:8080"
    try:
        presence = MasterPresence(cp, args.master, ui, ttl=args.ttl)
    except InvalidValueError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"announcing the Spark master {args.master} (its UI {ui}) while it answers")
    presence.run()
    return 0


def _members(cp: ControlPlane, args: argparse.Namespace) -> int:
    registry = Registry(cp, args.group)
    if args.register:
        try:
            meta = json.loads(args.meta)
        except ValueError:
            raise UsageError(
                f'--meta {args.meta!r} is not JSON, e.g. --meta \'{{"host": "a"}}\''
            ) from None
        with Session(cp, ttl=args.ttl) as session:
            member = registry.register(session, args.register, meta)
            _emit(
                args,
                {"registered": member.id, "revision": member.revision},
                f"registered {member.id}",
            )
            return _hold(session)
    members, rev = registry.snapshot()
    for m in members:
        _emit(
            args,
            {"id": m.id, "metadata": dict(m.metadata), "joined_revision": m.revision},
            f"{m.id}  {json.dumps(dict(m.metadata))}",
        )
    if args.watch:
        for change in registry.changes(start_revision=rev + 1):
            m = change.member
            _emit(
                args,
                {
                    "change": change.kind,
                    "id": m.id,
                    "metadata": dict(m.metadata),
                    "revision": change.revision,
                },
                f"{change.kind} {m.id}",
            )
    return 0
