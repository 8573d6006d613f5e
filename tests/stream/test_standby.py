"""One active driver per aggregation: a second `stream run` stands by and takes over when
the active one dies; a paused driver resumed after a takeover writes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from deltalake import DeltaTable

from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results
from riverbed.stream.fencing import recorded_driver
from riverbed.stream.warmup import WARM
from tests.jobs.cluster import until
from tests.stream.conftest import make_events, write_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="duo", key="flag", time="ts", window=Tumbling("1h"), watermark="3h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=2,
)
"""
TTL = 4  # short, but a loaded 2-core machine must still keep the lease alive


def oracle(events: pd.DataFrame) -> pd.DataFrame:
    return (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )


def check(home: Path, events: pd.DataFrame) -> None:
    got = read_results(home / "output" / "duo")
    merged = oracle(events).merge(
        got, on=["window_start", "key"], suffixes=("_oracle", ""), how="outer", indicator=True
    )
    assert (merged["_merge"] == "both").all()
    assert (merged["users"] == merged["users_oracle"]).all()
    assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"


@pytest.fixture
def setup(tmp_path: Path, subprocess_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[1]"}
    env.pop("RIVERBED_CONTROL", None)
    events = make_events(9_000, hours=6, seed=11)
    write_events(f"file://{home / 'log'}", events, partitions=2)
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    s = {"home": home, "env": env, "events": events, "spec": spec, "procs": []}
    yield s
    for process in s["procs"]:  # a failed test leaves no driver behind
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def driver(s: dict[str, Any], *extra: str, continuous: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(s["spec"])]
    once = [] if continuous else ["--once"]
    process = subprocess.Popen(
        [*command, *once, "--max-records-per-batch", "300", "--ttl", str(TTL), *extra],
        env=s["env"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    s["procs"].append(process)
    return process


def checkpoint(s: dict[str, Any]) -> Path:
    return Path(s["home"]) / "checkpoints" / "duo"


def term(s: dict[str, Any]) -> int | None:
    record = recorded_driver(checkpoint(s))
    return int(record["term"]) if record is not None else None


def records(s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    batches = open_batches(checkpoint(s))
    return {b: r.to_json() for b in batches.ids() if (r := batches.get(b)) is not None}


def fingerprint(s: dict[str, Any]) -> dict[str, str]:
    """Every file riverbed writes for the aggregation (not Spark's own offset logs), by
    content and inode — a file replaced by the same bytes is a write too — but hidden
    ones and those in hidden directories: a writer's staging, which a zombie paused
    mid-write removes when it wakes and finds itself fenced (no reader sees it)."""
    roots = [
        checkpoint(s) / "riverbed",
        checkpoint(s) / "state",
        Path(s["home"]) / "output" / "duo",
        Path(s["home"]) / "log",
        Path(s["home"]) / "lake",  # the Delta table, where a test's drivers write one
    ]
    return {
        str(p): f"{hashlib.sha1(p.read_bytes()).hexdigest()} inode {p.stat().st_ino}"
        for root in roots
        if root.exists()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def standby_line(process: subprocess.Popen[str]) -> str:
    """The line a standby prints once its SparkSession is up ('' if it ended first)."""
    assert process.stderr is not None
    line = process.stderr.readline()
    while line and "standby for" not in line:
        line = process.stderr.readline()
    return line


def active_pid(s: dict[str, Any]) -> int:
    record = recorded_driver(checkpoint(s))
    assert record is not None
    return int(record["driver"].rpartition(":")[2])


# On etcd, the production control plane. The same takeover on SQLite (standby, a
# SIGSTOPped zombie, its writes refused) runs in test_bucket_failover.py, and the
# control plane's contract suite runs every lease and election step on both: running
# this scenario twice cost ~90 s of the suite for no behaviour of its own.
CONTROLS = [pytest.param("etcd", marks=pytest.mark.etcd)]


@pytest.mark.parametrize("control", CONTROLS)
def test_standbys_take_over_from_a_paused_and_a_killed_driver_and_the_zombie_writes_nothing(
    setup: dict[str, Any], control: str, request: pytest.FixtureRequest
) -> None:
    """A leads; B and C stand by. A is paused (SIGSTOP: a zombie) → one standby takes
    over; it is SIGKILLed mid-run → the other takes over and carries on. Exactly one
    driver works at any moment (terms in the batch records only grow), the results equal
    the oracle, and A, resumed at the end, writes nothing.

    The drivers run until stopped, and events keep coming: two more parts, one released
    at the pause and one at the kill, so every driver has batches to run however long
    the steps before took (a backlog run with ``--once`` can be done — small batches run
    in the driver take milliseconds — before a standby's Spark is up)."""
    if control == "etcd":
        setup["env"]["RIVERBED_CONTROL"] = request.getfixturevalue("etcd_server").url
    nodename = os.uname().nodename
    lake = ("--table", f"delta:{setup['home'] / 'lake'}")  # results as a Delta table too
    # A ends when it loses its lead (it does not stand by again): the zombie's exit
    a = driver(setup, "--no-standby", *lake, continuous=True)
    until(lambda: term(setup) is not None, 120, "the first driver's term")
    if control == "sqlite":  # refusing to stand by happens before Spark starts: cheap
        refused = driver(setup, "--no-standby")
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 1
        assert f"aggregation 'duo' is already running: active driver {nodename}:{a.pid}" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
    b, c = driver(setup, *lake, continuous=True), driver(setup, *lake, continuous=True)
    try:
        for standby in (b, c):  # each says it stands by, and who leads, once Spark is up
            line = standby_line(standby)
            assert f"standby for duo; active driver {nodename}:{a.pid} since" in line, line
        for standby in (b, c):  # and warms its executors while it waits
            line = line_with(standby, WARM)
            assert re.search(r"riverbed's task modules imported on every core \([1-9]", line), line
        first_term = term(setup)
        assert a.poll() is None, "the first driver ended"
        assert {r["term"] for r in records(setup).values() if r.get("done")} <= {first_term}
        os.killpg(a.pid, signal.SIGSTOP)  # the whole driver, Python and JVM: a zombie
        paused_at = time.monotonic()
        produce(setup, 1_500, after_hours=6)  # the second part
        until(lambda: term(setup) != first_term, TTL + 60, "a standby's takeover")
        took = time.monotonic() - paused_at
        assert took <= TTL + 15, f"took over {took:.1f}s after the pause"
        second_term = term(setup)
        x = {b.pid: b, c.pid: c}[active_pid(setup)]
        y = c if x is b else b
        until(
            lambda: any(r.get("term") == second_term for r in records(setup).values()),
            120,
            "the second driver's first batch",
        )
        assert x.poll() is None, "the second driver ended before it could be killed"
        os.killpg(x.pid, signal.SIGKILL)
        x.wait()
        produce(setup, 1_500, after_hours=7)  # the third part
        until(lambda: term(setup) not in (first_term, second_term), TTL + 60, "the takeover")
        until(lambda: caught_up(setup), 300, "every event aggregated once")
        os.killpg(y.pid, signal.SIGTERM)  # stopped as a user stops it: Ctrl-C
        _, err = y.communicate(timeout=120)
        assert y.returncode == 130, err[-2000:]
        assert "Traceback" not in err and "at org.apache" not in err
        third_term = term(setup)
        done = {bid: r for bid, r in records(setup).items() if r.get("done")}
        terms = [done[bid]["term"] for bid in sorted(done)]
        assert terms == sorted(terms), "two drivers interleaved batches"
        assert set(terms) <= {first_term, second_term, third_term} and third_term in terms
        assert first_term < second_term < third_term
        check(setup["home"], setup["events"])
        table = DeltaTable(str(setup["home"] / "lake")).to_pyarrow_table().to_pandas()
        merged = oracle(setup["events"]).merge(table, on=["window_start", "key"], how="outer")
        assert len(merged) == len(table) == len(oracle(setup["events"]))  # one row each
        assert (merged["events_x"] == merged["events_y"]).all(), "the table's counts"
        before = fingerprint(setup)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    assert_fenced(a)
    assert_wrote_nothing_read(setup, before)


def assert_wrote_nothing_read(s: dict[str, Any], before: dict[str, str]) -> None:
    """Every file as ``before`` the zombie woke, but for data files of the Delta table
    that no version names: a zombie paused *inside* the table's write finishes its data
    file on waking, and its commit is refused. No reader sees such a file, and the
    table's compaction deletes it once a week old
    (:meth:`riverbed.stream.lakehouse.DeltaSink.compact`). A commit, a changed or a
    removed file anywhere fails."""
    after = fingerprint(s)
    lake = Path(s["home"]) / "lake"
    named = {Path(u.removeprefix("file://")) for u in DeltaTable(str(lake)).file_uris()}
    unnamed = {
        key
        for key in after.keys() - before.keys()
        if Path(key).parent == lake and key.endswith(".parquet") and Path(key) not in named
    }
    kept = {key: value for key, value in after.items() if key not in unnamed}
    assert kept == before, "the resumed zombie wrote something"


def later_events(n: int, after_hours: int) -> pd.DataFrame:
    """``n`` events in the hour after the first ``after_hours``: later than every event
    before them, so none is behind the watermark."""
    more = make_events(n, hours=1, seed=after_hours)
    more["ts"] += pd.Timedelta(hours=after_hours)
    return more


def produce(s: dict[str, Any], n: int, after_hours: int) -> None:
    """:func:`later_events` appended to the topic and the oracle."""
    more = later_events(n, after_hours)
    write_events(f"file://{s['home'] / 'log'}", more, partitions=2)
    s["events"] = pd.concat([s["events"], more], ignore_index=True)


def caught_up(s: dict[str, Any]) -> bool:
    """Whether the results equal the oracle of every event produced so far."""
    try:
        check(s["home"], s["events"])
    except (AssertionError, OSError, ValueError):
        return False
    return True


def assert_fenced(zombie: subprocess.Popen[str]) -> None:
    """A resumed driver that was replaced stops with one of the fence's lines: it finds
    its term taken (``was replaced by``), its lead lost, or — when its own lease clock
    is the first thing to run after SIGCONT — that it went a whole TTL without a
    refresh (self-fencing; which comes first is up to the scheduler)."""
    _, err = zombie.communicate(timeout=120)
    assert zombie.returncode != 0, "the zombie carried on"
    fenced = (
        "lost the lead of 'duo'",
        "was replaced by",
        "stopped writing before a standby could take over",
    )
    assert any(line in err for line in fenced), err[-2000:]
    assert "Traceback" not in err


def line_with(process: subprocess.Popen[str], text: str) -> str:
    """The first line of ``process``'s stderr that holds ``text`` ('' if it ended first)."""
    assert process.stderr is not None
    line = process.stderr.readline()
    while line and text not in line:
        line = process.stderr.readline()
    return line


@pytest.mark.etcd
def test_a_driver_that_lost_its_lead_stands_by_again_and_takes_over_later(
    setup: dict[str, Any], etcd_server: Any
) -> None:
    """A long-running driver (no --once) whose lease ran out while it was paused does
    not exit: it writes nothing more, stands by again behind the driver that took over
    (and again when paused past its TTL as that standby), and takes over from it in
    turn when that one dies — the aggregation keeps a driver as long as one process of
    it lives."""
    setup["env"]["RIVERBED_CONTROL"] = etcd_server.url
    nodename = os.uname().nodename
    a = driver(setup, continuous=True)
    until(lambda: term(setup) is not None, 120, "the first driver's term")
    first_term = term(setup)
    b = driver(setup, continuous=True)
    assert f"active driver {nodename}:{a.pid} since" in standby_line(b)
    until(
        lambda: any(r.get("term") == first_term for r in records(setup).values()),
        120,
        "the first driver's first batch",
    )
    os.killpg(a.pid, signal.SIGSTOP)
    try:
        until(lambda: term(setup) != first_term, TTL + 60, "the standby's takeover")
        assert active_pid(setup) == b.pid
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    assert "it wrote nothing more" in line_with(a, "lost its lead")
    again = line_with(a, "standby for duo")
    assert f"active driver {nodename}:{b.pid} since" in again, again
    assert a.poll() is None, "the driver that lost its lead exited"
    second_term = term(setup)
    assert second_term is not None and first_term is not None and second_term > first_term
    # now A waits as the standby: paused past its TTL, its lease runs out while it
    # waits; resumed, it stands by again (it exited: "session lease … is gone"). It
    # says "standby for" before it campaigns: pause it once its candidacy is there.
    from riverbed.control import connect

    cp = connect(etcd_server.url)
    try:
        until(
            lambda: len(cp.get_prefix(b"riverbed/election/streams/duo/")) == 2,
            30,
            "the standby's candidacy",
        )
    finally:
        cp.close()
    os.killpg(a.pid, signal.SIGSTOP)
    time.sleep(TTL + 3)
    os.killpg(a.pid, signal.SIGCONT)
    assert "ran out while it waited" in line_with(a, "lease ran out")
    again = line_with(a, "standby for duo")
    assert f"active driver {nodename}:{b.pid} since" in again, again
    assert a.poll() is None, "the standby whose lease ran out exited"
    assert term(setup) == second_term, "B lost its lead to a paused standby"
    os.killpg(b.pid, signal.SIGKILL)
    b.wait()
    until(lambda: active_pid(setup) == a.pid, TTL + 60, "the first driver's second takeover")
    third_term = term(setup)
    assert third_term is not None and third_term > second_term

    until(lambda: caught_up(setup), 180, "every event aggregated once")
    done = {bid: r for bid, r in records(setup).items() if r.get("done")}
    terms = [done[bid]["term"] for bid in sorted(done)]
    assert terms == sorted(terms), "two drivers interleaved batches"
    assert first_term in terms
    os.killpg(a.pid, signal.SIGTERM)
    a.wait(timeout=60)
