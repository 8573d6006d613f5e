"""Backfilling a metric added to a running aggregation (stream/backfill.py).

The pure core first: which records are read again, and against which watermark —
every retained offset up to the cut once, against the watermark of the batch that read
it. Then the whole of it, as a user runs it: a spec edited to add metrics, planned, run
with kills during the backfill, equal to a recomputation."""

from __future__ import annotations

import json
import os
import re
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
from riverbed.stream.backfill import FIRST_WATERMARK, deleted_bound, replay, split_pieces
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


@given(st.data())
def test_the_deleted_records_event_times_are_bounded(data: st.DataObject) -> None:
    """Every record retention deleted, of those the batches counted, has an event time
    at or before the bound; None exactly when none was deleted."""
    partitions = data.draw(st.integers(1, 3))
    times: dict[int, list[int]] = {p: [] for p in range(partitions)}  # offset -> time
    planned = []
    newest = 0
    for _ in range(data.draw(st.integers(1, 6))):
        slices = {}
        for p in range(partitions):
            new = data.draw(st.lists(st.integers(0, 10_000), max_size=5))
            slices[str(p)] = [len(times[p]), len(times[p]) + len(new)]
            times[p] += new
            newest = max([newest, *new])
        planned.append((slices, newest))  # the cumulative max, as batch records keep it
    kept = planned[data.draw(st.integers(0, len(planned) - 1)) :]
    cut = {int(p): se[1] for p, se in kept[-1][0].items()}
    first = {p: data.draw(st.integers(0, cut[p])) for p in range(partitions)}
    deleted = [t for p in range(partitions) for t in times[p][: first[p]]]
    bound = deleted_bound(kept, first, cut)
    assert (bound is None) == (not deleted)
    if deleted:
        assert bound is not None and bound >= max(deleted)
        assert bound <= newest


# a scenario: seven `stream run` drivers, three of them killed. Slow, so it runs in a
# scenario group, never beside two others (it did: 52 s at two cores), with the
# scenarios' hang guard — its drivers took 50-100 s each in whole suites under one
# core's worth of CPU (2026-12-06, twice: the default 450 s came during the seventh)
@pytest.mark.spark
@pytest.mark.slow
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
    # six batches of 100 and one without input: the early windows close, leave the state
    done = run()
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
    # values, in rows the backfill rewrote (batch 7, the first after the switch)
    old = before.index.difference(pd.MultiIndex.from_frame(hourly(second).index.to_frame()))
    assert len(old) > 10
    assert after.loc[old, ["events", "spent"]].equals(before.loc[old, ["events", "spent"]])
    assert set(after.loc[old, "batch_id"]) == {7}
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
    following = re.search(r"batches up to \d+ are committed; next is (\d+)", done.stderr)
    assert following, done.stderr[-2000:]
    assert f"batch {following[1]}: 0 records" in done.stderr, done.stderr[-2000:]
    again = query()
    assert (again["top"] == want["top"]).all()
    assert again[["events", "users", "total"]].equals(after[["events", "users", "total"]])


