"""A driver running a lookup join, SIGKILLed mid-batch again and again while the table
changes before every restart: each batch joins with the version its plan recorded (a
batch run again after a kill, with the table changed meanwhile, included), so after a
final drain the results equal a pandas join of each batch's events — read back from the
log by the offsets its record names — with its recorded version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

import riverbed.log
from riverbed.stream import Lookup
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results
from riverbed.stream.layout import Checkpoint
from riverbed.stream.lookups import encoded, read_table
from tests.stream.conftest import make_events, write_events
from tests.stream.crashes import backlogs, stream_run_killed_then_drained

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Lookup, Sum, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}}
aggregation = Aggregation(
    name="joined", key="flag", time="ts", window=Tumbling("1h"), watermark="10h",
    lookups=[Lookup("sqlite:///{db}", on="flag", table="teams", how="{how}")],
    metrics={{"events": Count(), "bonus": Sum("bonus"), "teams": Distinct("team")}},
    state_partitions=3,
)
"""
KILLS = 5


def teams(version: int) -> pd.DataFrame:
    """Version ``version`` of the table: some flags, a team and a bonus of its own."""
    flags = [f"f{i}" for i in range(7) if (i + version) % 4]
    return pd.DataFrame(
        {"flag": flags, "team": [f"t{version}-{f}" for f in flags], "bonus": [version] * len(flags)}
    )


@pytest.mark.parametrize("how", ["left", "inner"])
def test_each_batch_joins_with_its_recorded_version_through_kills(
    tmp_path: Path, subprocess_env: dict[str, str], how: str
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    db = tmp_path / "teams.db"
    lookup = Lookup(f"sqlite:///{db}", on="flag", table="teams", how=how)  # type: ignore[arg-type]
    versions: dict[str, pd.DataFrame] = {}  # snapshot id -> the table it holds

    def table(version: int) -> None:
        frame = teams(version)
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE IF EXISTS teams")
            conn.execute("CREATE TABLE teams (flag TEXT, team TEXT, bonus INTEGER)")
            conn.executemany("INSERT INTO teams VALUES (?, ?, ?)", frame.itertuples(index=False))
        versions[encoded(read_table(lookup))[0]] = frame

    events = make_events(9000, hours=6, seed=11)
    slices = backlogs(events, KILLS + 1)
    log_url = f"file://{home / 'log'}"

    def release(k: int) -> None:
        table(k)  # the table changes between a kill and the restart
        write_events(log_url, slices[k], partitions=3)

    spec = tmp_path / "spec.py"
    spec.write_text(SPEC.format(db=db, how=how))
    checkpoint = Checkpoint(home / "checkpoints" / "joined")
    stream_run_killed_then_drained(
        spec, env, checkpoint.batches, records=200, kills=KILLS, seed=7, release=release,
        logs=tmp_path / "logs",
    )  # fmt: skip

    # the oracle: every batch's events (by its recorded offsets) with its recorded version
    batches = open_batches(str(checkpoint.root))
    log = riverbed.log.open(log_url)
    parts, used = [], set()
    for b in batches.ids():
        record = batches.get(b)
        assert record is not None and record.done and record.lookups is not None
        (snapshot,) = record.lookups
        rows = []
        for p, (start, end) in record.slices.items():
            for r in log.read("events", int(p), start, end - start):
                rows.append(r.value)
        if not rows:  # a no-data batch (it closed windows; it joined nothing)
            continue
        used.add(snapshot["id"])
        frame = pd.DataFrame(rows).assign(
            ts=lambda f: pd.to_datetime(f["ts"], utc=True, format="ISO8601")
        )
        parts.append(frame.merge(versions[snapshot["id"]], on="flag", how=how))
    log.close()
    assert len(used) >= 3, used  # the batches did join with several versions
    joined = pd.concat(parts)
    assert sum(batches.get(b).input for b in batches.ids()) == len(events)
    want = (
        joined.assign(window_start=joined["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(events=("ts", "size"), bonus=("bonus", "sum"), teams=("team", "nunique"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    got = read_results(home / "output" / "joined")
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""), how="outer",
                        indicator=True)  # fmt: skip
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"].head()
    for column in ("events", "bonus", "teams"):
        assert (merged[column] == merged[f"{column}_oracle"]).all(), column
