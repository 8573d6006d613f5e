"""`riverbed stream run` with a results topic, and `riverbed query` from the result table
and live from state, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.log
from riverbed.cli.main import main
from tests.stream.conftest import make_events, write_events

pytestmark = pytest.mark.spark

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)
"""


def test_run_query_results_and_live_state(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    write_events(f"file://{home / 'log'}", make_events(900, hours=2), partitions=3)
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC)
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once"]
    run = subprocess.run(
        [*command, "--max-records-per-batch", "300", "--topic", "flags.results"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "batch 2: 300 records, 0 late, 0 malformed" in run.stderr
    # not a terminal: plain progress lines through the backlog, the last one at 100 %
    assert "backlog: 900 of 900 records (100 %)" in run.stderr

    monkeypatch.setenv("RIVERBED_HOME", str(home))
    assert main(["query", "flags", "--json"]) == 0
    table = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["events"] for r in table) == 900
    assert main(["query", str(spec), "--from-state", "--json"]) == 0
    live = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["key"], r["users"]) for r in live] == [(r["key"], r["users"]) for r in table]
    assert main(["query", str(spec), "--from-state", "--batch", "0", "--json"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["events"] for r in first) == 300

    log = riverbed.log.open(f"file://{home / 'log'}")
    published = [r.value for p in range(3) for r in log.read("flags.results", p, 0, 10_000)]
    assert {r["batch_id"] for r in published} == {0, 1, 2}

    assert main(["stream", "status", str(spec), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    # three batches of 300, then one without input: the watermark the last ones set
    assert (status["batches"], status["input_records"], status["late"]) == (4, 900, 0)
    assert set(status["lag"].values()) == {0} and status["state_bytes"] > 0
    assert set(status["last_batch_ms"]) == {"offsets", "state_job", "outputs"}
    assert status["input_rate"] > 0
    assert main(["stream", "status", str(spec)]) == 0
    assert "last batch: offsets" in capsys.readouterr().out
    assert main(["stream", "status", "flags", "--json"]) == 0  # by name, as the console shows
    by_name = json.loads(capsys.readouterr().out)
    assert by_name["batches"] == 4 and by_name["driver"] == {
        "active": None,
        "standbys": 0,
        "since": None,
    }
    # the console's view of the same run: a ledger of offsets read, live values, metrics
    _console_shows_the_run(home, live)

    # mistakes are named, with the fix
    assert main(["query", "flags", "--from-state"]) == 1
    assert "pass its spec file" in capsys.readouterr().err
    assert main(["query", "flags", "--batch", "1"]) == 1
    assert "add --from-state" in capsys.readouterr().err

    # damaged state: one line that names the file and the recovery, no trace
    changelogs = sorted((home / "checkpoints" / "state" / "flags").glob("*/changelog/*.rbcl"))
    damaged = changelogs[-1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x5A
    damaged.write_bytes(bytes(data))
    assert main(["query", str(spec), "--from-state"]) == 1
    err = capsys.readouterr().err
    assert damaged.name in err and "riverbed state verify" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 4


def _console_shows_the_run(home: Path, live: list[dict[str, object]]) -> None:
    from starlette.testclient import TestClient

    from riverbed.config import Config
    from riverbed.inspect import Sources
    from riverbed.ui.app import create_app
    from riverbed.ui.console import Console

    sources = Sources(Config(home=home))
    with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
        s = client.get("/api/streams/flags").json()
        assert [b["batch"] for b in s["ledger"]] == [3, 2, 1, 0]  # 3: the no-data batch
        assert [b["state_version"] for b in s["ledger"]] == [4, 3, 2, 1]
        read = sum(end - start for b in s["ledger"] for start, end in b["offsets"].values())
        assert read == 900 and [b["input"] for b in s["ledger"]] == [0, 300, 300, 300]
        assert s["watermark_gap_s"] > 0 and s["term"] is not None
        values = client.get("/api/streams/flags/live").json()
        assert values["metrics"] == ["users", "events"] and values["error_bands"] == {}
        got = [(r["key"], r["users"]) for r in values["rows"]]
        assert got == [(r["key"], r["users"]) for r in live]
        as_of_0 = client.get("/api/streams/flags/live?batch=0").json()["rows"]
        assert sum(r["events"] for r in as_of_0) == 300
        metrics = client.get("/metrics").text
        assert 'riverbed_stream_input_records{stream="flags"} 900' in metrics
        assert 'riverbed_stream_driver_active{stream="flags"} 0' in metrics
        assert 'riverbed_stream_batch_duration_seconds{phase="state_job",stream="flags"}' in metrics
        page = client.get("/streams/flags").text
        assert "stopped" in page and 'data-live="/api/streams/flags/live"' in page
    sources.close()


def test_a_damaged_topic_stops_stream_run_with_one_line_and_a_skip_gets_it_moving(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The operator's path of docs/log.md through the Spark source: a batch damaged in
    the middle of a partition stops `stream run` with one line naming it and the skip
    command; after the skip, the run finishes and only the damaged batch is missing."""
    from riverbed.stream.dataframe import read_results
    from tests.cli import assert_quiet, run_cli
    from tests.log.test_corruption import flip, frames

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    env.pop("RIVERBED_CONTROL", None)
    events = make_events(900, hours=2, seed=5)
    for part in range(3):  # three batches per partition
        write_events(f"file://{home / 'log'}", events.iloc[part * 300 : (part + 1) * 300])
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC)
    segment = home / "log" / "events" / "1" / f"{0:020d}.log"
    pos, size, base, count = frames(segment)[1]
    log = riverbed.log.open(f"file://{home / 'log'}")
    lost = [r.value for r in log.read("events", 1, base, count)]
    log.close()
    flip(segment, list(range(pos + size // 2, pos + size // 2 + 20)))

    run = run_cli("stream", "run", str(spec), "--once", env=env, timeout=300)
    assert run.returncode == 1
    assert_quiet(run.stderr)
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert "events/1 is damaged" in line and f"offsets {base}..{base + count - 1}" in line
    assert f"riverbed topic skip events 1 {base} {base + count}" in line
    skip = run_cli(
        "topic", "skip", "events", "1", str(base), str(base + count), "--reason", "test", env=env
    )
    assert skip.returncode == 0, skip.stderr
    run = run_cli("stream", "run", str(spec), "--once", env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert_quiet(run.stderr)

    gone = Counter((v["user_id"], v["ts"]) for v in lost)  # the damaged batch's events
    keep = []
    for user, ts in zip(events["user_id"], events["ts"], strict=True):
        key = (int(user), ts.isoformat())
        keep.append(gone[key] == 0)
        gone[key] = max(0, gone[key] - 1)
    kept = events[keep]
    assert len(kept) == len(events) - count
    want = (
        kept.assign(window_start=kept["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    got = read_results(home / "output" / "flags")
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    assert (merged["users"] == merged["users_oracle"]).all()


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.floats(0, 1e6))
def test_a_backlog_line_never_runs_past_its_end(total: int, done: int, elapsed: float) -> None:
    from riverbed.stream.specjob import backlog_line

    line = backlog_line(total, done, elapsed)
    share = int(line.split("(")[1].split(" %")[0])
    assert 0 <= share <= 100 and f"of {total:,} records" in line
    assert ("left" in line) == (elapsed > 0 and 0 < done < total)


def test_a_backlog_line_says_the_rate_and_the_time_left() -> None:
    from riverbed.stream.specjob import backlog_line

    assert backlog_line(10_000, 2_500, 5.0) == (
        "backlog: 2,500 of 10,000 records (25 %), 500 records/s, about 15 s left"
    )
    assert backlog_line(10_000, 100, 10.0).endswith("about 16 min left")
    assert (
        backlog_line(10_000, 10_000, 20.0)
        == "backlog: 10,000 of 10,000 records (100 %), 500 records/s"
    )


def test_a_batch_line_says_what_a_no_data_batch_was_for() -> None:
    from riverbed.stream.batchlog import BatchRecord
    from riverbed.stream.specjob import batch_line

    busy = BatchRecord(input=300, late=2, watermark_ms=1_000, ms={"state_job": 100})
    assert batch_line(4, busy) == "batch 4: 300 records, 2 late, 0 malformed, 3,000 records/s"
    idle = BatchRecord(watermark_ms=7_200_000, previous_watermark_ms=3_600_000,
                       ms={"state_job": 20})  # fmt: skip
    assert batch_line(5, idle) == (
        "batch 5: 0 records, 0 late, 0 malformed — the watermark moved to "
        "1970-01-01T02:00:00Z: windows before it close"
    )
    # nothing read and the watermark where it was (a backfill's rows): no rate of nothing
    assert batch_line(6, BatchRecord(watermark_ms=5, previous_watermark_ms=5, ms={"x": 3})) == (
        "batch 6: 0 records, 0 late, 0 malformed"
    )


LOOKUP_SPEC = """
from riverbed.stream import Aggregation, Count, Lookup, Sum, Tumbling

source = {"topic": "clicks", "schema": "campaign long, ts timestamp"}
aggregation = Aggregation(
    name="by_owner", key="owner", time="ts", window=Tumbling("1h"), watermark="10m",
    lookups=[Lookup("{table}", on=("campaign", "id"), how="inner", parts=4)],
    metrics={"clicks": Count(), "budget": Sum("budget")},
)
"""


def test_a_lookup_table_in_parts_from_a_spec_file(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """As a user runs it: a spec whose lookup table is held in parts, `stream run
    --once`, `query` (each owner's clicks as pandas counts them), `stream status`
    (the version joined with, and that it is in parts)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    table = tmp_path / "campaigns.parquet"
    ids = list(range(1, 501))
    pq.write_table(pa.table({"id": ids, "owner": [f"team{i % 7}" for i in ids],
                             "budget": [float(i % 10) for i in ids]}), table)  # fmt: skip
    clicks = pd.DataFrame({"campaign": [(i * 37) % 600 for i in range(1200)],
                           "ts": pd.Timestamp("2026-12-06T01:00:00Z")
                           + pd.to_timedelta(range(1200), unit="s")})  # fmt: skip
    log = riverbed.log.open(f"file://{home / 'log'}")
    log.create_topic("clicks", 4)
    log.producer("clicks").send_batch(
        [{"campaign": int(c), "ts": t.isoformat()} for c, t in clicks.itertuples(index=False)],
        key_field="campaign",
    )
    log.close()
    spec = tmp_path / "by_owner.py"
    spec.write_text(LOOKUP_SPEC.replace("{table}", str(table)))
    cli = [sys.executable, "-m", "riverbed.cli.main"]

    def run(*args: str) -> str:
        done = subprocess.run([*cli, *args], env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    run("stream", "run", str(spec), "--once")
    got = {
        r["key"]: r["clicks"]
        for r in map(json.loads, run("query", "by_owner", "--json").splitlines())
    }
    kept = clicks[clicks["campaign"].between(1, 500)]
    assert got == dict(Counter(f"team{c % 7}" for c in kept["campaign"]))
    status = run("stream", "status", str(spec))
    assert "(in 4 parts)" in status and f"unmatched: {len(clicks) - len(kept)}" in status