@pytest.mark.spark
def test_a_metric_added_after_retention_says_which_windows_miss_events(
    spark: Any, tmp_path: Path
) -> None:
    """Retention deleted the oldest events before a Sum was added: the windows they
    may have fallen in carry `total_since` (the newest time a deleted event can have),
    their totals count what is left; every window after it equals the oracle, with no
    mark; the metric that was there is untouched; the next start reads the mark back."""
    import dataclasses

    import riverbed.log
    from riverbed.stream import Aggregation, Count, Sum, Tumbling
    from riverbed.stream.backfill import since
    from riverbed.stream.dataframe import read_results
    from tests.stream.test_engine import run_to_end

    url = f"file://{tmp_path / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("events", 3, segment_bytes=2048, retention_ms=86_400_000)
    log.close()
    events = make_events(1500, hours=6)  # in time order: nothing late at 30m
    for at in range(0, 900, 60):  # many small appends: many segments
        write_events(url, events.iloc[at : at + 60])
    spec = Aggregation(
        name="flags",
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="30m",
        metrics={"events": Count()},
        state_partitions=3,
    )
    run_to_end(spark, spec, url, tmp_path, "colocated")
    log = riverbed.log.open(url)
    stamps = {
        (r.partition, r.offset): pd.Timestamp(r.value["ts"])
        for p in range(3)
        for r in log.iter_records("events", p)
    }
    # two days pass for the oldest segments of each partition: retention takes them
    for p in range(3):
        segments = sorted((tmp_path / "log" / "events" / str(p)).glob("*.log"))
        for path in segments[: len(segments) // 2]:
            old = path.stat().st_mtime - 2 * 86_400
            os.utime(path, (old, old))
    assert log.storage.enforce_retention("events") > 0
    first = {o.partition: o.start for o in log.offsets("events")}
    log.close()
    deleted = [t for (p, o), t in stamps.items() if o < first[p]]
    assert deleted and len(deleted) < 900

    write_events(url, events.iloc[900:])
    added = dataclasses.replace(spec, metrics={"events": Count(), "total": Sum("amount")})
    from riverbed.stream.dataframe import start
    from riverbed.stream.doors import Delta, ResultTable, SqlTable
    from riverbed.stream.lakehouse import DeltaSink
    from tests.stream.test_engine import source_for

    sql, lake = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "lake"
    query = start(  # the result table, SQL and Delta: every sink gets the column
        spark,
        added,
        source_for(spark, url, "colocated"),
        checkpoint=tmp_path / "ckpt",
        sinks=[ResultTable(tmp_path / "out"), SqlTable(sql), Delta(lake)],
        log_url=url,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    got = read_results(tmp_path / "out")
    got["window_start"] = pd.to_datetime(got["window_start"], utc=True).dt.as_unit("ns")
    got = got.set_index(["window_start", "key"]).sort_index()
    want = hourly(events).reindex(got.index)
    assert len(got) == len(hourly(events))
    assert (got["events"].to_numpy() == want["events"].to_numpy()).all()  # as counted
    marked = got["total_since"].notna().to_numpy()
    bound = got["total_since"][marked].unique()
    assert len(bound) == 1 and bound[0] >= max(deleted)  # one mark, past every deleted
    starts = got.index.get_level_values("window_start")
    assert (marked == (starts <= bound[0])).all()
    total, oracle = got["total"].to_numpy(), want["total"].to_numpy()
    assert (~marked).sum() > 5 and (total[~marked] == oracle[~marked]).all()  # every event
    assert (total[marked] < oracle[marked]).any()  # the marked ones did miss events
    assert (total[marked] <= oracle[marked]).all()
    held = since(tmp_path / "ckpt", added, (), None)
    assert held == {"total": pd.Timestamp(bound[0]).value // 1_000_000}
    with sqlite3.connect(tmp_path / "r.db") as conn:
        in_sql = pd.read_sql("SELECT * FROM flags", conn)
    for table in (in_sql, DeltaSink(lake).read()):
        assert len(table) == len(got) and table["total_since"].notna().sum() == marked.sum()

    # a fork from a savepoint keeps the mark: its windows say what the original's say
    from riverbed.state import StateConfig
    from riverbed.stream import savepoints

    state = StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "ckpt" / "state")
    saved = savepoints.take(tmp_path / "ckpt", tmp_path / "out", state, "flags", False, "cut")
    assert saved.since == held
    fork = start(
        spark,
        dataclasses.replace(added, name="fork"),
        source_for(spark, url, "colocated"),
        checkpoint=tmp_path / "fork",
        output=tmp_path / "fork-out",
        log_url=url,
        trigger={"availableNow": True},
        from_savepoint=(tmp_path / "ckpt", "cut"),
    )
    fork.awaitTermination(300)
    assert fork.exception() is None, fork.exception()
    forked = read_results(tmp_path / "fork-out")
    assert len(forked) == len(got)
    assert forked["total_since"].notna().sum() == marked.sum()
    assert since(tmp_path / "fork", dataclasses.replace(added, name="fork"), (), None) == held


@pytest.mark.spark
def test_a_metric_added_to_hopping_windows_held_as_panes_is_backfilled(
    spark: Any, tmp_path: Path
) -> None:
    """State of a hopping window holds panes (riverbed.stream.panes) and, for
    ``keep_closed``, the closed windows as emitted: a metric added to it is backfilled
    into both, and the result table and a read of the state give every window and key
    what a recomputation over all events gives."""
    import dataclasses

    import riverbed.log
    from riverbed.state import StateConfig
    from riverbed.stream import Aggregation, Count, Hopping, Sum
    from riverbed.stream.dataframe import read_live
    from riverbed.stream.layout import Checkpoint, state_root
    from tests.stream.test_engine import oracle, run_to_end

    url = f"file://{tmp_path / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("events", 3)
    log.close()
    events = make_events(1500, hours=6)  # in time order: nothing late at 30m
    write_events(url, events.iloc[:900])
    window = Hopping("2h", "30m")
    spec = Aggregation(
        name="hops", key="flag", time="ts", window=window, watermark="30m",
        keep_closed="3h", metrics={"events": Count()}, state_partitions=3,
    )  # fmt: skip
    run_to_end(spark, spec, url, tmp_path, "colocated")
    write_events(url, events.iloc[900:])
    added = dataclasses.replace(spec, metrics={"events": Count(), "total": Sum("amount")})
    got = run_to_end(spark, added, url, tmp_path, "colocated")
    want = oracle(events, window)[["window_start", "key", "events", "total"]]
    keys = ["window_start", "key"]
    got["window_start"] = pd.to_datetime(got["window_start"], utc=True).dt.as_unit("ns")
    want["window_start"] = want["window_start"].dt.as_unit("ns")
    got = got[want.columns].sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.sort_values(keys).reset_index(drop=True))
    # the state: the open windows (from panes) and the closed ones kept (3h)
    checkpoint = tmp_path / "ckpt"
    state = StateConfig(
        local_dir=Checkpoint(checkpoint).local_state, durable=state_root(checkpoint)
    )
    live = read_live(added, state, checkpoint=checkpoint)
    live["window_start"] = pd.to_datetime(live["window_start"], utc=True).dt.as_unit("ns")
    assert len(live) > 10 and live["window_start"].nunique() > 4  # closed ones too
    merged = live.merge(got, on=keys, suffixes=("", "_table"), validate="1:1")
    assert len(merged) == len(live)
    assert (merged["events"] == merged["events_table"]).all()
    assert (merged["total"] == merged["total_table"]).all()
