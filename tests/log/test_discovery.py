"""``riverbed://``: clients find the log servers through the control plane — and find
them again when the ones they used are gone and others serve the log elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import riverbed.log
from riverbed.log import LogError
from riverbed.log.discovery import ROLE, choose
from tests.cli import run_cli
from tests.jobs.cluster import until
from tests.log.servers import Server


def test_choose_takes_the_live_servers_of_one_log_and_names_what_is_ambiguous() -> None:
    a = {"role": ROLE, "url": "flight://h1:8815", "log": "s3://b/p"}
    b = {"role": ROLE, "url": "flight://h2:8815", "log": "s3://b/p"}
    other = {"role": ROLE, "url": "flight://h3:9000", "log": "file:///data/log"}
    worker = {"role": "jobs-worker", "url": "x"}
    assert choose([b, a, worker], None) == ("flight", ["h1:8815", "h2:8815"])
    assert choose([a, b, other], "file:///data/log") == ("flight", ["h3:9000"])
    with pytest.raises(LogError, match=r"several logs \(file:///data/log, s3://b/p\)"):
        choose([a, other], None)
    with pytest.raises(LogError, match="no log server of s3://x is registered"):
        choose([a], "s3://x")
    with pytest.raises(LogError, match="no log server is registered"):
        choose([worker], None)
    tls = {**b, "url": "flight+tls://h2:8815"}
    with pytest.raises(LogError, match="mix flight and flight\\+tls"):
        choose([a, tls], None)


def _registered(env: dict[str, str]) -> list[str]:
    from riverbed.control import connect
    from riverbed.control.processes import processes

    cp = connect(env["RIVERBED_CONTROL"])
    try:
        return sorted(str(p["url"]) for p in processes(cp) if p.get("role") == ROLE)
    finally:
        cp.close()


@pytest.mark.s3
def test_clients_find_servers_through_the_control_plane_and_follow_them_when_replaced(
    tmp_path: Path, s3_url: str, subprocess_env: dict[str, str]
) -> None:
    env = {
        **subprocess_env,
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
        "RIVERBED_HOME": str(tmp_path / "client"),
        "RIVERBED_LOG": "riverbed://",
    }
    store = f"{s3_url}/discovery"
    first = [Server(tmp_path / f"s{n}", store, env) for n in range(2)]
    for server in first:
        server.start()
    servers = lambda: _registered(env)  # noqa: E731
    until(lambda: len(servers()) == 2, 30, "both servers registered")
    assert servers() == sorted(f"flight://127.0.0.1:{s.port}" for s in first)

    # the CLI as a user runs it, with no server's address anywhere
    assert run_cli("topic", "create", "ev", "--partitions", "2", env=env).returncode == 0
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(20))
    produced = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "produce", "ev"],
        env=env, input=lines, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr

    # a long-lived client opened now, through riverbed://
    log = riverbed.log.open("riverbed://?reconnect=60", control=env["RIVERBED_CONTROL"])
    try:
        assert sum(p.end for p in log.offsets("ev")) == 20
        # the servers it knows are all replaced: two new ones elsewhere, the old killed
        second = [Server(tmp_path / f"t{n}", store, env) for n in range(2)]
        for server in second:
            server.start()
        for server in first:
            server.kill()
        until(lambda: len(servers()) == 2, 30, "the old servers' leases gone")
        assert servers() == sorted(f"flight://127.0.0.1:{s.port}" for s in second)
        log.producer("ev").send_batch([{"i": i} for i in range(20, 30)])
        assert sum(p.end for p in log.offsets("ev")) == 30
        ports = {f"127.0.0.1:{s.port}" for s in second}
        assert set(log.storage.url.removeprefix("flight://").split(",")) == ports
        read = sorted(r.value["i"] for p in range(2) for r in log.read("ev", p, 0, 100))
        assert read == list(range(30))  # nothing lost, nothing twice
    finally:
        log.close()
        for server in second:
            server.kill()
    until(lambda: servers() == [], 30, "every lease gone")
    gone = run_cli("topic", "list", env=env)
    assert gone.returncode != 0 and "no log server is registered" in gone.stderr
    assert "Traceback" not in gone.stderr
