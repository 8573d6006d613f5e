"""A test bed's hosts and its chaos, on real namespaces (and the loopback fallback)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from riverbed.testing.testbed import TestBed, TestBedError

PY = sys.executable
SERVE = [PY, "-m", "http.server", "--bind"]


def _get(bed: TestBed, host: str, address: str, port: int, timeout: float = 2) -> bool:
    """Whether ``host`` can fetch a page from ``address:port`` right now."""
    code = (
        "import urllib.request,sys\n"
        f"try: urllib.request.urlopen('http://{address}:{port}/', timeout={timeout})\n"
        "except OSError: sys.exit(1)\n"
    )
    done = subprocess.run(bed.command(host, [PY, "-c", code]), capture_output=True, check=False)
    return done.returncode == 0


def _wait_get(bed: TestBed, host: str, address: str, port: int) -> None:
    deadline = time.monotonic() + 20
    while not _get(bed, host, address, port):
        assert time.monotonic() < deadline, f"{address}:{port} never answered {host}"
        time.sleep(0.1)


@pytest.fixture
def bed(tmp_path):
    with TestBed.create(tmp_path / "bed", hosts=3) as made:
        yield made


# The tests that look up a destroyed bed's names (`ip netns list`, `ip link show`) must
# be alone in their slot: once destroyed, a bed's slot is free, and on another worker
# the next bed may take it and make namespaces of the same names at once (it did: the
# two-core run of 9b806d4). They take the last slot, which no live bed of the suite ever
# reaches (beds take the lowest free one), through a private claim directory in which
# every other slot is held; one xdist group runs them one after another.
LAST_SLOT = pytest.mark.xdist_group("testbed-last-slot")


@pytest.fixture
def last_slot(tmp_path, monkeypatch):
    """A private claim directory with every slot but the last held by a live bed of its
    own; the last slot's number, which the next bed created here takes."""
    from riverbed.testing import testbed
    from riverbed.testing.hostplan import SLOTS

    claims = tmp_path / "claims"
    monkeypatch.setattr(testbed, "_CLAIMS", claims)
    claims.mkdir()
    for slot in range(SLOTS - 1):  # taken: each claim's bed says it holds that slot
        owner = tmp_path / "beds" / str(slot)
        owner.mkdir(parents=True)
        (owner / testbed.BED_FILE).write_text(json.dumps({"slot": slot}))
        (claims / str(slot)).write_text(str(owner))
    return SLOTS - 1


