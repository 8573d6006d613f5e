"""One active driver per aggregation: a second `stream run` stands by and takes over when
the active one dies; a paused driver resumed after a takeover writes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.stream.runner import read_results
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
def setup(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, Any]:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[1]"}
    env.pop("RIVERBED_CONTROL", None)
    events = make_events(9_000, hours=6, seed=11)
    write_events(f"file://{home / 'log'}", events, partitions=2)
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    return {"home": home, "env": env, "events": events, "spec": spec, "tmp": tmp_path}


def driver(s: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(s["spec"])]
    return subprocess.Popen(
        [*command, "--once", "--max-records-per-batch", "300", "--ttl", str(TTL), *extra],
        env=s["env"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def checkpoint(s: dict[str, Any]) -> Path:
    return Path(s["home"]) / "checkpoints" / "duo"


def term(s: dict[str, Any]) -> int | None:
    path = checkpoint(s) / "riverbed" / "driver.json"
    return int(json.loads(path.read_text())["term"]) if path.exists() else None


def records(s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    batches = checkpoint(s) / "riverbed" / "batches"
    return {int(p.stem): json.loads(p.read_text()) for p in batches.glob("*.json")}


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def fingerprint(s: dict[str, Any]) -> dict[str, str]:
    """Every file riverbed writes for the aggregation (not Spark's own offset logs)."""
    roots = [
        checkpoint(s) / "riverbed",
        checkpoint(s) / "state",
        Path(s["home"]) / "output" / "duo",
        Path(s["home"]) / "log",
    ]
    return {
        str(p): hashlib.sha1(p.read_bytes()).hexdigest()
        for root in roots
        if root.exists()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def test_a_standby_takes_over_from_a_killed_driver_and_the_results_equal_the_oracle(
    setup: dict[str, Any],
) -> None:
    first = driver(setup)
    wait_for(lambda: len(records(setup)) >= 2, 120, "the first driver's batches")
    first_term = term(setup)
    second = driver(setup)
    # the second says it stands by, and who leads; it does no work meanwhile
    line = second.stderr.readline() if second.stderr else ""
    while "standby" not in line and line:
        line = second.stderr.readline() if second.stderr else ""
    assert f"standby for duo; active driver {os.uname().nodename}:{first.pid} since" in line
    time.sleep(1)
    assert term(setup) == first_term and second.poll() is None
    assert {r["term"] for r in records(setup).values() if r.get("done")} == {first_term}
    os.killpg(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()
    wait_for(lambda: term(setup) != first_term, TTL + 30, "the standby's takeover")
    took = time.monotonic() - killed_at
    assert took <= TTL + 10, f"took over {took:.1f}s after the kill"
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "at org.apache" not in err
    done = {b: r for b, r in records(setup).items() if r.get("done")}
    # each batch was run to completion by one driver: terms only grow with the batch id
    terms = [done[b]["term"] for b in sorted(done)]
    assert terms == sorted(terms) and set(terms) == {first_term, term(setup)}
    check(setup["home"], setup["events"])


def test_a_paused_driver_resumed_after_a_takeover_writes_nothing(setup: dict[str, Any]) -> None:
    first = driver(setup)
    wait_for(lambda: len(records(setup)) >= 2, 120, "the first driver's batches")
    first_term = term(setup)
    second = driver(setup)
    time.sleep(1)
    os.killpg(first.pid, signal.SIGSTOP)  # the whole driver: Python and its JVM
    try:
        wait_for(lambda: term(setup) != first_term, TTL + 60, "the standby's takeover")
        _, err = second.communicate(timeout=300)
        assert second.returncode == 0, err[-2000:]
        before = fingerprint(setup)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode != 0, "the zombie carried on"
    assert "lost the lead of 'duo'" in err or "was replaced by" in err, err[-2000:]
    assert "Traceback" not in err
    assert fingerprint(setup) == before, "the resumed zombie wrote something"
    check(setup["home"], setup["events"])


def test_no_standby_fails_with_one_line_while_a_driver_is_active(setup: dict[str, Any]) -> None:
    first = driver(setup)
    wait_for(lambda: term(setup) is not None, 120, "the first driver")
    second = driver(setup, "--no-standby")
    _, err = second.communicate(timeout=120)
    first.wait(timeout=300)
    assert second.returncode == 1
    assert "aggregation 'duo' is already running: active driver" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
