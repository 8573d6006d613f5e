"""Chained aggregations: one aggregation's final results as another's events (Nexmark
q5, "hot items": bids per auction per window, then the most bid-on auction of each
window), through the upstream's results topic or in one driver — against DuckDB over
the bids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import riverbed.log
from riverbed.errors import ConfigError
from riverbed.stream.dataframe import read_results
from riverbed.stream.specsource import load_spec
from tests.stream.test_acceptance_queries import bids

COUNTS = """
from riverbed.stream import Aggregation, Count, Tumbling

schema = "auction long, bidder long, price long, channel string, url string, ts timestamp"
source = {"topic": "bids", "schema": schema}
aggregation = Aggregation(
    name="auction_counts", key="auction", time="ts", window=Tumbling("10m"), watermark="5m",
    metrics={"bids": Count()}, output="final", state_partitions=2,
)
"""
HOT = """
from riverbed.stream import Aggregation, ArgMax, Count, Max, Tumbling

source = {"aggregation": "counts.py"}  # auction_counts' results, as events
aggregation = Aggregation(
    name="hot_items", key="everything", time="window_start", window=Tumbling("10m"),
    watermark="0s", columns={"everything": "'all'"},
    metrics={"max_bids": Max("bids"), "auction": ArgMax("key", by="bids"), "auctions": Count()},
    state_partitions=1,
)
"""


@pytest.mark.spark
@pytest.mark.parametrize("one_driver", [False, True])
def test_a_chained_aggregation_gives_nexmark_q5_as_duckdb_does(
    tmp_path: Path, subprocess_env: dict[str, str], one_driver: bool
) -> None:
    import duckdb

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    events = bids(4000, seed=13)
    log = riverbed.log.open(f"file://{home / 'log'}")
    log.create_topic("bids", 2)
    log.producer("bids").send_batch(
        [{**r, "ts": r["ts"].isoformat()} for r in events.astype({"ts": object}).to_dict("records")]
    )
    log.close()
    (tmp_path / "counts.py").write_text(COUNTS)
    run = [sys.executable, "-m", "riverbed.cli.main", "stream", "run"]
    commands = [
        [*run, str(tmp_path / "counts.py"), "--topic", "auction_counts.results"],
        [*run, str(tmp_path / "hot.py")],
    ]
    if one_driver:  # the upstream runs in hot_items' driver: no results topic
        (tmp_path / "hot.py").write_text(HOT.replace('"aggregation"', '"chained"'))
        commands = commands[1:]
    else:
        (tmp_path / "hot.py").write_text(HOT)
    for command in commands:
        done = subprocess.run(
            [*command, "--once", "--max-records-per-batch", "500"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]

    upstream = home / "checkpoints" / "hot_items" / "upstream-results"
    counts = read_results(upstream if one_driver else home / "output" / "auction_counts")
    got = read_results(home / "output" / "hot_items")
    closed = sorted(set(counts["window_start"]))  # the windows the upstream closed
    assert len(closed) >= 10 and list(got["window_start"]) == closed
    want = (
        duckdb.connect()
        .execute(
            """
            WITH counts AS (
                SELECT time_bucket(INTERVAL 10 MINUTE, ts, TIMESTAMPTZ '1970-01-01 00:00:00+00')
                           AS window_start, auction, count(*) AS n
                FROM events GROUP BY ALL)
            SELECT window_start, max(n) AS max_bids, arg_max(auction, n) AS auction,
                   count(*) AS auctions
            FROM (SELECT * FROM counts ORDER BY auction) GROUP BY window_start
            ORDER BY window_start
            """
        )
        .df()
    )
    want["window_start"] = pd.to_datetime(want["window_start"], utc=True)
    want = want[want["window_start"].isin(closed)].reset_index(drop=True)
    assert got["max_bids"].tolist() == want["max_bids"].tolist()
    assert got["auctions"].tolist() == want["auctions"].tolist()
    # ties: riverbed's ArgMax takes the smallest value among the events of the max
    for row, (_, w) in zip(got.itertuples(), want.iterrows(), strict=True):
        top = counts[
            (counts["window_start"] == w["window_start"]) & (counts["bids"] == w["max_bids"])
        ]
        assert row.auction == min(top["key"])


def test_chaining_from_an_update_aggregation_is_refused_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "counts.py").write_text(COUNTS.replace('output="final"', 'output="update"'))
    (tmp_path / "hot.py").write_text(HOT)
    with pytest.raises(ConfigError, match=r"whose output is 'update'.*set output=\"final\""):
        load_spec(tmp_path / "hot.py")
    (tmp_path / "counts.py").write_text(COUNTS)
    _, source = load_spec(tmp_path / "hot.py")
    assert source == {
        "topic": "auction_counts.results",
        "schema": "window_start timestamp, window_end timestamp, bids long, batch_id long",
    }
    # in one driver: the upstream's spec file, checked the same way
    (tmp_path / "hot.py").write_text(HOT.replace('"aggregation"', '"chained"'))
    assert load_spec(tmp_path / "hot.py")[1] == {"chained": str(tmp_path / "counts.py")}
    (tmp_path / "counts.py").write_text(COUNTS.replace('output="final"', 'output="update"'))
    with pytest.raises(ConfigError, match=r"whose output is 'update'.*set output=\"final\""):
        load_spec(tmp_path / "hot.py")
    (tmp_path / "hot.py").write_text(
        HOT.replace('"aggregation": "counts.py"', '"chained": "counts.py", "topic": "x"')
    )
    with pytest.raises(ConfigError, match=r"takes only the upstream aggregation's spec file"):
        load_spec(tmp_path / "hot.py")