def test_hosts_reach_each_other_and_nothing_outside_the_bed(bed, tmp_path):
    assert bed.plan.mode == "netns"  # this machine permits namespaces (FACTS.md)
    h1 = bed.host("h1").address
    bed.spawn("h1", "web", [*SERVE, h1, "8080"])
    _wait_get(bed, "h2", h1, 8080)
    assert _get(bed, "h3", h1, 8080)
    # a server on the machine's own loopback is not reachable from a host ...
    outside = subprocess.Popen(
        [*SERVE, "127.0.0.1", "8081"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.5)
        assert not _get(bed, "h2", "127.0.0.1", 8081, timeout=1)
    finally:
        outside.kill()
        outside.wait()
    # ... and no address outside the bed has a route
    with pytest.raises(TestBedError, match="unreachable"):
        bed.run("h2", [PY, "-c", "import socket; socket.create_connection(('10.1.2.3', 80), 1)"])


def test_kill_host_kills_every_process_of_it_and_wipes_its_disk(bed):
    (bed.host_dir("h1") / "data.bin").write_bytes(b"x")
    # a grandchild that leaves the session (setsid) is still in the host's namespace
    bed.spawn("h1", "forker", ["sh", "-c", "setsid sleep 600 & sleep 600 & wait"])
    bed.spawn("h2", "other", ["sleep", "600"])
    deadline = time.monotonic() + 10
    while len(bed.processes("h1")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    escaped = [p for p in bed.processes("h1")]
    bed.kill_host("h1")
    assert bed.processes("h1") == []
    for pid in escaped:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not bed.host_dir("h1").exists()
    assert bed.alive(bed.service("h2", "other"))
    st = {h["name"]: h for h in bed.status()["hosts"]}
    assert st["h1"]["down"] and not st["h2"]["down"]
    with pytest.raises(TestBedError, match="h1 is down"):
        bed.spawn("h1", "late", ["sleep", "1"])
    # restart: empty disk, its services again from their commands
    bed.restart_host("h1")
    assert bed.host_dir("h1").exists() and not (bed.host_dir("h1") / "data.bin").exists()
    assert bed.alive(bed.service("h1", "forker"))
    assert [a["action"] for a in bed.actions()][-2:] == ["kill-host", "restart-host"]


def test_a_partition_drops_packets_until_healed(bed):
    h1 = bed.host("h1").address
    bed.spawn("h1", "web", [*SERVE, h1, "8080"])
    _wait_get(bed, "h2", h1, 8080)
    bed.partition("h1")
    started = time.monotonic()
    assert not _get(bed, "h2", h1, 8080, timeout=1)
    assert time.monotonic() - started >= 0.9, "a partition times out; it does not refuse"
    assert bed.alive(bed.service("h1", "web")), "a partitioned host keeps running"
    bed.heal("h1")
    _wait_get(bed, "h2", h1, 8080)
    actions = [(a["action"], a["host"]) for a in bed.actions()]
    assert ("partition", "h1") in actions and ("heal", "h1") in actions


def test_slow_by_rate_and_a_missing_netem_is_named(bed):
    bed.slow("h2", rate="1mbit")
    qdisc = subprocess.run(
        ["tc", "qdisc", "show", "dev", bed.host("h2").link],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "tbf" in qdisc and "1Mbit" in qdisc
    bed.unslow("h2")
    try:
        bed.slow("h3", delay_ms=200)
    except TestBedError as exc:  # this kernel lacks sch_netem (FACTS.md)
        assert "--rate" in str(exc)
    else:
        qdisc = subprocess.run(
            ["tc", "qdisc", "show", "dev", bed.host("h3").link],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "netem" in qdisc and "200ms" in qdisc
    with pytest.raises(TestBedError, match=r"a delay .* or a rate"):
        bed.slow("h3")


def test_another_process_opens_the_same_bed_and_nothing_else(bed, tmp_path):
    bed.spawn("h3", "sleeper", ["sleep", "600"])
    code = (
        "import sys, json\n"
        "from riverbed.testing.testbed import TestBed\n"
        "b = TestBed.open(sys.argv[1])\n"
        "b.kill_host('h3')\n"
        "print(json.dumps(b.status()))\n"
    )
    out = subprocess.run(
        [PY, "-c", code, str(bed.root)], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out)["hosts"][2]["down"] is True
    assert not bed.alive(bed.service("h3", "sleeper"))
    (tmp_path / "not-a-bed").mkdir()
    with pytest.raises(TestBedError, match="not a test bed"):
        TestBed.open(tmp_path / "not-a-bed")
    with pytest.raises(TestBedError, match="already holds a test bed"):
        TestBed.create(bed.root)


@LAST_SLOT
def test_destroy_deletes_what_the_bed_made_by_name(tmp_path, last_slot):
    bed = TestBed.create(tmp_path / "bed", hosts=2)
    assert bed.plan.slot == last_slot
    bed.spawn("h1", "sleeper", ["sleep", "600"])
    pid = bed.service("h1", "sleeper").pid
    names = [bed.plan.bridge, *(h.link for h in bed.plan.hosts)]
    bed.destroy()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h.netns in netns for h in bed.plan.hosts)
    for name in names:
        assert subprocess.run(["ip", "link", "show", name], capture_output=True).returncode != 0
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    # the slot is free again: a new bed takes it
    again = TestBed.create(tmp_path / "bed2", hosts=1)
    assert again.plan.slot == last_slot
    again.destroy()


def test_loopback_fallback_stands_in_for_a_partition(tmp_path, monkeypatch):
    monkeypatch.setenv("RIVERBED_TESTBED_MODE", "loopback")
    with TestBed.create(tmp_path / "bed", hosts=2) as bed:
        assert bed.plan.mode == "loopback"
        assert bed.status()["why"] == "RIVERBED_TESTBED_MODE=loopback"
        h1 = bed.host("h1").address
        assert h1.startswith("127.")
        bed.spawn("h1", "web", [*SERVE, h1, "8080"])
        _wait_get(bed, "h2", h1, 8080)
        bed.partition("h1")
        assert not _get(bed, "h2", h1, 8080, timeout=1)
        assert "stand-in" in bed.actions()[-1]["how"]
        bed.heal("h1")
        _wait_get(bed, "h2", h1, 8080)
        bed.kill_host("h1")
        assert bed.processes("h1") == []


@LAST_SLOT
def test_a_second_destroy_leaves_the_namespaces_of_whoever_holds_the_slot_now(tmp_path, last_slot):
    """Once a bed is destroyed another bed may claim its slot and make namespaces of the
    same names; a second destroy of the first (`chaos destroy`, then its owner's own)
    must leave them. Here the slot's claim is handed to another root by hand, as
    another bed's claim would, while the namespaces stay."""
    bed = TestBed.create(tmp_path / "bed", hosts=1)
    assert bed.plan.slot == last_slot
    claim = bed.claim
    netns = bed.plan.hosts[0].netns
    listed = lambda: subprocess.run(  # noqa: E731
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout.split()
    try:
        assert bed.owns_slot() and netns in listed()
        claim.write_text(str(tmp_path / "another-bed"))  # the slot is another bed's now
        TestBed.open(bed.root).destroy()  # as `riverbed chaos destroy` would
        assert netns in listed()  # not this bed's to delete any more
        assert claim.read_text() == str(tmp_path / "another-bed")
    finally:
        claim.write_text(str(bed.root))  # its own again: destroyed for real
        bed.destroy()
    assert netns not in listed() and not claim.exists()


@LAST_SLOT
def test_a_slot_claimed_again_loses_the_namespaces_a_killed_teardown_left(tmp_path, last_slot):
    """A teardown killed after deleting its bridge but before its namespaces leaves
    them behind; the next bed in the slot must not fail on "File exists"."""
    from riverbed.testing import testbed
    from riverbed.testing.hostplan import netns_prefix

    stray = f"{netns_prefix(last_slot)}h1"
    listed = lambda: subprocess.run(  # noqa: E731
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout.split()
    subprocess.run(["ip", "netns", "add", stray], check=True)
    try:
        assert stray in listed()
        assert testbed._claim_slot(tmp_path / "new-bed") == last_slot
        assert stray not in listed()
        assert (testbed._CLAIMS / str(last_slot)).read_text() == str(tmp_path / "new-bed")
    finally:
        subprocess.run(["ip", "netns", "del", stray], capture_output=True, check=False)
