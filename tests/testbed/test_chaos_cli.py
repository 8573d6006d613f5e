"""``riverbed chaos`` from a shell: it acts on a test bed's hosts, logs each action with
its time, and refuses anything that is not the bed's."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from riverbed.testing.testbed import TestBed
from tests.cli import run_cli


@pytest.fixture
def bed(tmp_path):
    with TestBed.create(tmp_path / "bed", hosts=2) as made:
        made.spawn("h1", "sleeper", ["sleep", "600"])
        made.spawn("h2", "sleeper", ["sleep", "600"])
        yield made


def _chaos(bed: TestBed, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("chaos", "--bed", str(bed.root), *args)


def test_status_kill_restart_and_the_log(bed):
    st = json.loads(_chaos(bed, "status", "--json").stdout)
    assert [h["name"] for h in st["hosts"]] == ["h1", "h2"]
    assert all(s["alive"] for h in st["hosts"] for s in h["services"])

    done = _chaos(bed, "kill-host", "h2")
    assert done.returncode == 0, done.stderr
    assert "kill-host h2" in done.stdout
    assert not bed.alive(bed.service("h2", "sleeper"))
    assert bed.alive(bed.service("h1", "sleeper"))
    text = _chaos(bed, "status").stdout
    assert "h2 198.18." in text and "down" in text

    assert _chaos(bed, "restart-host", "h2").returncode == 0
    assert bed.alive(bed.service("h2", "sleeper"))

    lines = [json.loads(x) for x in _chaos(bed, "log", "--json").stdout.splitlines()]
    assert [(a["action"], a["host"]) for a in lines][-2:] == [
        ("kill-host", "h2"),
        ("restart-host", "h2"),
    ]
    assert lines[-1]["t"] >= lines[-2]["t"]


def test_a_timed_partition_heals_itself(bed):
    done = _chaos(bed, "partition", "h1", "--for", "1s")
    assert done.returncode == 0, done.stderr
    assert "partition h1" in done.stdout and "heal h1" in done.stdout
    acts = bed.actions()
    cut = next(a for a in acts if a["action"] == "partition")
    healed = next(a for a in acts if a["action"] == "heal")
    assert healed["t"] - cut["t"] >= 1.0
    link = subprocess.run(
        ["ip", "link", "show", bed.host("h1").link], capture_output=True, text=True, check=True
    ).stdout
    assert "state DOWN" not in link and ",UP" in link


def test_it_refuses_what_is_not_the_beds(bed, tmp_path):
    unknown = _chaos(bed, "kill-host", "h9")
    assert unknown.returncode == 2
    assert "no host 'h9'" in unknown.stderr and "h1, h2" in unknown.stderr
    assert all(bed.alive(s) for s in bed.services())
    elsewhere = run_cli("chaos", "--bed", str(tmp_path), "kill-host", "h1")
    assert elsewhere.returncode == 1
    assert "is not a test bed" in elsewhere.stderr and "Traceback" not in elsewhere.stderr
    # the default place is RIVERBED_HOME/testbed
    env = {**os.environ, "RIVERBED_HOME": str(tmp_path / "home")}
    nowhere = run_cli("chaos", "status", env=env)
    assert nowhere.returncode == 1 and str(tmp_path / "home" / "testbed") in nowhere.stderr
    bad = _chaos(bed, "partition", "h1", "--for", "0s")
    assert bad.returncode == 2 and "positive duration" in bad.stderr
    assert not [a for a in bed.actions() if a["action"] == "partition"]


def test_destroy_stops_the_gateway_servers_a_dead_demo_left(tmp_path):
    """A demo SIGKILLed mid-run leaves its gateway servers; `chaos destroy` stops them."""
    from riverbed.processes import is_alive
    from riverbed.testing.cluster import Cluster

    bed = TestBed.create(tmp_path / "bed", hosts=1)
    try:
        postgres = Cluster(bed).start_postgres()  # the demo process "dies" here
        pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
        assert is_alive(pid)
        done = _chaos(bed, "destroy")
        assert done.returncode == 0, done.stderr
        assert "gateway's postgres stopped" in done.stdout
        assert not is_alive(pid)  # gone (or a zombie init has not reaped yet)
        assert not (bed.root / "gateway.json").exists()
        assert not bed.owns_slot()
        # its namespace is gone — unless another bed (a test beside this one) has claimed
        # the slot since, whose namespace has the same name: that one is not this bed's
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert bed.plan.hosts[0].netns not in netns or bed.claim.exists()
    finally:
        bed.destroy()
        Cluster.stop_gateway(bed)
