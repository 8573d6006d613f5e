"""Real processes, killed with SIGKILL: leases, elections, CAS and locks across processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from riverbed.control import Election, EventType, connect
from riverbed.testing.signals import stop_outside_writes
from tests.control.conftest import backend_url

pytestmark = pytest.mark.slow
MULTI = ["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)]
TTL = 2
PROCS = Path(__file__).with_name("procs.py")


@pytest.fixture(params=MULTI)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


class Child:
    """A ``riverbed control …`` process whose JSON output lines are collected."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli.main", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: list[tuple[float, dict[str, object]]] = []
        self._got = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._got:
                self.lines.append((time.monotonic(), json.loads(line)))
                self._got.notify_all()

    def wait_line(self, timeout: float) -> dict[str, object]:
        with self._got:
            assert self._got.wait_for(lambda: self.lines, timeout), self.stderr()
            return self.lines[0][1]

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read() if self.proc.stderr else ""

    def kill(self) -> float:
        self.proc.kill()
        self.proc.wait()
        return time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def children(subprocess_env: dict[str, str]) -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


def spawn(children: list[Child], env: dict[str, str], url: str, *args: str) -> Child:
    child = Child(["control", "--url", url, "--json", *args], env)
    children.append(child)
    return child


def test_killed_lease_holder_vanishes_within_ttl(
    url: str, children: list[Child], subprocess_env: dict[str, str]
) -> None:
    holder = spawn(
        children,
        subprocess_env,
        url,
        "members",
        "--group",
        "g",
        "--register",
        "w1",
        "--ttl",
        str(TTL),
    )
    assert holder.wait_line(30)["registered"] == "w1"
    cp = connect(url)
    with cp.watch("riverbed/registry/g/", prefix=True) as watch:
        killed_at = holder.kill()
        event = watch.get(timeout=TTL + 5)
        seen_at = time.monotonic()
    assert event is not None and event.type is EventType.DELETE
    assert event.kv.key == b"riverbed/registry/g/w1"
    assert seen_at - killed_at <= TTL + 1
    assert cp.get_prefix("riverbed/registry/g/") == []
    cp.close()


def test_killed_leader_is_replaced_within_ttl_and_never_two_leaders(
    url: str, children: list[Child], subprocess_env: dict[str, str]
) -> None:
    candidates = [
        spawn(children, subprocess_env, url, "elect", "job", f"c{i}", "--ttl", str(TTL))
        for i in range(3)
    ]
    cp = connect(url)
    observed: list[tuple[float, bytes, int]] = []
    election = Election(cp, "job")
    stop = threading.Event()

    def observe() -> None:
        for leader in election.observe(timeout=0.2):
            if leader is not None:
                observed.append((time.monotonic(), leader.value, leader.create_revision))
            if stop.is_set():
                return

    # first leader: exactly one candidate says it was elected
    deadline = time.monotonic() + 30
    while not any(c.lines for c in candidates) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    elected = [c for c in candidates if c.lines]
    assert len(elected) == 1, "two candidates claimed leadership at once"
    first = elected[0]
    first_value = first.lines[0][1]["value"]
    watcher = threading.Thread(target=lambda: [observe() for _ in range(100) if not stop.is_set()])
    watcher.start()
    time.sleep(0.3)
    killed_at = first.kill()

    deadline = time.monotonic() + TTL + 5
    while time.monotonic() < deadline:
        successors = [c for c in candidates if c is not first and c.lines]
        if successors:
            break
        time.sleep(0.02)
    stop.set()
    watcher.join(timeout=5)
    time.sleep(0.3)
    successors = [c for c in candidates if c is not first and c.lines]
    assert len(successors) == 1, "zero or two successors claimed leadership"
    new_at, new_line = successors[0].lines[0]
    assert new_at - killed_at <= TTL + 1
    assert new_line["term"] > first.lines[0][1]["term"]  # type: ignore[operator]
    # the observer saw the old leader, then the new one, with growing terms
    values = [v.decode() for _, v, _ in observed]
    assert values[0] == first_value and values[-1] == new_line["value"]
    terms = [t for _, _, t in observed]
    assert terms == sorted(terms)
    cp.close()


def test_processes_incrementing_by_cas_reach_the_exact_total(
    url: str, subprocess_env: dict[str, str]
) -> None:
    n_procs, each = 4, 60
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROCS), "cas", url, "counter", str(each)], env=subprocess_env
        )
        for _ in range(n_procs)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    cp = connect(url)
    kv = cp.get("counter")
    assert kv is not None and int(kv.value) == n_procs * each
    assert kv.version == n_procs * each
    cp.close()


def test_lock_is_never_held_by_two_processes(
    url: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    journal = tmp_path / "journal"
    critical = tmp_path / "critical.py"
    critical.write_text(
        "import os, sys, time\n"
        "with open(sys.argv[1], 'a') as f:\n"
        "    token = os.environ['RIVERBED_LOCK_TOKEN']\n"
        "    f.write(f'enter {os.getpid()} {token}\\n'); f.flush()\n"
        "    time.sleep(0.05)\n"
        "    f.write(f'exit {os.getpid()}\\n')\n"
    )
    script = (
        f"for i in 1 2 3 4; do {sys.executable} -m riverbed.cli.main control --url '{url}' "
        f"lock shared --ttl 5 -- {sys.executable} {critical} {journal} || exit 1; done"
    )
    procs = [subprocess.Popen(["bash", "-c", script], env=subprocess_env) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=180) == 0
    lines = journal.read_text().splitlines()
    assert len(lines) == 3 * 4 * 2
    tokens = []
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        kind, pid, token = enter.split()
        assert kind == "enter" and leave == f"exit {pid}", "critical sections overlapped"
        tokens.append(int(token))
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_paused_leader_is_fenced_out_when_it_resumes(
    url: str, subprocess_env: dict[str, str]
) -> None:
    """SIGSTOP the leader past its TTL: a new leader takes over; on SIGCONT the old
    one's writes (guarded by its term) are rejected and it steps down."""
    import signal

    from riverbed.demo.control import ELECTION, FENCED_KEY

    workers = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "riverbed.demo",
                "worker",
                name,
                "--url",
                url,
                "--ttl",
                str(TTL),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=subprocess_env,
        )
        for name in ("p1", "p2")
    }
    cp = connect(url)
    try:
        election = Election(cp, ELECTION)
        first = next(kv for kv in election.observe(timeout=30) if kv is not None)
        old_name, old_term = first.text, first.create_revision
        paused = workers[old_name]
        # outside a write: paused inside one it would hold every SQLite writer back
        stop_outside_writes(paused.pid, url)
        new = next(
            kv for kv in election.observe(timeout=TTL + 5) if kv is not None and kv.key != first.key
        )
        assert new.create_revision > old_term
        # let the new leader write under its own term, then wake the old one
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            kv = cp.get(FENCED_KEY)
            if kv is not None and kv.text.startswith(new.text):
                break
            time.sleep(0.05)
        paused.send_signal(signal.SIGCONT)
        assert paused.wait(timeout=TTL + 5) == 1, "resumed old leader did not step down"
        time.sleep(0.5)
        kv = cp.get(FENCED_KEY)
        assert kv is not None and kv.text.startswith(f"{new.text} term={new.create_revision}")
        assert workers[new.text].poll() is None, "new leader stopped"
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                proc.wait(timeout=10)
        cp.close()
