"""Rescaling a running aggregation's state (stream/rescale.py): the routing core as
properties, then 3 → 5 → 2 partitions through every path, results equal to the oracle."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.cli.main import main
from riverbed.state.keys import session_end_key, session_key, window_key
from riverbed.stream import Aggregation, Count, Distinct, Session, Sum, Tumbling
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.engine import state_partition_of
from riverbed.stream.rescale import generations, key_bytes, partition_of
from tests.stream.conftest import hourly, make_events, write_events
from tests.stream.test_cli import SPEC
from tests.stream.test_engine import run_to_end, source_for

keys = st.text(min_size=1, max_size=20)


@given(keys, st.integers(1, 64))
def test_an_entry_goes_where_the_engine_places_its_key(key: str, n: int) -> None:
    assert partition_of(key.encode(), n) == state_partition_of(pd.Series([key]), n)[0]


@given(keys, st.integers(0, 2**40), st.integers(0, 2**40))
def test_the_key_is_found_in_every_kind_of_state_key(key: str, start: int, end: int) -> None:
    k = key.encode()
    assert key_bytes(window_key(start, k), sessions=False) == k
    assert key_bytes(session_key(k), sessions=True) == k
    assert key_bytes(session_end_key(end, start, k), sessions=True) == k


def _oracle(events: pd.DataFrame) -> pd.DataFrame:
    return hourly(events)[["events", "users", "total"]].reset_index()


# hourly events, exact users and totals per flag: what the rescale tests aggregate
FLAGS = Aggregation(
    name="flags",
    key="flag",
    time="ts",
    window=Tumbling("1h"),
    watermark="10h",
    metrics={"events": Count(), "users": Distinct("user_id"), "total": Sum("amount")},
    state_partitions=3,
)


def _equals_oracle(
    got: pd.DataFrame, events: pd.DataFrame, columns: tuple[str, ...] = ("events", "users", "total")
) -> None:
    """Every window and key of ``got`` (result rows) has the oracle's ``columns``, and
    there are no others."""
    want = _oracle(events)
    merged = got.merge(want, on=["window_start", "key"], suffixes=("", "_o"), how="outer")
    assert len(merged) == len(want) == len(got)
    for column in columns:
        assert (merged[column] == merged[f"{column}_o"]).all(), column


def _run(spark: Any, spec: Aggregation, url: str, root: Path, path: str) -> pd.DataFrame:
    """``spec`` over what the topic holds; the batches this run planned are co-located
    exactly when the log-native path reads a topic of as many partitions (3)."""
    before = set(open_batches(str(root / "ckpt")).ids())
    query = start(
        spark,
        spec,
        source_for(spark, url, path),
        checkpoint=root / "ckpt",
        output=root / "out",
        log_url=url,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    if path != "spark":
        batches = open_batches(str(root / "ckpt"))
        plans = {batches.get(b).co_located for b in set(batches.ids()) - before}
        assert plans == {path == "colocated" and spec.state_partitions == 3}, plans
    return read_results(root / "out")


@pytest.mark.spark
@pytest.mark.parametrize("path", ["spark", "colocated", "shuffled"])
def test_rescaling_3_to_5_to_2_equals_the_oracle(
    spark: Any, log_url: str, tmp_path: Path, path: str
) -> None:
    """Three runs over three parts of the events, each with another partition count;
    the state moves at each start and the results equal one computation over all."""
    events = make_events(2400, hours=4)
    parts = np.array_split(np.arange(len(events)), 3)
    spec = FLAGS
    for part, count in zip(parts, [3, 5, 2], strict=True):
        write_events(log_url, events.iloc[part])
        got = _run(
            spark, dataclasses.replace(spec, state_partitions=count), log_url, tmp_path, path
        )
    _equals_oracle(got, events)
    gens = generations(tmp_path / "ckpt", 3)
    assert [(g.number, g.partitions) for g in gens] == [(0, 3), (1, 5), (2, 2)]
    state = tmp_path / "ckpt" / "state"
    for g in gens:  # every generation's state is where its namespace says
        held = sorted(p.name for p in (state / g.namespace("flags")).iterdir())
        assert held == [str(p) for p in range(g.partitions)], (g, held)
    ckpt = tmp_path / "ckpt" / "riverbed"
    record = json.loads((ckpt / "generations" / "000002.json").read_text())
    assert record["was"]["state_partitions"] == 5 and record["from_version"] == gens[2].from_version


@pytest.mark.spark
def test_rescaling_sessions(spark: Any, log_url: str, tmp_path: Path) -> None:
    events = make_events(1500, hours=3)
    half = len(events) // 2
    spec = Aggregation(
        name="sess",
        key="flag",
        time="ts",
        window=Session("5m"),
        watermark="10h",
        metrics={"events": Count()},
        state_partitions=3,
    )
    write_events(log_url, events.iloc[:half])
    run_to_end(spark, spec, log_url, tmp_path, "shuffled")
    write_events(log_url, events.iloc[half:])
    got = run_to_end(
        spark, dataclasses.replace(spec, state_partitions=4), log_url, tmp_path, "shuffled"
    )
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    want = run_to_end(
        spark, dataclasses.replace(spec, state_partitions=4), log_url, fresh, "shuffled"
    )
    cols = ["window_start", "window_end", "key", "events"]
    a = got[cols].sort_values(cols).reset_index(drop=True)
    b = want[cols].sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def _send(producer: Any, events: pd.DataFrame) -> None:
    producer.send_batch(
        [
            {"user_id": int(u), "flag": f, "amount": a, "ts": t.isoformat()}
            for u, f, a, t in events[["user_id", "flag", "amount", "ts"]].itertuples(index=False)
        ],
        key_field="flag",
    )


@pytest.mark.spark
@pytest.mark.parametrize("where", ["driver", "spark-job"])
def test_a_topic_altered_3_to_5_and_the_aggregation_follows(
    spark: Any,
    log_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """`topic alter --partitions 5` under a co-located aggregation of 3: the next run
    with 5 state partitions reads what was placed by 3 through the shuffle (its batch
    ends where the placement changes), is co-located again from there, and a producer
    that placed records by 3 after the alter (it had not seen it yet) costs its batches
    the co-location, never a result — whether its tasks ran in the driver or as a Spark
    job (whose failure reaches the driver as text). Every window equals the oracle."""
    import riverbed.log
    import riverbed.log.log as log_module

    events = make_events(3000, hours=4, seed=5)
    first, before, stale, after = np.array_split(np.arange(len(events)), [900, 1300, 1700])
    spec = FLAGS
    write_events(log_url, events.iloc[first])
    _run(spark, spec, log_url, tmp_path, "colocated")
    log = riverbed.log.open(log_url)
    monkeypatch.setattr(log_module, "REFRESH_S", 3600.0)  # a producer that never looks
    old = log.producer("events")
    _send(old, events.iloc[before])  # placed by 3, read by nobody yet
    config = log.alter_partitions("events", 5)
    (epoch,) = config.epochs
    _send(old, events.iloc[stale])  # still placed by 3: past the boundary
    stale_ends = [o.end for o in log.offsets("events")]
    _send(log.producer("events"), events.iloc[after])  # placed by 5
    log.close()
    assert all(stale_ends[p] > epoch.starts[p] for p in range(3))

    from riverbed.stream.specrecord import plan_start

    starts = " ".join(f"{p}:{o}" for p, o in enumerate(epoch.starts))
    options = source_for(spark, log_url, "colocated")
    said = plan_start(tmp_path / "ckpt", spec, options).text()  # still 3: it says how
    assert "batches shuffle partials; with state_partitions=5 they can be co-located" in said
    said = plan_start(tmp_path / "ckpt", dataclasses.replace(spec, state_partitions=5), options)
    assert "state partitions: 3 → 5" in said.text()
    assert f"can be co-located from offsets {starts} on" in said.text(), said.text()
    begun = set(open_batches(str(tmp_path / "ckpt")).ids())
    query = start(
        spark,
        dataclasses.replace(spec, state_partitions=5),
        source_for(spark, log_url, "colocated", max_records=300)
        | {"driverBatchRecords": "1000000" if where == "driver" else "0"},
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        log_url=log_url,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    batches = open_batches(str(tmp_path / "ckpt"))
    records = [batches.get(b) for b in sorted(set(batches.ids()) - begun)]
    slices = [{int(p): se for p, se in r.slices.items()} for r in records]
    # the batches before the boundary end exactly on it, and go through the shuffle
    ended = [i for i, sl in enumerate(slices) if all(sl[p][1] == epoch.starts[p] for p in range(3))]
    assert ended and all(not records[i].co_located for i in range(ended[0] + 1))
    for record, sl in zip(records, slices, strict=True):
        holds_stale = any(sl[p][0] < stale_ends[p] and sl[p][1] > epoch.starts[p] for p in range(3))
        if holds_stale:  # planned co-located, run shuffled, and recorded so
            assert not record.co_located
    assert any(r.co_located for r in records)  # the new placement, co-located again
    assert "running the batch shuffled" in caplog.text
    got = read_results(tmp_path / "out")
    _equals_oracle(got, events)


@pytest.mark.spark
def test_a_running_aggregation_reads_the_partitions_an_alter_adds(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """The driver keeps running through `topic alter`: its next batch reads the new
    partitions (shuffled: 5 log partitions, 3 state partitions)."""
    import riverbed.log

    events = make_events(1200, hours=3, seed=7)
    half = len(events) // 2
    spec = FLAGS
    write_events(log_url, events.iloc[:half])
    query = start(
        spark,
        spec,
        source_for(spark, log_url, "colocated"),
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        log_url=log_url,
        trigger={"processingTime": "0.2 seconds"},
    )
    try:
        query.processAllAvailable()
        log = riverbed.log.open(log_url)
        log.alter_partitions("events", 5)
        _send(log.producer("events"), events.iloc[half:])
        assert sum(o.end for o in log.offsets("events")[3:]) > 0
        log.close()
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    batches = open_batches(str(tmp_path / "ckpt"))
    newest = batches.get(batches.ids()[-1])
    assert set(newest.slices) == {"0", "1", "2", "3", "4"} and not newest.co_located
    got = read_results(tmp_path / "out")
    _equals_oracle(got, events)


def _cli_spec(path: Path, partitions: int) -> None:
    path.write_text(SPEC.replace("state_partitions=3", f"state_partitions={partitions}"))


@pytest.mark.spark
@pytest.mark.parametrize("place", ["directory", "bucket"])
def test_a_rescale_killed_at_any_moment_of_the_move_is_exactly_once(
    place: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`stream run` after `state_partitions` 3 → 5 → 2, SIGKILLed while the state
    moves (after some new partitions, and before the switch), then run again: every
    window equals the oracle over all events, and the plan said what happened."""
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    where: list[str] = []
    if place == "bucket":
        s3_url = request.getfixturevalue("s3_url")
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
        where = ["--checkpoints", f"{s3_url}/ck"]
    monkeypatch.setenv("RIVERBED_HOME", str(home))
    for k, v in env.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    events = make_events(1200, hours=3)
    thirds = np.array_split(np.arange(len(events)), 3)
    log = f"file://{home / 'log'}"
    spec = tmp_path / "flags.py"
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once"]

    def run(fault: str | None = None, verbose: bool = False) -> subprocess.CompletedProcess[str]:
        with_fault = {**env, "RIVERBED_FAULT": fault} if fault else env
        said = [*command[:3], "-v", *command[3:]] if verbose else command  # the move's line
        return subprocess.run(  # a killed driver's lease ends 3 s after its last renewal
            [*said, "--ttl", "3", *where],
            env=with_fault,
            capture_output=True,
            text=True,
            check=False,
        )

    previous = 3
    for third, (count, kills) in zip(
        thirds,
        [(3, []), (5, ["kill_in_move:2", "kill_in_move:switch"]), (2, ["kill_in_move:1"])],
        strict=True,
    ):
        write_events(log, events.iloc[third], partitions=3)
        _cli_spec(spec, count)
        if kills:
            assert main(["stream", "plan", str(spec), *where]) == 0
            said = capsys.readouterr().out
            assert "applied   state partitions:" in said and f"→ {count}" in said, said
        for fault in kills:
            killed = run(fault)
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        done = run(verbose=bool(kills))
        assert done.returncode == 0, done.stderr[-2000:]
        if kills:
            said = f"state partitions: {previous} → {count} (the state is moved"
            assert said in done.stderr, done.stderr[-2000:]
            moved = f"moved from {previous} to {count} partitions"
            assert moved in done.stderr and "(Spark tasks)" in done.stderr, done.stderr[-2000:]
        previous = count
    assert main(["query", "flags", "--json", *where]) == 0
    rows = pd.DataFrame([json.loads(x) for x in capsys.readouterr().out.splitlines()])
    rows["window_start"] = pd.to_datetime(rows["window_start"], utc=True)
    _equals_oracle(rows, events, ("events", "users"))
    assert main(["stream", "status", str(spec), "--json", *where]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"]["partitions"] == 2 and status["state"]["generation"] == 2
    assert main(["stream", "status", str(spec), *where]) == 0
    assert "state: 2 partitions (generation 2, since state version" in capsys.readouterr().out
    # and live from the state's newest generation
    assert main(["query", str(spec), "--from-state", "--json", *where]) == 0
    live = pd.DataFrame([json.loads(x) for x in capsys.readouterr().out.splitlines()])
    assert int(live["events"].sum()) == int(  # (rows equal the oracle: checked above)
        rows.loc[
            rows["window_start"].isin(pd.to_datetime(live["window_start"], utc=True)),
            "events",
        ].sum()
    )


def test_a_move_abandoned_before_its_switch_never_leaks_into_a_later_one(tmp_path: Path) -> None:
    """A move killed before its switch, the count changed back, batches ran on (windows
    expired), then the move done again: the new partitions hold exactly the state of
    the later version — nothing of the abandoned attempt's."""
    from riverbed.state import StateConfig, StateProvider
    from riverbed.stream.layout import checkpoint_store, generation_key
    from riverbed.stream.rescale import Generation, move

    state = StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable")
    provider = StateProvider(state)
    keys = [f"k{i}" for i in range(40)]
    by_part: dict[int, list[str]] = {0: [], 1: []}
    for k in keys:
        by_part[partition_of(k.encode(), 2)].append(k)
    for p, ks in by_part.items():  # version 3: windows 0 and 1 of every key
        store = provider.load("agg", p, None)
        for k in ks:
            store.put(window_key(0, k.encode()), b"old")
            store.put(window_key(3_600_000, k.encode()), b"v3")
        store.commit(3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    old = Generation(0, 2)
    move(ckpt, state, "agg", False, old, 3, lambda: None, version=3)
    checkpoint_store(ckpt).delete(generation_key(1))  # as if killed before the switch
    for p, ks in by_part.items():  # batches ran on at 2 partitions: window 0 expired
        store = provider.load("agg", p, 3)
        store.delete_range(window_key(0, b""), window_key(1, b""))
        for k in ks:
            store.put(window_key(3_600_000, k.encode()), b"v5")
        store.commit(5)
    new = move(ckpt, state, "agg", False, old, 3, lambda: None, version=5)
    held = {}
    for q in range(3):
        store = provider.load(new.namespace("agg"), q, 5)
        held.update(dict(store.scan()))
        store.abort()
    assert held == {window_key(3_600_000, k.encode()): b"v5" for k in keys}
    # the abandoned attempt's partitions are deleted by the next retention pass, once
    from riverbed.stream.rescale import Generation as G
    from riverbed.stream.rescale import retire

    left = G(1, 3, 3).namespace("agg")  # the killed move's (from version 3)
    assert left in provider.namespaces() and left != new.namespace("agg")
    assert retire(ckpt, provider, "agg", 0) == [left]
    assert left not in provider.namespaces() and new.namespace("agg") in provider.namespaces()
    assert "agg" in provider.namespaces()  # generation 0 still holds retained versions


@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9)), min_size=1, max_size=4, unique=True),
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9), st.integers(0, 9)), max_size=12),
)
def test_only_moves_killed_before_their_switch_are_abandoned(
    recorded: list[tuple[int, int]], found: list[tuple[int, int, int]]
) -> None:
    """Of the namespaces in the state store: one of a recorded generation, a
    savepoint's, another aggregation's or one of a number past the current one (a move
    under way) is never abandoned; every other of this aggregation's is."""
    from riverbed.stream.rescale import Generation, abandoned

    gens = [Generation(0, 2)] + [
        Generation(i + 1, parts, 10 * (i + 1)) for i, (parts, _) in enumerate(recorded)
    ]
    current = gens[-1].number
    spaces = {g.namespace("agg") for g in gens} | {"agg.sp.before", "other.g1.2.v3", "agg2"}
    spaces |= {Generation(n, p, v).namespace("agg") for n, p, v in found if n > 0}
    got = set(abandoned(gens, "agg", spaces))
    recorded_spaces = {g.namespace("agg") for g in gens}
    want = {
        Generation(n, p, v).namespace("agg")
        for n, p, v in found
        if 0 < n <= current and Generation(n, p, v).namespace("agg") not in recorded_spaces
    }
    assert got == want


