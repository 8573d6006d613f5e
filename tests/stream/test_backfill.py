"""Backfilling a metric added to a running aggregation (stream/backfill.py).

The pure core first: which records are read again, and against which watermark —
every retained offset up to the cut once, against the watermark of the batch that read
it. Then the whole of it, as a user runs it: a spec edited to add metrics, planned, run
with kills during the backfill, equal to a recomputation."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.cli.main import main
from riverbed.stream.backfill import FIRST_WATERMARK, replay, split_pieces
from tests.stream.conftest import hourly, make_events, write_events


@st.composite
def histories(draw: st.DrawFn) -> Any:
    """Batches that read consecutive slices of each partition (the oldest records
    pruned, some records read before any retained one), each with a rising watermark;
    retention's first offset per partition."""
    partitions = draw(st.integers(1, 4))
    head = {p: draw(st.integers(0, 20)) for p in range(partitions)}
    ends = dict(head)
    planned = []
    watermark = 0
    for _ in range(draw(st.integers(0, 6))):
        slices = {}
        for p in range(partitions):
            n = draw(st.integers(0, 30))
            slices[str(p)] = [ends[p], ends[p] + n]
            ends[p] += n
        watermark += draw(st.integers(0, 100))
        planned.append((slices, watermark))
    kept = planned[draw(st.integers(0, len(planned))) :]
    first = {p: draw(st.integers(0, ends[p])) for p in range(partitions)}
    return kept, first, ends


@given(histories())
def test_every_retained_offset_is_read_once_against_its_batch_watermark(history: Any) -> None:
    kept, first, cut = history
    pieces = replay(kept, first, cut)
    read: dict[tuple[int, int], int] = {}
    for piece in pieces:
        assert piece.start < piece.end
        for offset in range(piece.start, piece.end):
            assert (piece.partition, offset) not in read  # once
            read[(piece.partition, offset)] = piece.watermark_ms
    assert set(read) == {(p, o) for p in cut for o in range(first[p], cut[p])}
    for (p, o), watermark in read.items():
        batch = [wm for slices, wm in kept if slices[str(p)][0] <= o < slices[str(p)][1]]
        assert watermark == (batch[0] if batch else FIRST_WATERMARK)
    # cut into tasks: the same offsets, the same watermarks
    split = split_pieces(pieces, 7)
    assert all(s.end - s.start <= 7 for s in split)
    assert {(s.partition, o): s.watermark_ms for s in split for o in range(s.start, s.end)} == read


SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="30m",
    metrics={{{metrics}}}, state_partitions={partitions},
)
"""
BEFORE = '"events": Count(), "spent": Sum("amount")'
ADDED = BEFORE + ', "users": Distinct("user_id"), "total": Sum("amount")'


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


@pytest.mark.spark
def test_metrics_added_to_a_running_aggregation_are_backfilled_through_kills(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user adds an exact Distinct and a Sum to a running aggregation's spec file and
    takes its state from 3 partitions to 5: `stream plan` says so and writes nothing;
    `stream run`, SIGKILLed once the backfill is read, during the repartition, and
    right after the switch, then run again, gives every window and key what a
    recomputation over all events gives — in the result table, SQL, Delta and Iceberg —
    and the metrics that were there keep their values."""
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    monkeypatch.setenv("RIVERBED_HOME", str(home))
    events = make_events(1200, hours=6)  # in time order: nothing late at a 30m watermark
    first, second = events.iloc[:600], events.iloc[600:]
    log = f"file://{home / 'log'}"
    spec = tmp_path / "flags.py"
    sql, delta = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "lake"
    iceberg = f"sqlite:///{tmp_path / 'cat.db'}"
    sinks = ["--sql", sql, "--table", f"delta:{delta}", "--table", f"iceberg:{iceberg}#s.flags"]
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once"]

    def run(fault: str | None = None) -> subprocess.CompletedProcess[str]:
        with_fault = {**env, "RIVERBED_FAULT": fault} if fault else env
        return subprocess.run(
            # a killed driver's lease ends 3 s after its last renewal, not 10
            [*command, "--max-records", "100", "--ttl", "3", *sinks],
            env=with_fault,
            capture_output=True,
            text=True,
            check=False,
        )

    def query() -> pd.DataFrame:
        assert main(["query", "flags", "--json"]) == 0
        rows = pd.DataFrame([json.loads(x) for x in capsys.readouterr().out.splitlines()])
        rows["window_start"] = pd.to_datetime(rows["window_start"], utc=True).dt.as_unit("ns")
        return rows.set_index(["window_start", "key"]).sort_index()

    write_events(log, first, partitions=3)
    spec.write_text(SPEC.format(metrics=BEFORE, partitions=3))
    done = run()  # six batches of 100: the early windows close and leave the state
    assert done.returncode == 0, done.stderr[-2000:]
    before = query()

    spec.write_text(SPEC.format(metrics=ADDED, partitions=5))
    untouched = _files(home / "checkpoints")
    assert main(["stream", "plan", str(spec)]) == 0
    said = capsys.readouterr().out
    assert "backfill  metric 'users': (none) → Distinct(column='user_id'" in said, said
    assert "backfill  metric 'total': (none) → Sum(column='amount')" in said
    assert "applied   state partitions: 3 → 5" in said
    assert "backfill  reads 600 records (partition: offsets 0: 0.." in said
    assert main(["stream", "plan", str(spec), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["runs"] and planned["backfill"]["records"] == 600
    assert planned["backfill"]["gone"] == 0
    assert _files(home / "checkpoints") == untouched  # plan writes nothing

    write_events(log, second, partitions=3)
    for fault in ("kill_in_move:read", "kill_in_move:2", "kill_in_move:done"):
        killed = run(fault)
        assert killed.returncode == -signal.SIGKILL, (fault, killed.stderr[-2000:])
    assert main(["stream", "plan", str(spec)]) == 0  # the switch was made: nothing to do
    assert "nothing changed" in capsys.readouterr().out
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]

    after = query()
    want = hourly(events)
    assert list(after.index) == list(want.index)
    for column in ("events", "spent", "users", "total"):
        assert (after[column] == want[column]).all(), column
    assert after["users_is_exact"].all()
    # the metrics that were there: the windows the new events did not reach kept their
    # values, in rows the backfill rewrote (batch 6, the first after the switch)
    old = before.index.difference(pd.MultiIndex.from_frame(hourly(second).index.to_frame()))
    assert len(old) > 10
    assert after.loc[old, ["events", "spent"]].equals(before.loc[old, ["events", "spent"]])
    assert set(after.loc[old, "batch_id"]) == {6}
    assert main(["stream", "status", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"]["partitions"] == 5

    # every sink holds the result table's rows, the added columns included
    from riverbed.stream.lakehouse import DeltaSink, IcebergSink

    with sqlite3.connect(tmp_path / "r.db") as conn:
        in_sql = pd.read_sql("SELECT * FROM flags", conn)
    for name, table in [
        ("sql", in_sql),
        ("delta", DeltaSink(delta).read()),
        ("iceberg", IcebergSink(iceberg, "s.flags").read()),
    ]:
        table["window_start"] = pd.to_datetime(table["window_start"], utc=True).dt.as_unit("ns")
        table = table.set_index(["window_start", "key"]).sort_index()
        columns = ["events", "spent", "users", "total"]
        pd.testing.assert_frame_equal(
            table[columns].astype(float), after[columns].astype(float), obj=name
        )

    # one more added with no new events: the first batch after it runs anyway, to write
    # the rows the backfill rewrote
    spec.write_text(SPEC.format(metrics=ADDED + ', "top": Max("amount")', partitions=5))
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "batch 12: 0 records" in done.stderr, done.stderr[-2000:]
    again = query()
    assert (again["top"] == want["top"]).all()
    assert again[["events", "users", "total"]].equals(after[["events", "users", "total"]])
