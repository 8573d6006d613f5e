"""A driver running a Select (`riverbed stream run select.py`) SIGKILLed in the middle of
batches again and again while its topic is written to: after a final `--once` drain, the
rows — in its output and in its topic — are the events the filter keeps, projected,
every row once (an independent recomputation in Python's decimals and regexes), and
`riverbed query` / `stream status` read them."""

from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
from starlette.testclient import TestClient

import riverbed.log
from riverbed.config import Config
from riverbed.inspect import Sources
from riverbed.inspect import join as inspect_join
from riverbed.stream.joinquery import read_joined
from riverbed.stream.layout import Checkpoint
from riverbed.ui.app import create_app
from riverbed.ui.console import Console
from tests.stream.crashes import stream_run_killed_then_drained
from tests.stream.test_select import BIDS, bids, send

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = f"""
from riverbed.stream import Select

select = Select(
    name="picked",
    source={{"topic": "bids", "schema": "{BIDS}"}},
    where="price > 100 AND channel <> 'spam'",
    columns={{"auction": "auction", "dollars": "price * 0.908",
              "domain": "regexp_extract(url, '^https?://([^/]+)', 1)",
              "dir1": "get(split(url, '/'), 3)"}},
    topic="picked_rows", key="auction", partitions=2,
)
"""
KILLS = 4
DOMAIN = re.compile(r"^https?://([^/]+)")


def oracle(events: pd.DataFrame) -> list[tuple[object, ...]]:
    """The Select, recomputed row by row: Python's decimals and regexes."""
    rows = []
    for e in events.itertuples(index=False):
        if pd.isna(e.price) or e.channel is None or not (e.price > 100 and e.channel != "spam"):
            continue
        url = e.url
        found = DOMAIN.search(url) if url is not None else None
        domain = None if url is None else (found.group(1) if found else "")
        parts = url.split("/") if url is not None else []
        rows.append(
            (int(e.auction), Decimal(int(e.price)) * Decimal("0.908"), domain,
             parts[3] if len(parts) > 3 else None)
        )  # fmt: skip
    return sorted(rows, key=lambda r: r[0])


def test_a_select_killed_mid_batch_gives_every_row_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    log_url = f"file://{home / 'log'}"
    events = bids(1500, seed=21).assign(tag=None)
    bounds = [len(events) * i // (KILLS + 1) for i in range(KILLS + 2)]

    def release(k: int) -> None:
        send(log_url, "bids", events.iloc[bounds[k] : bounds[k + 1]])

    spec = tmp_path / "select.py"
    spec.write_text(SPEC)
    command, finished = stream_run_killed_then_drained(
        spec, env, Checkpoint(home / "checkpoints" / "picked").batches, records=60,
        kills=KILLS, seed=13, release=release, logs=tmp_path / "logs",
    )  # fmt: skip
    assert "rows" in finished.stderr and "running select" in finished.stderr

    want = oracle(events)
    got = read_joined(home / "output" / "picked")
    assert list(got.columns) == ["auction", "dollars", "domain", "dir1", "batch_id"]
    mine = sorted(
        (tuple(None if pd.isna(v) else v for v in r) for r in
         got[["auction", "dollars", "domain", "dir1"]].itertuples(index=False)),
        key=lambda r: r[0],
    )  # fmt: skip
    assert mine == want and len(want) > 500  # every row once, through four kills
    log = riverbed.log.open(log_url)
    try:  # the topic: the same rows, each once (a re-run batch wrote none twice)
        held = [log.read("picked_rows", p, 0, 10**6) for p in range(2)]
        published = [r.value["auction"] for records in held for r in records]
    finally:
        log.close()
    assert sorted(published) == [r[0] for r in want]

    shown = subprocess.run([*command[:3], "query", "picked", "--json"], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert sorted(json.loads(line)["auction"] for line in shown.stdout.splitlines()) == [
        r[0] for r in want
    ]
    status = subprocess.run([*command[:3], "stream", "status", str(spec), "--json"], env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert status.returncode == 0, status.stderr[-2000:]
    said = json.loads(status.stdout)
    assert said["joined"] == len(want) and said["input_records"] == len(events)
    assert said["sides"]["left"]["lag"] == 0 and said["watermark"] is None
    text = subprocess.run([*command[:3], "stream", "status", str(spec)], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert text.returncode == 0, text.stderr[-2000:]
    assert f"rows: {len(want)}" in text.stdout and "select: picked" in text.stdout
    assert "source: topic" in text.stdout and "lag 0 records" in text.stdout
    words = set(text.stdout.replace(":", " ").split())
    assert not {"joined", "unmatched", "watermark", "held"} & words

    # the console's page of it, from its checkpoint alone: a Select, its columns
    sources = Sources(Config(home=home))
    try:
        shown = inspect_join(sources, "picked")
        assert shown["select"]["dollars"] == "price * 0.908" and shown["joined"] == len(want)
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            page = client.get("/streams/picked").text
            assert "<h1>Select picked</h1>" in page and "no state (a Select)" in page
            assert "<code>dollars = price * 0.908</code>" in page and "rb__" not in page
            assert "one for each event kept" in page and "left side: where" not in page
            listing = client.get("/streams").text
            assert 'href="/streams/picked"' in listing and "<h2>Selects</h2>" in listing
            assert "<h2>Joins</h2>" not in listing  # (a Select is none)
    finally:
        sources.close()