@pytest.mark.spark
def test_the_move_as_spark_tasks_writes_what_the_driver_would(spark: Any, tmp_path: Path) -> None:
    """The same state moved 3 → 5 in the driver and as Spark tasks: every new partition
    holds the same entries, each where the engine places its key; a partition already
    written (before a kill) is kept, not written again."""
    from riverbed.state import StateConfig, StateProvider
    from riverbed.stream.rescale import Generation, move

    state = StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable")
    provider = StateProvider(state)
    keys = [f"user-{i}" for i in range(500)]
    for p in range(3):
        store = provider.load("agg", p, None)
        for k in keys:
            if partition_of(k.encode(), 3) == p:
                for hour in range(3):
                    store.put(window_key(hour * 3_600_000, k.encode()), f"{k}/{hour}".encode())
        store.commit(4)

    def held(namespace: str) -> list[dict[bytes, bytes]]:
        out = []
        for q in range(5):
            store = provider.load(namespace, q, 4)
            out.append(dict(store.scan()))
            store.abort()
        return out

    driver, tasks = tmp_path / "driver", tmp_path / "tasks"
    driver.mkdir()
    tasks.mkdir()
    by_driver = move(driver, state, "agg", False, Generation(0, 3), 5, lambda: None, version=4)
    want = held(by_driver.namespace("agg"))
    # the Spark move writes the same namespace: the driver's copy moved aside first
    (tmp_path / "durable" / by_driver.namespace("agg")).rename(tmp_path / "durable" / "aside")
    (tmp_path / "local").rename(tmp_path / "local-aside")
    by_tasks = move(tasks, state, "agg", False, Generation(0, 3), 5, lambda: None, version=4,
                    spark=spark)  # fmt: skip
    assert by_tasks == by_driver
    got = held(by_tasks.namespace("agg"))
    assert got == want and sum(map(len, got)) == 1500
    for q, entries in enumerate(got):
        assert all(partition_of(key_bytes(k, False), 5) == q for k in entries)
    # moved again (a start after a kill before the switch): the partitions are kept
    written = sorted(p.stat().st_mtime_ns for p in (tmp_path / "durable").rglob("*") if p.is_file())
    again = tmp_path / "again"
    again.mkdir()
    move(again, state, "agg", False, Generation(0, 3), 5, lambda: None, version=4, spark=spark)
    assert (
        sorted(p.stat().st_mtime_ns for p in (tmp_path / "durable").rglob("*") if p.is_file())
        == written
    )


