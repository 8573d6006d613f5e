"""A test bed of hosts on one machine, and the chaos it can do to them.

``TestBed.create(root, hosts=3)`` makes a bridge and one network namespace per host
(``riverbed.testing.hostplan`` plans the names and addresses), each with a data directory
``root/hosts/<h>``; ``spawn(host, name, argv)`` starts a server *in* a host (``ip netns
exec``) in its own session and records it in ``root/bed.json`` — pid, its start time
(so a reused pid is never taken for it), the command, its kind. Everything is on disk,
so another process (``riverbed chaos``) can ``TestBed.open(root)`` and act on the same
bed; it acts only on what the bed recorded and refuses anything else.

Chaos (each action appended with a timestamp to ``root/actions.log``):

* ``kill_host(h)``: SIGKILL every process of the host — in netns mode every process in
  its namespace (``ip netns pids``: a Spark worker's executors and PySpark daemons
  too), and every recorded session — then delete its data directory.
* ``partition(h)`` / ``heal(h)``: take the host's link down / up. Packets are dropped,
  not refused: peers see timeouts, as across a real partition. In loopback mode there is
  no link: the host's processes are SIGSTOPped / SIGCONTed instead (the action log says
  ``stand-in``).
* ``slow(h, rate=…)``: a token-bucket qdisc on both ends of the host's link (``tc … tbf``).
  ``delay_ms`` needs the kernel's ``sch_netem``; where it is missing (as on this
  project's build machine) the error names it and the ``rate`` stand-in.
* ``restart_host(h)``: link up, an empty data directory, and the host's services started
  again from their recorded commands (a kind may register a hook that prepares its
  restart, e.g. an etcd member that lost its data rejoins as a new member).

``destroy()`` kills everything the bed started and deletes the namespaces, links and
bridge it made, by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from riverbed.processes import is_alive, kill_all, kill_session, session_members
from riverbed.testing.hostplan import (
    SLOTS,
    BedPlan,
    HostPlan,
    Mode,
    bridge_name,
    netns_prefix,
    plan,
)
from riverbed.testing.servers import ServerError

__all__ = ["Service", "TestBed", "TestBedError", "detect_mode"]

BED_FILE = "bed.json"
ACTIONS_FILE = "actions.log"
_MARK = "riverbed-testbed/1"
_CLAIMS = Path(
    os.environ.get("RIVERBED_TESTBED_CLAIMS", Path(tempfile.gettempdir()) / "riverbed-testbeds")
)


class TestBedError(ServerError):
    """The test bed could not do what it was asked, or was asked about something it
    did not make."""

    __test__ = False


@dataclass
class Service:
    """A server the bed started in one of its hosts."""

    name: str
    host: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "process"
    meta: dict[str, Any] = field(default_factory=dict)
    pid: int = 0
    started: int = 0  # the process's start time in clock ticks since boot (/proc stat)
    log: str = ""


def _start_ticks(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise TestBedError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def detect_mode() -> tuple[Mode, str]:
    """``netns`` where this process may make namespaces, else ``loopback``, and why.

    ``RIVERBED_TESTBED_MODE=loopback`` forces the fallback."""
    forced = os.environ.get("RIVERBED_TESTBED_MODE", "")
    if forced == "loopback":
        return "loopback", "RIVERBED_TESTBED_MODE=loopback"
    if os.geteuid() != 0:
        return "loopback", "network namespaces need root"
    if shutil.which("ip") is None:
        return "loopback", "`ip` (iproute2) is not installed"
    probe = f"riverbed-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return "loopback", f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return "netns", "network namespaces are permitted"


class TestBed:
    """Hosts on this machine (see the module docstring)."""

    __test__ = False

    # kind -> hook run before a service of that kind is started again by restart_host
    restart_hooks: dict[str, Callable[[TestBed, Service], Service]] = {}  # noqa: RUF012

    def __init__(self, root: Path, plan_: BedPlan) -> None:
        self.root = root
        self.plan = plan_
        self._children: list[subprocess.Popen[bytes]] = []

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, root: Path | str, hosts: int = 3, mode: Mode | None = None) -> TestBed:
        root = Path(root).resolve()
        with contextlib.suppress(OSError, ValueError):
            if not json.loads((root / BED_FILE).read_text()).get("destroyed"):
                raise TestBedError(
                    f"{root} already holds a test bed; destroy it first "
                    f"(riverbed chaos --bed {root} destroy)"
                )
        root.mkdir(parents=True, exist_ok=True)
        why = "asked for"
        if mode is None:
            mode, why = detect_mode()
        slot = _claim_slot(root)
        bed = cls(root, plan(slot, hosts, mode))
        bed._write(
            {
                "mark": _MARK,
                "slot": slot,
                "mode": mode,
                "hosts": hosts,
                "why": why,
                "services": [],
                "down": [],
                "cut": [],
                "slowed": [],
            }
        )
        try:
            bed._make_network()
        except BaseException:
            bed.destroy()
            raise
        for h in bed.plan.hosts:
            bed.host_dir(h.name).mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
        bed.log_action("create", "", mode=mode, why=why, hosts=[h.address for h in bed.plan.hosts])
        return bed

    @classmethod
    def open(cls, root: Path | str) -> TestBed:
        root = Path(root).resolve()
        try:
            data = json.loads((root / BED_FILE).read_text())
        except (OSError, ValueError):
            raise TestBedError(
                f"{root} is not a test bed (no readable {BED_FILE}); riverbed chaos acts "
                "only on a bed that `riverbed demo cluster` or the tests created"
            ) from None
        if data.get("mark") != _MARK:
            raise TestBedError(f"{root / BED_FILE} is not a riverbed test bed file")
        return cls(root, plan(int(data["slot"]), int(data["hosts"]), data["mode"]))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def destroy(self) -> None:
        """Kill every process the bed started and delete what it made, by name."""
        data = self._read()
        for h in self.plan.hosts:
            with contextlib.suppress(TestBedError):
                self._kill_processes(h.name)
        for child in self._children:
            with contextlib.suppress(OSError):
                child.wait(timeout=5)
        # the network and the slot only while the slot is still this bed's: once a bed
        # is destroyed another may claim the slot and make namespaces of the same names,
        # which a second destroy (a `chaos destroy`, then the owner's own) must not delete
        if self.owns_slot():
            if self.plan.mode == "netns":
                for h in self.plan.hosts:
                    _ip("link", "del", h.link, check=False)
                    _ip("netns", "del", h.netns, check=False)
                _ip("link", "del", self.plan.bridge, check=False)
            with contextlib.suppress(FileNotFoundError):
                self.claim.unlink()
        with contextlib.suppress(OSError):
            self.log_action("destroy", "")
        data["destroyed"] = True
        with contextlib.suppress(OSError):
            self._write(data)

    @property
    def claim(self) -> Path:
        """The claim file of this bed's slot: it names the root of the bed holding it."""
        return _claim_of(self.plan.slot)

    def owns_slot(self) -> bool:
        """Whether this bed still holds its slot (its claim names this bed's root): its
        namespaces' and links' names are its own only while it does."""
        try:
            return self.claim.read_text().strip() == str(self.root)
        except OSError:
            return False

    # ------------------------------------------------------------------ network
    def _make_network(self) -> None:
        if self.plan.mode == "loopback":
            return  # 127.0.0.0/8 is all loopback on Linux: nothing to make
        p = self.plan
        _ip("link", "add", p.bridge, "type", "bridge")
        _ip("addr", "add", f"{p.gateway}/{p.prefix}", "dev", p.bridge)
        _ip("link", "set", p.bridge, "up")
        for h in p.hosts:
            _ip("netns", "add", h.netns)
            _ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            _ip("link", "set", h.link, "master", p.bridge, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/{p.prefix}", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            _ip("-n", h.netns, "link", "set", "lo", "up")

    # ------------------------------------------------------------------ hosts, processes
    def host(self, name: str) -> HostPlan:
        return self.plan.host(name)

    def host_dir(self, name: str) -> Path:
        self.plan.host(name)
        return self.root / "hosts" / name

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside ``host``."""
        h = self.plan.host(host)
        return ["ip", "netns", "exec", h.netns, *argv] if self.plan.mode == "netns" else list(argv)

    def run(
        self,
        host: str,
        argv: Sequence[str],
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run a short command in ``host`` and return its output."""
        done = subprocess.run(
            self.command(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if done.returncode != 0:
            raise TestBedError(
                f"{argv[0]} on {host} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
            )
        return done.stdout

    def spawn(
        self,
        host: str,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        kind: str = "process",
        meta: Mapping[str, Any] | None = None,
    ) -> Service:
        """Start ``argv`` in ``host`` in a session of its own and record it."""
        if host in self._read()["down"]:
            raise TestBedError(f"host {host} is down; restart it first")
        svc = Service(name, host, list(argv), dict(env or {}), kind, dict(meta or {}))
        return self._start(svc)

    def _start(self, svc: Service) -> Service:
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        svc.log = str(logs / f"{svc.host}-{svc.name}.log")
        out = open(svc.log, "ab")  # noqa: SIM115 - handed to the child
        try:
            child = subprocess.Popen(
                self.command(svc.host, svc.argv),
                env={**os.environ, "RIVERBED_HOST": svc.host, **svc.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.host_dir(svc.host),
                start_new_session=True,
            )
        finally:
            out.close()
        self._children.append(child)
        svc.pid, svc.started = child.pid, _start_ticks(child.pid)
        with self._locked() as data:
            data["services"] = [
                s for s in data["services"] if (s["host"], s["name"]) != (svc.host, svc.name)
            ] + [asdict(svc)]
        return svc

    def respawn(self, host: str, name: str) -> Service:
        """Start a recorded service again, with its recorded command (it exited)."""
        svc = self.service(host, name)
        if self.alive(svc):
            raise TestBedError(f"{name} on {host} is still running (pid {svc.pid})")
        return self._start(svc)

    def retire(self, host: str, name: str) -> None:
        """Stop a service for good (SIGTERM, then SIGKILL after 30 s) and forget it: a
        later ``restart_host`` does not start it again."""
        svc = self.service(host, name)
        if self.alive(svc):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(svc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.alive(svc) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.alive(svc):
                kill_session(svc.pid)
        with self._locked() as data:
            data["services"] = [
                s for s in data["services"] if (s["host"], s["name"]) != (host, name)
            ]

    def services(self, host: str | None = None) -> list[Service]:
        found = [Service(**s) for s in self._read()["services"]]
        return [s for s in found if host is None or s.host == host]

    def service(self, host: str, name: str) -> Service:
        for s in self.services(host):
            if s.name == name:
                return s
        raise TestBedError(f"no service {name!r} on host {host}")

    def alive(self, svc: Service) -> bool:
        return svc.pid > 0 and is_alive(svc.pid) and _start_ticks(svc.pid) == svc.started

    def processes(self, host: str) -> list[int]:
        """Live processes of ``host``: its namespace's and its recorded sessions'."""
        h = self.plan.host(host)
        pids: set[int] = set()
        for svc in self.services(host):
            if self.alive(svc):
                pids.update(session_members(svc.pid))
        if self.plan.mode == "netns":
            out = _ip("netns", "pids", h.netns, check=False).stdout
            pids.update(int(p) for p in out.split() if p.isdigit())
        return sorted(p for p in pids if p != os.getpid() and is_alive(p))

    def _kill_processes(self, host: str) -> None:
        survivors = kill_all(lambda: self.processes(host), timeout=30)
        if survivors:
            raise TestBedError(f"processes {survivors} of host {host} survived SIGKILL")
        for child in self._children:
            child.poll()  # reap our own children, so they are not zombies

    def _signal_host(self, host: str, sig: signal.Signals) -> None:
        for pid in self.processes(host):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    # ------------------------------------------------------------------ chaos
    def kill_host(self, host: str) -> None:
        """SIGKILL every process of ``host`` and delete its data directory."""
        if self.plan.mode == "loopback":
            self._signal_host(host, signal.SIGCONT)  # a stopped process dies only when run
        self._kill_processes(host)
        shutil.rmtree(self.host_dir(host), ignore_errors=True)
        self._mark("down", host, True)
        self.log_action("kill-host", host)

    def partition(self, host: str) -> None:
        """Cut ``host`` off from every other host and the gateway."""
        h = self.plan.host(host)
        if self.plan.mode == "netns":
            _ip("link", "set", h.link, "down")
            how = "link down"
        else:
            self._signal_host(host, signal.SIGSTOP)
            how = "stand-in: processes SIGSTOPped (loopback mode has no link to cut)"
        self._mark("cut", host, True)
        self.log_action("partition", host, how=how)

    def heal(self, host: str) -> None:
        h = self.plan.host(host)
        if self.plan.mode == "netns":
            _ip("link", "set", h.link, "up")
        else:
            self._signal_host(host, signal.SIGCONT)
        self._mark("cut", host, False)
        self.log_action("heal", host)

    def slow(self, host: str, *, delay_ms: int | None = None, rate: str | None = None) -> None:
        """Slow ``host``'s link both ways: a fixed delay (netem) or a rate (tbf)."""
        h = self.plan.host(host)
        if self.plan.mode != "netns":
            raise TestBedError("slowing a host needs network namespaces (loopback mode)")
        if (delay_ms is None) == (rate is None):
            raise TestBedError("slow a host by a delay (--delay 200ms) or a rate (--rate 1mbit)")
        if delay_ms is not None:
            qdisc = ["netem", "delay", f"{delay_ms}ms"]
        else:
            qdisc = ["tbf", "rate", str(rate), "burst", "16kb", "latency", "2s"]
        for tc, dev in self._link_ends(h):
            done = subprocess.run(
                [*tc, "qdisc", "replace", "dev", dev, "root", *qdisc],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                if delay_ms is not None and "unknown" in done.stderr:
                    raise TestBedError(
                        "this kernel has no netem queueing discipline (sch_netem), so a "
                        "fixed delay cannot be added; slow the host by bandwidth instead: "
                        "--rate 1mbit"
                    )
                raise TestBedError(f"tc failed on {host}: {done.stderr.strip()}")
        self._mark("slowed", host, True)
        self.log_action("slow", host, delay_ms=delay_ms, rate=rate)

    def unslow(self, host: str) -> None:
        for tc, dev in self._link_ends(self.plan.host(host)):
            subprocess.run(
                [*tc, "qdisc", "del", "dev", dev, "root"], capture_output=True, check=False
            )
        self._mark("slowed", host, False)
        self.log_action("unslow", host)

    @staticmethod
    def _link_ends(h: HostPlan) -> list[tuple[list[str], str]]:
        """``tc`` (in the right namespace) and the device, for each end of ``h``'s link:
        the root namespace's side and the host's own ``eth0``."""
        return [(["tc"], h.link), (["tc", "-n", h.netns], "eth0")]

    def restart_host(self, host: str) -> list[Service]:
        """Bring ``host`` back: link up, an empty data directory, its services again."""
        h = self.plan.host(host)
        if self.plan.mode == "netns":
            _ip("link", "set", h.link, "up")
        self._kill_processes(host)
        self.host_dir(host).mkdir(parents=True, exist_ok=True)
        self._mark("down", host, False)
        self._mark("cut", host, False)
        started = []
        for svc in self.services(host):
            hook = self.restart_hooks.get(svc.kind)
            started.append(self._start(hook(self, svc) if hook else svc))
        self.log_action("restart-host", host, services=[s.name for s in started])
        return started

    # ------------------------------------------------------------------ records
    def status(self) -> dict[str, Any]:
        data = self._read()
        return {
            "root": str(self.root),
            "mode": self.plan.mode,
            "why": data.get("why", ""),
            "gateway": self.plan.gateway,
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "down": h.name in data["down"],
                    "partitioned": h.name in data["cut"],
                    "slowed": h.name in data["slowed"],
                    "services": [
                        {"name": s.name, "kind": s.kind, "pid": s.pid, "alive": self.alive(s)}
                        for s in self.services(h.name)
                    ],
                }
                for h in self.plan.hosts
            ],
        }

    def log_action(self, action: str, host: str, **detail: Any) -> None:
        line = {"t": time.time(), "action": action, "host": host, **detail}
        with open(self.root / ACTIONS_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")

    def actions(self) -> list[dict[str, Any]]:
        try:
            text = (self.root / ACTIONS_FILE).read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _read(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / BED_FILE).read_text())
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.root / f".{BED_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.root / BED_FILE)

    def _mark(self, state: str, host: str, on: bool) -> None:
        """Add ``host`` to (or take it off) the bed's list of hosts in ``state``
        (``down``, ``cut``, ``slowed``)."""
        with self._locked() as data:
            data[state] = sorted({*data[state], host} if on else set(data[state]) - {host})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.root / ".bed.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            yield data
            self._write(data)


def _claim_of(slot: int) -> Path:
    """The claim file of ``slot``: it names the root of the bed holding the slot."""
    return _CLAIMS / str(slot)


def _claim_slot(root: Path) -> int:
    """A slot no other live bed holds: a claim file created exclusively. A claim whose
    bed is gone (its root has no bed file, or was destroyed) is taken over. Either way
    the namespaces and links of the slot — riverbed's by their names — are deleted."""
    _CLAIMS.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        claim = _claim_of(slot)
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not _stale(claim):
                continue
            claim.unlink(missing_ok=True)
            try:
                fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
        with os.fdopen(fd, "w") as f:
            f.write(str(root))
        # whatever riverbed's names in this slot are still there is nobody's now: a bed
        # that crashed, a teardown killed halfway (its bridge gone, namespaces left:
        # the next bed's "File exists"), a claim directory wiped
        _sweep(slot)
        return slot
    raise TestBedError(f"all {SLOTS} test bed slots are taken ({_CLAIMS})")


def _stale(claim: Path) -> bool:
    try:
        owner = Path(claim.read_text().strip())
    except OSError:
        return False
    try:
        data = json.loads((owner / BED_FILE).read_text())
    except (OSError, ValueError):
        # being created (claim written before the bed file) looks the same for a moment
        return time.time() - claim.stat().st_mtime > 60
    return bool(data.get("destroyed")) or data.get("slot") != int(claim.name)


def _sweep(slot: int) -> None:
    if shutil.which("ip") is None:
        return
    names = _ip("netns", "list", check=False).stdout.split()
    for name in names:
        if name.startswith(netns_prefix(slot)):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", name, check=False)
    _ip("link", "del", bridge_name(slot), check=False)
