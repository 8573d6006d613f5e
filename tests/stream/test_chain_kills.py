"""A driver running two chained aggregations (`source = {"chained": "counts.py"}`:
Nexmark q5's bids per auction and window, then each window's most bid-on auction)
SIGKILLed in the middle of the upstream's batches, of the downstream's, and at the two
seams between them: after a `--once` drain, both result tables equal pandas' group-bys
of the bids read back — every (window, auction) count once, none late."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from starlette.testclient import TestClient

import riverbed.log
from riverbed.config import Config
from riverbed.inspect import Sources
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results
from riverbed.stream.layout import Checkpoint
from riverbed.ui.app import create_app
from riverbed.ui.console import Console
from tests.stream.crashes import backlogs, kill_mid_batch, newest_batch
from tests.stream.test_acceptance_queries import bids
from tests.stream.test_chained import COUNTS, HOT

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STARTS = 5  # two random kills, two at the seams, then the drain


def send(log_url: str, events: pd.DataFrame) -> None:
    log = riverbed.log.open(log_url)
    if "bids" not in log.topics():
        log.create_topic("bids", 2)
    rows = events.astype({"ts": object}).to_dict("records")
    log.producer("bids").send_batch([{**r, "ts": r["ts"].isoformat()} for r in rows])
    log.close()


def test_chained_aggregations_killed_mid_batch_and_between_them_count_every_window_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    log_url = f"file://{home / 'log'}"
    events = bids(3000, seed=17)
    slices = backlogs(events, STARTS)
    (tmp_path / "counts.py").write_text(COUNTS)
    (tmp_path / "hot.py").write_text(HOT.replace('"aggregation"', '"chained"'))
    checkpoint = Checkpoint(home / "checkpoints" / "hot_items")
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run",
               str(tmp_path / "hot.py"), "--max-records-per-batch", "60", "--ttl", "3"]  # fmt: skip

    # random kills inside the upstream's batches, then inside the downstream's (each
    # runs right after the upstream batch whose rows it reads)
    rng = random.Random(5)
    for k, aimed_at in enumerate([checkpoint.root / "upstream", checkpoint.root]):
        kill_mid_batch(command, env, Checkpoint(aimed_at).batches, kills=1, rng=rng,
                       before_start=lambda _, k=k: send(log_url, slices[k]),
                       logs=tmp_path / "logs")  # fmt: skip
    # and at the seams: an upstream batch committed, its rows not read yet; the
    # downstream's batch planned over them, not run (the failpoints SIGKILL there)
    seams = [("chained:auction_counts:committed", "upstream"), ("chained:hot_items:planned", "")]
    for k, (fault, aimed_at) in enumerate(seams, start=2):
        send(log_url, slices[k])
        target = newest_batch(Checkpoint(checkpoint.root / aimed_at).batches) + 2
        died = subprocess.run(command, env={**env, "RIVERBED_FAULT": f"{fault}:{target}"},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    send(log_url, slices[-1])
    drained = subprocess.run([*command, "--once"], env=env, capture_output=True, text=True)
    assert drained.returncode == 0, drained.stderr[-3000:]

    counts = read_results(checkpoint.root / "upstream-results")
    got = read_results(home / "output" / "hot_items").sort_values("window_start")
    # the oracle: the bids as the log holds them, per auction and 10 minutes
    windows = events.assign(window_start=events["ts"].dt.floor("10min"))
    want_counts = windows.groupby(["window_start", "auction"]).size().rename("bids").reset_index()
    closed = sorted(set(counts["window_start"]))
    assert len(closed) >= 10
    want_counts = want_counts[want_counts["window_start"].isin(closed)]
    each = zip(counts["window_start"], counts["key"].astype(int), counts["bids"], strict=True)
    assert sorted(each) == sorted(want_counts.itertuples(index=False, name=None))
    want = want_counts.groupby("window_start").agg(max_bids=("bids", "max"),
                                                   auctions=("bids", "size"))  # fmt: skip
    assert list(got["window_start"]) == closed
    assert got["max_bids"].tolist() == want["max_bids"].tolist()
    assert got["auctions"].tolist() == want["auctions"].tolist()
    for row in got.itertuples():  # ties: the smallest key among the window's largest
        top = counts[
            (counts["window_start"] == row.window_start) & (counts["bids"] == row.max_bids)
        ]
        assert row.auction == min(top["key"])
    for where in (checkpoint.root, checkpoint.root / "upstream"):
        batches = open_batches(where)
        newest = batches.get(batches.ids()[-1])
        assert newest is not None and newest.done and newest.totals is not None
        assert newest.totals["late"] == 0 and newest.totals["malformed"] == 0
    # `stream status` shows the upstream it runs: its batches, its topic read to the end
    status = subprocess.run([*command[:3], "stream", "status", str(tmp_path / "hot.py"),
                             "--json"], env=env, capture_output=True, text=True)  # fmt: skip
    assert status.returncode == 0, status.stderr[-2000:]
    info = json.loads(status.stdout)
    upstream = info["upstream"]
    assert upstream["aggregation"] == "auction_counts"
    assert upstream["input_records"] == len(events) and upstream["late"] == 0
    assert info["lag"] == upstream["lag"] and sum(info["lag"].values()) == 0
    # the console's ledger names the upstream batches each batch read
    sources = Sources(Config(home=home))
    try:
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            page = client.get("/streams/hot_items").text
            assert "<code>upstream batches " in page
    finally:
        sources.close()