@given(st.lists(st.integers(0, 50), max_size=5), st.integers(-5, 60))
def test_a_generation_retires_once_no_retained_version_lives_in_it(
    starts: list[int], keep_from: int
) -> None:
    from riverbed.stream.rescale import Generation, for_version, retired

    gens = [Generation(i, 3, v) for i, v in enumerate([0, *sorted(starts)])]
    gone = {g.number for g in retired(gens, keep_from)}
    assert gens[-1].number not in gone  # the current one never
    needed = {for_version(gens, v).number for v in range(max(keep_from, 0), 60)}
    assert not needed & gone  # no retained version loses its state
    for g, after in itertools.pairwise(gens):  # and one whose versions are all older goes
        assert (g.number in gone) is (after.from_version <= keep_from)


def test_retention_deletes_a_rescales_old_generation_once_past_it(tmp_path: Path) -> None:
    """The retention pass deletes an old generation's state — every partition, and the
    local cache — once no retained version lives in it, and keeps it until then."""
    from riverbed.state import StateConfig, StateProvider
    from riverbed.stream.layout import checkpoint_store, generation_key
    from riverbed.stream.rescale import Generation, retire

    state = StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable")
    provider = StateProvider(state)
    ckpt = tmp_path / "ckpt"
    old, new = Generation(0, 2), Generation(1, 3, 40)
    for generation in (old, new):
        for p in range(generation.partitions):
            store = provider.load(generation.namespace("agg"), p, None)
            store.put(b"k", b"v")
            store.commit(generation.from_version + 1)
    checkpoint_store(ckpt).put(generation_key(1), json.dumps(new.to_json()).encode())
    assert retire(ckpt, provider, "agg", keep_from=39) == []  # version 39: the old one's
    assert "agg" in provider.namespaces()
    assert retire(ckpt, provider, "agg", keep_from=40) == ["agg"]
    assert provider.namespaces() == [new.namespace("agg")]
    assert not (tmp_path / "local" / "agg").exists()
    assert retire(ckpt, provider, "agg", keep_from=400) == []  # once
