"""Lookup joins in the engine, on every path (Spark's DataFrame path, the log-native
co-located and shuffled ones), against pandas: two tables (Parquet, inner; SQLite,
left), changed between two runs — each batch joins with the version its plan
recorded."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import riverbed.log
from riverbed.stream import Aggregation, Count, Distinct, Lookup, Max, Sum, Tumbling
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import start
from riverbed.stream.layout import LOOKUPS, checkpoint_store
from riverbed.stream.lookupparts import parted
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import PATHS, run_to_end, source_for

pytestmark = pytest.mark.spark


def users_table(path: Path, version: int) -> pd.DataFrame:
    """Users 0-399 minus every seventh (inner: their events are dropped), with an owner
    and a budget that differ by version."""
    ids = [u for u in range(400) if u % 7]
    frame = pd.DataFrame(
        {
            "user_id": np.array(ids, dtype="int32"),
            "owner": [f"o{(u + version) % 5}" for u in ids],
            "budget": [float(u * version % 97) for u in ids],
        }
    )
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return frame


def teams_table(path: Path, version: int) -> pd.DataFrame:
    """Teams of some flags (left: the others' events are kept, team NULL)."""
    frame = pd.DataFrame(
        {"flag": ["f0", "f1", "f3"], "team": [f"t{version}", "tx", f"t{version}b"]}
    )
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS teams")
        db.execute("CREATE TABLE teams (flag TEXT, team TEXT)")
        db.executemany("INSERT INTO teams VALUES (?, ?)", frame.itertuples(index=False))
    return frame


def enriched(events: pd.DataFrame, users: pd.DataFrame, teams: pd.DataFrame) -> pd.DataFrame:
    joined = events.merge(users.astype({"user_id": "int64"}), on="user_id", how="inner")
    return joined.merge(teams, on="flag", how="left")


@pytest.mark.parametrize(
    ("path", "parts"), [*((p, None) for p in PATHS), ("spark", 3), ("shuffled", 4)]
)
def test_lookups_equal_pandas_on_every_path_as_of_each_batch(
    spark: Any, log_url: str, tmp_path: Path, path: str, parts: int | None
) -> None:
    """(``parts``: the users' table held in parts, riverbed.stream.lookupparts.)"""
    users_at, teams_at = tmp_path / "users.parquet", tmp_path / "teams.db"
    spec = Aggregation(
        name="enriched",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="10h",
        lookups=[
            Lookup(str(users_at), on="user_id", how="inner", parts=parts),
            Lookup(f"sqlite:///{teams_at}", on="flag", table="teams", columns={"team": "team"}),
        ],
        columns={"spend": "amount * budget"},
        where="owner <> 'o4'",
        metrics={
            "events": Count(),
            "owners": Distinct("owner"),
            "spend": Sum("spend"),
            "teams": Distinct("team"),
            "top": Max("budget"),
        },
        state_partitions=3,
    )
    first, second = make_events(1200, hours=3, seed=7), make_events(900, hours=3, seed=8)
    second["ts"] += pd.Timedelta(hours=2)  # overlapping windows: state holds both
    v1 = users_table(users_at, 1), teams_table(teams_at, 1)
    write_events(log_url, first)
    run_to_end(spark, spec, log_url, tmp_path, path)
    v2 = users_table(users_at, 2), teams_table(teams_at, 2)
    write_events(log_url, second)
    got = run_to_end(spark, spec, log_url, tmp_path, path)

    rows = pd.concat([enriched(first, *v1), enriched(second, *v2)])
    rows = rows[rows["owner"] != "o4"].assign(spend=lambda f: f["amount"] * f["budget"])
    want = (
        rows.assign(window_start=rows["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(
            events=("ts", "size"),
            owners=("owner", "nunique"),
            spend=("spend", "sum"),
            teams=("team", "nunique"),
            top=("budget", "max"),
        )
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    merged = got.merge(want, on=["window_start", "key"], how="outer", indicator=True,
                       suffixes=("", "_oracle"))  # fmt: skip
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"].head()
    for column in ("events", "owners", "teams"):
        assert (merged[column] == merged[f"{column}_oracle"]).all(), column
    for column in ("spend", "top"):
        assert np.allclose(merged[column], merged[f"{column}_oracle"]), column

    batches = open_batches(str(tmp_path / "ckpt"))
    records = [batches.get(b) for b in batches.ids()]
    everything = pd.concat([first, second])
    users_missing = int((everything["user_id"] % 7 == 0).sum())
    teams_missing = int((~everything["flag"].isin(["f0", "f1", "f3"])).sum())
    both = int(
        ((everything["user_id"] % 7 == 0) & ~everything["flag"].isin(["f0", "f1", "f3"])).sum()
    )
    assert sum(r.unmatched or 0 for r in records) == users_missing + teams_missing - both
    assert sum(r.input or 0 for r in records) == len(everything)
    # every batch records its versions; two versions in all, and only what can still
    # run is kept in the checkpoint
    versions = {tuple(d["id"] for d in r.lookups) for r in records}
    assert len(versions) == 2, versions
    kept = {i.key for i in checkpoint_store(str(tmp_path / "ckpt")).list(LOOKUPS)}
    newest = {
        f"{LOOKUPS}{d['id']}/0.arrow" if parted(d["id"]) else f"{LOOKUPS}{d['id']}.arrow"
        for d in records[-1].lookups
    }
    assert newest <= kept, kept
    # older versions are pruned: two of each lookup at most (a part counts as one)
    assert len({k[len(LOOKUPS) :].split("/")[0] for k in kept}) <= 4, kept
    assert [parted(d["id"]) for d in records[-1].lookups] == [parts or 0, 0]


def test_a_lookup_that_cannot_start_is_refused_at_start(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    write_events(log_url, make_events(10, hours=1))
    users_at = tmp_path / "users.parquet"
    users_table(users_at, 1)
    cases = [
        (Lookup(str(tmp_path / "none.parquet"), on="user_id"), "no such file or directory"),
        (Lookup(str(users_at), on=("flag", "user_id")), "the events' 'flag' is string"),
        (Lookup(str(users_at), on="user_id", columns={"amount": "owner"}), "'amount' is already"),
    ]
    for lookup, says in cases:
        for path in ("spark", "colocated"):
            with pytest.raises(Exception, match="lookup") as refused:
                start(spark, Aggregation(name="bad", key="flag", time="ts", window=Tumbling("1h"),
                                         metrics={"n": Count()}, lookups=[lookup]),
                      source_for(spark, log_url, path), checkpoint=tmp_path / f"c-{path}",
                      output=tmp_path / f"o-{path}", log_url=log_url,
                      trigger={"availableNow": True})  # fmt: skip
            assert says in str(refused.value), (path, str(refused.value))


@pytest.mark.parametrize("path", ["spark", "colocated"])
def test_a_topic_of_the_aggregations_log_is_a_lookup_table(
    spark: Any, log_url: str, tmp_path: Path, path: str
) -> None:
    """Owners per flag as a keyed topic beside the events (newest value per key): the
    aggregation counts events and owners per flag."""
    log = riverbed.log.open(log_url)
    log.create_topic("owners", 1)
    send = log.producer("owners").send
    for flag, owner in [("f0", "ann"), ("f1", "bob"), ("f0", "cy"), ("f2", "dee")]:
        send({"flag": flag, "owner": owner}, key=flag)
    log.close()
    events = make_events(600, hours=2, seed=3)
    write_events(log_url, events)
    spec = Aggregation(
        name="owned",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="10h",
        lookups=[Lookup(topic="owners", on="flag", how="inner")],
        metrics={"events": Count(), "owners": Distinct("owner")},
        state_partitions=3,
    )
    got = run_to_end(spark, spec, log_url, tmp_path, path)
    owners = pd.DataFrame({"flag": ["f0", "f1", "f2"], "owner": ["cy", "bob", "dee"]})
    rows = events.merge(owners, on="flag")
    want = (
        rows.assign(window_start=rows["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(events=("ts", "size"), owners=("owner", "nunique"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    columns = ["window_start", "key", "events", "owners"]
    got = got.sort_values(["window_start", "key"])[columns].reset_index(drop=True)
    want = want.sort_values(["window_start", "key"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
