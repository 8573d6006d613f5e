"""``riverbed demo``: a tour of the control plane with real processes.

1. start N worker processes; each opens a session (a lease kept alive in the
   background), registers in the ``demo`` group and campaigns to lead;
2. watch the registry and the election from this process;
3. SIGKILL the leader — no goodbye, its lease simply stops being refreshed;
4. measure how long until a new leader takes over (≈ the lease TTL), check that
   its term (fencing token) is higher and that the dead worker left the registry;
5. show fencing: the leader's writes are guarded by its term, so a write carrying
   the old term is rejected;
6. stop the rest with SIGTERM; they resign and revoke their leases on the way out.

Runs on the control plane from the configuration: SQLite under ``RIVERBED_HOME``
unless ``RIVERBED_CONTROL`` points elsewhere (an etcd URL works the same).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from riverbed.config import Config
from riverbed.control import Compare, Election, KeyValue, Put, Registry, Session, connect

GROUP = "demo"
ELECTION = "demo-leader"
FENCED_KEY = "demo/leader-output"

console = Console(highlight=False)


def worker_main(argv: list[str]) -> int:
    """One worker process: register, campaign, and while leading write fenced output."""
    parser = argparse.ArgumentParser(prog="riverbed.demo worker")
    parser.add_argument("name")
    parser.add_argument("--url", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cp = connect(args.url)
    try:
        with Session(cp, ttl=args.ttl) as session:
            Registry(cp, GROUP).register(session, args.name, {"pid": os.getpid()})
            election = Election(cp, ELECTION, session)
            term = election.campaign(args.name)
            key = election.prefix + f"{session.lease:x}".encode()
            print(f"{args.name} elected with term {term}", flush=True)
            beat = 0
            while not session.lost.wait(0.2):
                beat += 1
                # Fenced write: only applies while our candidacy key (our term) exists.
                ok = cp.txn(
                    [Compare.create(key) == term],
                    [Put.of(FENCED_KEY, f"{args.name} term={term} beat={beat}")],
                ).succeeded
                if not ok:
                    print(f"{args.name} lost leadership", flush=True)
                    return 1
            return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cp.close()


def run_demo(config: Config, workers: int = 3, ttl: int = 2) -> int:
    url = config.control_url
    config.home.mkdir(parents=True, exist_ok=True)
    cp = connect(url)
    registry = Registry(cp, GROUP)
    election = Election(cp, ELECTION)
    console.rule("[bold]riverbed control-plane tour")
    console.print(f"control plane: [cyan]{url}[/cyan]  session TTL: {ttl}s  workers: {workers}")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _, start_rev = registry.snapshot()
        for i in range(1, workers + 1):
            name = f"worker-{i}"
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "riverbed.demo",
                    "worker",
                    name,
                    "--url",
                    url,
                    "--ttl",
                    str(ttl),
                ],
                stdout=subprocess.DEVNULL,
            )
        joined = set()
        for change in registry.changes(start_revision=start_rev + 1, timeout=30):
            if change.kind == "joined":
                joined.add(change.member.id)
                console.print(
                    f"  [green]joined[/green] {change.member.id} "
                    f"(pid {change.member.metadata.get('pid')}, "
                    f"revision {change.revision})"
                )
            if joined >= set(procs):
                break
        _members_table(registry)

        leader = _wait_leader(election, None)
        term = leader.create_revision
        console.print(f"\nleader: [bold]{leader.text}[/bold] (term {term})")
        time.sleep(0.5)
        fenced = cp.get(FENCED_KEY)
        console.print(f"leader's fenced output: {fenced.text if fenced else '-'}")

        victim = procs.pop(leader.text)
        console.print(f"\n[red]SIGKILL[/red] {leader.text} (pid {victim.pid}) ...")
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        new = _wait_leader(election, leader.key)
        took = time.monotonic() - killed_at
        console.print(
            f"new leader: [bold]{new.text}[/bold] (term {new.create_revision}) "
            f"after {took:.2f}s (lease TTL {ttl}s)"
        )
        assert new.create_revision > term, "terms must grow"
        stale = cp.txn([Compare.create(leader.key) == term], [Put.of(FENCED_KEY, "stale")])
        console.print(
            f"a write fenced by the dead leader's term {term}: "
            f"{'[red]ACCEPTED[/red]' if stale.succeeded else '[green]rejected[/green]'}"
        )
        _members_table(registry)
        if stale.succeeded or any(m.id == leader.text for m in registry.members()):
            console.print("[red]unexpected state; see above[/red]")
            return 1
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=10)
    left = registry.members()
    console.print(f"\nstopped the workers; members left: {len(left)}")
    cp.close()
    console.rule("[bold green]done")
    console.print("Try it by hand: riverbed control elect my-job $HOSTNAME   (in two shells)")
    return 0 if not left else 1


def _wait_leader(election: Election, not_key: bytes | None) -> KeyValue:
    for leader in election.observe(timeout=30):
        if leader is not None and leader.key != not_key:
            return leader
    raise TimeoutError("no leader was elected within 30 s")


def _members_table(registry: Registry) -> None:
    table = Table(title=f"members of '{registry.group}'")
    table.add_column("id")
    table.add_column("pid")
    table.add_column("joined at revision", justify="right")
    for m in registry.members():
        table.add_row(m.id, str(m.metadata.get("pid")), str(m.revision))
    console.print(table)
