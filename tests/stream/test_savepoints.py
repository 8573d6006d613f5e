"""Savepoints, as a user runs them (stream/savepoints.py): a savepoint taken, a bad
change run past it (and past the state's retention), a fork from the savepoint under
another name with another filter, and a rollback of the aggregation to it — killed
during its restore — each equal to a recomputation over the events it should count."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from riverbed.cli.main import main
from tests.stream.conftest import hourly, make_events, write_events

pytestmark = pytest.mark.spark

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}}
aggregation = Aggregation(
    name="{name}", key="flag", time="ts", window=Tumbling("1h"), watermark="30m",
    metrics={{"events": Count(), "users": Distinct("user_id"), "spent": Sum("amount"){more}}},
    state_partitions=3, {extra}
)
"""


def test_savepoint_fork_and_rollback(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    monkeypatch.setenv("RIVERBED_HOME", str(home))
    events = make_events(1200, hours=6)  # in time order: nothing late at a 30m watermark
    thirds = [events.iloc[:400], events.iloc[400:800], events.iloc[800:]]
    log = f"file://{home / 'log'}"
    flags, whatif = tmp_path / "flags.py", tmp_path / "whatif.py"

    def run(spec: Path, *more: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec)]
        # small batches, and a state that keeps only 2 versions: the savepoint's is
        # purged from the aggregation's own history long before it is restored
        command += ["--once", "--max-records", "100", "--ttl", "3", "--retain-versions", "2"]
        command += ["--snapshot-every", "2", *more]
        if spec == flags:  # and its results in SQL: restored rows reach every sink
            command += ["--sql", f"sqlite:///{tmp_path / 'r.db'}"]
        with_fault = {**env, "RIVERBED_FAULT": fault} if fault else env
        return subprocess.run(command, env=with_fault, capture_output=True, text=True, check=False)

    def query(name: str) -> pd.DataFrame:
        assert main(["query", name, "--json"]) == 0
        rows = pd.DataFrame([json.loads(x) for x in capsys.readouterr().out.splitlines()])
        rows["window_start"] = pd.to_datetime(rows["window_start"], utc=True).dt.as_unit("ns")
        return rows.set_index(["window_start", "key"]).sort_index()

    def equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
        assert list(got.index) == list(want.index)
        columns = ["events", "users", "spent"]
        pd.testing.assert_frame_equal(got[columns].astype(float), want[columns].astype(float))

    write_events(log, thirds[0], partitions=3)
    flags.write_text(SPEC.format(name="flags", extra="", more=""))
    assert run(flags).returncode == 0
    assert main(["stream", "savepoint", str(flags), "before"]) == 0
    said = capsys.readouterr().out
    # batches 0-3 of 100 events, then 4 without input (the watermark the last ones set)
    assert "savepoint before of flags: batch 4, state version 5 (3 partitions" in said, said
    assert main(["stream", "savepoint", str(flags), "before"]) == 2  # a name is taken once
    assert "has a savepoint 'before' already" in capsys.readouterr().err

    # a bad change, run past the savepoint (and past the state's retention of its version)
    flags.write_text(SPEC.format(name="flags", extra='where="amount > 90",', more=""))
    write_events(log, thirds[1], partitions=3)
    done = run(flags)
    assert done.returncode == 0, done.stderr[-2000:]
    from riverbed.state import StateConfig, StateProvider

    provider = StateProvider(
        StateConfig(local_dir=tmp_path / "x", durable=home / "checkpoints" / "state")
    )
    assert all(min(provider.versions("flags", p)) > 5 for p in range(3))  # purged

    assert main(["stream", "savepoints", str(flags), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["batch"], s["state_partitions"]) for s in listed] == [("before", 4, 3)]

    # a fork: another name, another filter and a metric more (backfilled from the
    # savepoint's cut back), from the savepoint
    whatif.write_text(
        SPEC.format(name="whatif", extra='where="amount > 50",', more=', "top": Max("amount")')
    )
    done = run(whatif, "--from-savepoint", "flags:before")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "starting from savepoint before of flags (batch 4)" in done.stderr
    assert "where: (none) → 'amount > 50'" in done.stderr
    assert "metric 'top': (none) → Max(column='amount')" in done.stderr
    second = thirds[1][thirds[1]["amount"] > 50]
    fork = hourly(pd.concat([thirds[0], second]))
    equal(query("whatif"), fork)
    assert (query("whatif")["top"] == fork["top"]).all()

    # the rollback: the spec as it was, from the savepoint — killed while the state is
    # restored, and right after the switch — then every event counted once
    flags.write_text(SPEC.format(name="flags", extra="", more=""))
    write_events(log, thirds[2], partitions=3)
    for fault in ("kill_in_move:1", "kill_in_move:done"):
        killed = run(flags, "--from-savepoint", "before", fault=fault)
        assert killed.returncode == -signal.SIGKILL, (fault, killed.stderr[-2000:])
    done = run(flags, "--from-savepoint", "before")
    assert done.returncode == 0, done.stderr[-2000:]
    rolled_back = query("flags")
    equal(rolled_back, hourly(events))
    with sqlite3.connect(tmp_path / "r.db") as conn:
        in_sql = pd.read_sql("SELECT * FROM flags", conn)
    in_sql["window_start"] = pd.to_datetime(in_sql["window_start"], utc=True).dt.as_unit("ns")
    equal(in_sql.set_index(["window_start", "key"]).sort_index(), rolled_back)
    # the same command line again (a service manager's restart): restored once only
    assert main(["stream", "status", str(flags), "--json"]) == 0
    batches = json.loads(capsys.readouterr().out)["batches"]
    again = run(flags, "--from-savepoint", "before")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "started from savepoint before of flags already" in again.stderr
    assert main(["stream", "status", str(flags), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == batches  # no restore batch
    equal(query("flags"), hourly(events))
    # the fork is its own aggregation: untouched by the rollback
    equal(query("whatif"), hourly(pd.concat([thirds[0], second])))

    # deleted: the record, the rows and the state's copy go; starting from it is refused
    assert "flags.sp.before" in provider.namespaces()
    assert main(["stream", "savepoint", str(flags), "before", "--delete"]) == 0
    assert "savepoint before of flags deleted" in capsys.readouterr().out
    assert "flags.sp.before" not in provider.namespaces()
    assert main(["stream", "savepoints", str(flags)]) == 0
    assert "flags has no savepoints" in capsys.readouterr().out
    refused = run(flags, "--from-savepoint", "before")
    assert refused.returncode == 2
    assert "no savepoint 'before'" in refused.stderr and "(it has: none)" in refused.stderr
