"""The queries issue's acceptance example, as written, through ``riverbed stream run``
with its driver SIGKILLed mid-batch — against an independent recomputation: DuckDB's
SQL over the same bids (exact metrics identical, the quantile within its rank bound,
the top-k counts exact) and sessions by their definition (no stale session left)."""

# ruff: noqa: E501 - the example's spec text is the issue's, as written

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import riverbed.log
from riverbed.stream.dataframe import read_results
from riverbed.stream.layout import Checkpoint
from tests.stream.crashes import backlogs, kill_mid_batch
from tests.stream.test_engine import session_oracle

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE = (
    'source = {"topic": "bids", "schema": "auction long, bidder long, price long, '
    'channel string, url string, ts timestamp"}\n'
)
QSTATS = (
    "from riverbed.stream import Aggregation, Count, Distinct, Max, Quantile, TopK, Tumbling\n"
    + SOURCE
    + """aggregation = Aggregation(
    name="qstats", key=["channel", "auction_mod"], time="ts", window=Tumbling("10m"), watermark="2h",
    where="price > 100 AND channel <> 'spam'",
    columns={"auction_mod": "auction % 5", "dollars": "price * 0.908",
             "domain": "regexp_extract(url, '^https?://([^/]+)', 1)"},
    metrics={"bids": Count(), "cheap": Count(where="price < 5000"),
             "bidders": Distinct("bidder", mode="exact"), "domains": Distinct("domain", mode="exact"),
             "max_dollars": Max("dollars"), "p90": Quantile("price", 0.9), "top": TopK("bidder", 3)},
)
"""
)
SESS = (
    "from riverbed.stream import Aggregation, Count, Session, Sum\n"
    + SOURCE
    + """aggregation = Aggregation(name="sess", key="bidder", time="ts", window=Session("5m"), watermark="2h",
                  metrics={"bids": Count(), "spent": Sum("price")})
"""
)
KILLS = 2


def bids(n: int, seed: int) -> pd.DataFrame:
    """Bids over two hours, a little out of order: hot auctions and bidders, spam, urls
    with and without a host the regex finds."""
    rng = np.random.default_rng(seed)
    ms = np.sort(rng.integers(0, 2 * 3_600_000, n)) + rng.integers(0, 120_000, n)
    hosts = np.array(["https://www.a.com/x", "http://b.org/y?z=1", "https://c.net", "ftp://d/e"])
    return pd.DataFrame(
        {
            "auction": (rng.zipf(1.5, n) % 40) + 1000,
            "bidder": rng.integers(0, 150, n),
            "price": rng.integers(1, 12_000, n),
            "channel": rng.choice(["web", "app", "spam", "partner"], n, p=[0.4, 0.3, 0.1, 0.2]),
            "url": hosts[rng.integers(0, len(hosts), n)],
            "ts": pd.Timestamp("2026-11-21", tz="UTC") + pd.to_timedelta(ms, unit="ms"),
        }
    )


def run_killed(tmp_path: Path, env: dict[str, str], spec_text: str, name: str) -> pd.DataFrame:
    """The events in backlogs, one per start of a driver that is SIGKILLed mid-batch
    ``KILLS`` times, then a last run to the end; returns the bids and the results."""
    home = tmp_path / "home"
    env = {**env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    events = bids(5000, seed=7)
    slices = backlogs(events, KILLS + 1)

    def release(k: int) -> None:
        log = riverbed.log.open(f"file://{home / 'log'}")
        if "bids" not in log.topics():
            log.create_topic("bids", 3)
        log.producer("bids").send_batch(
            [
                {**row, "ts": row["ts"].isoformat()}
                for row in slices[k].astype({"ts": object}).to_dict("records")
            ],
            key_field="bidder",
        )
        log.close()

    spec = tmp_path / f"{name}.py"
    spec.write_text(spec_text)
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec)]
    command += ["--max-records-per-batch", "150", "--ttl", "3"]
    batches = Checkpoint(home / "checkpoints" / name).batches
    aimed = kill_mid_batch(
        command,
        env,
        batches,
        kills=KILLS,
        rng=random.Random(11),
        before_start=release,
        logs=tmp_path / "logs",
    )
    assert len(aimed) == KILLS
    release(KILLS)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    return read_results(home / "output" / name)


def test_the_acceptance_query_through_kills_equals_duckdb(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    import duckdb

    got = run_killed(tmp_path, subprocess_env, QSTATS, "qstats")
    events = bids(5000, seed=7)  # noqa: F841 - DuckDB reads it by its name
    want = (
        duckdb.connect()
        .execute(
            """
            SELECT time_bucket(INTERVAL 10 MINUTE, ts, TIMESTAMPTZ '1970-01-01 00:00:00+00')
                       AS window_start,
                   channel, auction % 5 AS auction_mod,
                   count(*) AS bids, count(*) FILTER (WHERE price < 5000) AS cheap,
                   count(DISTINCT bidder) AS bidders,
                   count(DISTINCT regexp_extract(url, '^https?://([^/]+)', 1)) AS domains,
                   max(price * 0.908) AS max_dollars,
                   list(price) AS prices, list(bidder) AS who
            FROM events WHERE price > 100 AND channel <> 'spam'
            GROUP BY ALL ORDER BY ALL
            """
        )
        .df()
    )
    assert len(want) > 100
    want["window_start"] = pd.to_datetime(want["window_start"], utc=True)
    merged = want.merge(
        got,
        on=["window_start", "channel", "auction_mod"],
        suffixes=("_oracle", ""),
        how="outer",
        indicator=True,
    )
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"].head()
    for column in ("bids", "cheap", "bidders", "domains"):
        assert (merged[column] == merged[f"{column}_oracle"]).all(), column
    # Max gives a double: the decimal price * 0.908's nearest
    assert (merged["max_dollars"] == merged["max_dollars_oracle"].astype(float)).all()
    assert (
        merged["key"] == merged.apply(lambda r: f'["{r.channel}",{r.auction_mod}]', axis=1)
    ).all()
    for row in merged.itertuples():
        values = np.sort(np.asarray(row.prices))
        n, q, v = len(values), 0.9, row.p90
        below, upto = (
            np.searchsorted(values, v, "left") / n,
            np.searchsorted(values, v, "right") / n,
        )
        assert below - row.p90_error <= q <= upto + row.p90_error, (row.prices, v)
        counts = pd.Series(row.who).value_counts()
        pairs = [(int(p["value"]), int(p["count"])) for p in row.top]
        assert [c for _, c in pairs] == counts.iloc[:3].tolist()  # the top counts, exact
        assert all(counts[value] == count for value, count in pairs)


def test_sessions_through_kills_equal_their_definition(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    got = run_killed(tmp_path, subprocess_env, SESS, "sess")
    gap = pd.Timedelta(minutes=5)
    want = session_oracle(bids(5000, seed=7), gap, "bidder", "price", ("bids", "spent"))
    assert len(want) > 300
    columns = ["window_start", "window_end", "key", "bids", "spent"]
    pd.testing.assert_frame_equal(
        got[columns].reset_index(drop=True), want[columns], check_dtype=False
    )
