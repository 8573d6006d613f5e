"""SIGKILL the driver process (Spark JVM included) at random points, over and over;
after a final run the results equal the oracle exactly."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from riverbed.stream.dataframe import read_results
from riverbed.stream.layout import Checkpoint
from riverbed.windows import Hopping
from tests.stream.conftest import make_events, write_events
from tests.stream.crashes import backlogs, kill_mid_batch

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Hopping

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="crashy", key="flag", time="ts", window=Hopping("1h", "30m"), watermark="3h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)
"""
KILLS = 7


def test_driver_killed_seven_times_still_gives_the_oracle(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    events = make_events(12_000, hours=8, seed=3)
    slices = backlogs(events, KILLS + 1)  # in time order: one backlog a start

    def release(k: int) -> None:
        write_events(f"file://{home / 'log'}", slices[k], partitions=3)

    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    command = [
        sys.executable,
        "-m",
        "riverbed.cli.main",
        "stream",
        "run",
        str(spec),
        "--max-records-per-batch",
        "200",  # ~7 batches a slice: the kill's batch and the ones after it have work
        "--ttl",
        "3",  # a restarted driver waits out the killed one's lease (leader.py) before work
    ]
    batches = Checkpoint(home / "checkpoints" / "crashy").batches
    aimed = kill_mid_batch(
        command,
        env,
        batches,
        kills=KILLS,
        rng=random.Random(5),
        before_start=release,
        logs=tmp_path / "logs",
    )
    assert len(aimed) == KILLS
    release(KILLS)  # the last slice, for the final run to drain with the rest
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    done = [json.loads(p.read_text()) for p in batches.glob("*.json")]
    assert sum(d.get("late", 0) for d in done) == 0  # the watermark is generous here

    got = read_results(home / "output" / "crashy")
    ts = events["ts"].astype("int64") // 1_000_000
    parts = [
        events.assign(window_start=pd.to_datetime(s, unit="ms", utc=True))
        for s in Hopping("1h", "30m").starts(ts.to_numpy())
    ]
    want = (
        pd.concat(parts)
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    merged = want.merge(
        got, on=["window_start", "key"], suffixes=("_oracle", ""), how="outer", indicator=True
    )
    assert (merged["_merge"] == "both").all()
    assert (merged["users"] == merged["users_oracle"]).all()
    assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"
