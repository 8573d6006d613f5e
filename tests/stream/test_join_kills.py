"""A driver running a stream-stream join (`riverbed stream run join.py`) SIGKILLed in
the middle of batches again and again while both topics are written to: after a final
`--once` drain, the joined rows — in the result table and in the join's topic — equal
pandas' batch join of the events read back from the log, every row once (a left join's
unmatched orders included, each once)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from starlette.testclient import TestClient

import riverbed.log
from riverbed.config import Config
from riverbed.inspect import Sources
from riverbed.inspect import join as inspect_join
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results
from riverbed.stream.joinquery import read_joined
from riverbed.stream.joins import Join
from riverbed.stream.layout import Checkpoint
from riverbed.ui.app import create_app
from riverbed.ui.console import Console
from tests.stream.conftest import T0
from tests.stream.crashes import kill_mid_batch, newest_batch, stream_run_killed_then_drained
from tests.stream.test_stream_join import oracle, orders_and_payments, rows_of, send

# a scenario: its hang guard is tests/conftest.py's SCENARIO_HANG_GUARD
pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Join, Topic

join = Join(
    name="paid",
    left=Topic("orders", options={{"schema": "order_id long, amount double, ts timestamp"}}),
    right=Topic("payments", options={{"schema": "order_id long, paid double, ts timestamp"}}),
    on="order_id", time="ts", how="{how}", watermark="2h", state_partitions=3,
    topic="paid_rows", {shape},
)
"""
KILLS = 4
LAST = pd.DataFrame({"order_id": [10**6], "amount": [0.0], "ts": [T0 + pd.Timedelta("3d")]})


@pytest.mark.parametrize(
    ("shape", "how"), [('within=("10m", "1h")', "left"), ('window="30m"', "inner")]
)
def test_a_join_killed_mid_batch_gives_every_row_once(
    tmp_path: Path, subprocess_env: dict[str, str], shape: str, how: str
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    log_url = f"file://{home / 'log'}"
    orders, payments = orders_and_payments(1500, seed=5)
    release = _backlogs(log_url, orders, payments)

    spec = tmp_path / "join.py"
    spec.write_text(SPEC.format(how=how, shape=shape))
    checkpoint = Checkpoint(home / "checkpoints" / "paid")

    def the_rest() -> None:
        """The rest of the payments, and one far-later event on each side: the
        watermark passes every order (a left join's unmatched ones are all due)."""
        rest = payments[payments["ts"] > orders["ts"].iloc[-1]]
        send(log_url, "payments", pd.concat([rest, LAST.rename(columns={"amount": "paid"})]), 2)
        send(log_url, "orders", LAST, 3)

    command, finished = stream_run_killed_then_drained(
        spec, env, checkpoint.batches, records=60, kills=KILLS, seed=11, release=release,
        logs=tmp_path / "logs", before_drain=the_rest,
    )  # fmt: skip
    assert "joined" in finished.stderr  # its batches were reported

    # the oracle: the events as the log holds them, read back
    log = riverbed.log.open(log_url)
    held = _held(log)
    topic_rows = [r.value for p in range(3) for r in log.read("paid_rows", p, 0, 10**6)]
    log.close()
    assert len(held["orders"]) == len(orders) + 1
    join = _join(shape, how)
    want = oracle(join, held["orders"], held["payments"])
    got = read_joined(home / "output" / "paid")
    assert rows_of(got) == rows_of(want)  # every row once, through four kills
    # the join's topic: the same rows, each once (a re-run batch wrote none twice)
    published = pd.DataFrame(topic_rows).assign(
        ts=lambda f: pd.to_datetime(f["ts"], utc=True, format="ISO8601"),
        right_ts=lambda f: pd.to_datetime(f["right_ts"], utc=True, format="ISO8601"),
    )
    assert rows_of(published) == rows_of(got)
    batches = open_batches(checkpoint.root)
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.totals is not None
    assert newest.totals["late"] == 0 and newest.totals["malformed"] == 0
    # `riverbed query paid` shows the same rows (a join's name, as an aggregation's)
    shown = subprocess.run([*command[:3], "query", "paid", "--json"], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    queried = pd.DataFrame([json.loads(line) for line in shown.stdout.splitlines()])
    assert len(queried) == len(read_joined(home / "output" / "paid"))
    assert sorted(queried["order_id"]) == sorted(read_joined(home / "output" / "paid")["order_id"])
    window = subprocess.run([*command[:3], "query", "paid", "--window", "2026-11-21"], env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert window.returncode != 0 and "'paid' is a join" in window.stderr

    # the console shows what `stream status join.py` says, from the checkpoint alone
    status = subprocess.run(
        [*command[:3], "stream", "status", str(spec), "--json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr[-2000:]
    said = json.loads(status.stdout)
    assert said["joined"] == len(got) - said["unmatched"] and said["sides"]["left"]["lag"] == 0
    sources = Sources(Config(home=home))
    try:
        shown = inspect_join(sources, "paid")
        keys = ("batches", "input_records", "joined", "unmatched", "late", "filtered",
                "watermark", "sides")  # fmt: skip
        assert {k: shown[k] for k in keys} == {k: said[k] for k in keys}
        assert shown["spec"] == str(spec.resolve()) and shown["how"] == how
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            listed = client.get("/streams").text
            assert 'id="joins"' in listed and 'href="/streams/paid"' in listed
            page = client.get("/streams/paid").text
            assert "<h1>Join paid</h1>" in page and 'id="sides"' in page
            assert "0 filtered (where)" in page
            assert f"riverbed stream status {spec.resolve()} --json" in page
            assert client.get("/api/streams/paid").json()["joined"] == said["joined"]
    finally:
        sources.close()


BANDED = """
from riverbed.stream import Aggregation, Count, Sum, Tumbling

source = {"join": "join.py"}  # the join's rows, joined by this driver
aggregation = Aggregation(
    name="paid_by_band", key="band", time="ts", window=Tumbling("15m"), watermark="0s",
    columns={"band": "CAST(amount AS BIGINT) % 5"}, output="final",
    metrics={"paid": Sum("paid"), "rows": Count()}, state_partitions=2,
)
"""


def test_an_aggregation_over_a_join_killed_mid_batch_counts_every_row_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The join and the aggregation of its rows in one driver (`source = {"join":
    "join.py"}`), SIGKILLed inside the join's batches and the aggregation's after them:
    the results equal pandas' join and group-by of the events read back, every joined
    row counted once (a left join's unmatched orders too), none late."""
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    log_url = f"file://{home / 'log'}"
    orders, payments = orders_and_payments(1500, seed=7)
    release = _backlogs(log_url, orders, payments)
    spec = tmp_path / "banded.py"
    (tmp_path / "join.py").write_text(SPEC.format(how="left", shape='within=("10m", "1h")')
                                      .replace('topic="paid_rows", ', ""))  # fmt: skip
    spec.write_text(BANDED)
    checkpoint = Checkpoint(home / "checkpoints" / "paid_by_band")

    def the_rest() -> None:
        send(log_url, "payments", payments[payments["ts"] > orders["ts"].iloc[-1]], 2)

    # the kills aim at the join's batches, then at the aggregation's (each runs right
    # after the join batch whose rows it reads)
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
               "--max-records-per-batch", "60", "--ttl", "3"]  # fmt: skip
    rng = random.Random(13)
    for k, aimed_at in enumerate([checkpoint.root / "join", checkpoint.root]):
        kill_mid_batch(command, env, Checkpoint(aimed_at).batches, kills=1, rng=rng,
                       before_start=lambda _, k=k: release(k), logs=tmp_path / "logs")  # fmt: skip
    # and at the two seams between them: a join batch committed, its rows not read yet;
    # the aggregation's batch planned over them, not run (the failpoints SIGKILL there)
    for k, (at, aimed_at) in enumerate([("join", "join"), ("planned", "")], start=2):
        release(k)
        target = newest_batch(Checkpoint(checkpoint.root / aimed_at).batches) + 2
        died = subprocess.run(command, env={**env, "RIVERBED_FAULT": f"joined:{at}:{target}"},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    release(KILLS)
    the_rest()
    drained = subprocess.run([*command, "--once"], env=env, capture_output=True, text=True)
    assert drained.returncode == 0, drained.stderr[-3000:]
    # then one far-later event on each side, once the rest is read (read with it, one
    # partition's would move the watermark past another's last orders: late)
    send(log_url, "payments", LAST.rename(columns={"amount": "paid"}), 2)
    send(log_url, "orders", LAST, 3)
    ended = subprocess.run([*command, "--once"], env=env, capture_output=True, text=True)
    assert ended.returncode == 0, ended.stderr[-3000:]

    log = riverbed.log.open(log_url)
    held = _held(log)
    log.close()
    rows = oracle(_join('within=("10m", "1h")', "left"), held["orders"], held["payments"])
    rows = rows[rows["order_id"] < 10**6]
    rows = rows.assign(
        band=(rows["amount"].astype("int64") % 5).astype(str),
        window_start=rows["ts"].dt.floor("15min"),
    )
    want = (
        rows.groupby(["window_start", "band"])
        .agg(paid=("paid", lambda v: v.sum(min_count=1)), rows=("order_id", "size"))
        .reset_index()
    )
    got = read_results(home / "output" / "paid_by_band")
    got = got[got["window_start"] < T0 + pd.Timedelta("3d")]
    assert len(want) == 40  # 2 hours of orders, 8 quarters, 5 bands
    assert sorted(zip(got["window_start"], got["key"], got["rows"], strict=True)) == sorted(
        zip(want["window_start"], want["band"], want["rows"], strict=True)
    )  # every joined row counted once, through four kills
    paid = dict(zip(zip(got["window_start"], got["key"], strict=True), got["paid"], strict=True))
    for w, b, v in zip(want["window_start"], want["band"], want["paid"], strict=True):
        assert (pd.isna(v) and pd.isna(paid[(w, b)])) or abs(paid[(w, b)] - v) < 1e-6
    joined = read_joined(checkpoint.root / "join-rows")
    assert rows_of(joined[joined["order_id"] < 10**6]) == rows_of(rows)  # each row once
    batches = open_batches(checkpoint.root)
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.totals is not None
    assert newest.totals["late"] == 0 and newest.totals["malformed"] == 0
    # `stream status` names the join's sides: nothing left to read, what each holds
    status = subprocess.run([*command[:3], "stream", "status", str(spec), "--json"],
                            env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert status.returncode == 0, status.stderr[-2000:]
    said = json.loads(status.stdout)
    assert said["lag"] == {"orders": 0, "payments": 0}
    assert said["join"]["joined"] + said["join"]["unmatched"] == len(joined)
    # the console's page of the aggregation: the join's topics' lag, the join batches
    # each of its batches read
    sources = Sources(Config(home=home))
    try:
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            page = client.get("/streams/paid_by_band").text
            assert "orders=0 payments=0" in page and "<code>join batches " in page
            assert client.get("/streams/paid_by_band?batch=1").status_code == 200
    finally:
        sources.close()


LOOKUP_SPEC = """
from riverbed.stream import Join, Lookup, Topic

join = Join(
    name="labelled",
    left=Topic("orders", options={{"schema": "order_id long, amount double, ts timestamp",
                                   "driverBatchRecords": "0"}}),  # Spark jobs: kills land in them
    right=Lookup("{table}", on="order_id", columns={{"label": "label"}}),
    time="ts", topic="labelled_rows",
)
"""


def test_a_lookup_join_killed_mid_batch_joins_each_batch_with_its_planned_table(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """A lookup join's driver SIGKILLed mid-batch while orders arrive and the table is
    rewritten before every start: every order is in the rows once (a left join: the ones
    the table lacks too), each with the label of the table version its batch's plan
    recorded — and that version is one the table really had."""
    import pyarrow as pa

    from riverbed.stream.joins import Lookup
    from riverbed.stream.lookups import encoded, normalized

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    log_url = f"file://{home / 'log'}"
    orders, _ = orders_and_payments(1500, seed=7)
    table = tmp_path / "labels"
    table.mkdir()
    versions: list[pd.DataFrame] = []

    def rewrite(k: int) -> None:
        """Version k of the table: orders up to 1200 labelled ``v<k>`` (the rest: none)."""
        frame = pd.DataFrame({"order_id": range(1200), "label": [f"v{k}"] * 1200})
        versions.append(frame)
        frame.to_parquet(table / "part.parquet.tmp", index=False)
        (table / "part.parquet.tmp").rename(table / "part.parquet")  # whole, or not yet

    bounds = [len(orders) * i // (KILLS + 1) for i in range(KILLS + 2)]

    def release(k: int) -> None:
        rewrite(k)
        send(log_url, "orders", orders.iloc[bounds[k] : bounds[k + 1]], 3)

    spec = tmp_path / "labelled.py"
    spec.write_text(LOOKUP_SPEC.format(table=table / "part.parquet"))
    checkpoint = Checkpoint(home / "checkpoints" / "labelled")
    stream_run_killed_then_drained(
        spec, env, checkpoint.batches, records=60, kills=KILLS, seed=12, release=release,
        logs=tmp_path / "logs",
    )  # fmt: skip

    # the oracle: each done batch's orders, read back from the slices its plan recorded,
    # merged with the version of the table its plan recorded (a snapshot's id is its
    # content's hash: each version the table had is hashed here, as riverbed keeps it)
    lookup = Lookup(str(table / "part.parquet"), on="order_id", columns={"label": "label"})
    by_id = {encoded(normalized(lookup, pa.Table.from_pandas(v)))[0]: v for v in versions}
    log = riverbed.log.open(log_url)
    batches = open_batches(checkpoint.root)
    wants, labels = [], set()
    for b in batches.ids():
        record = batches.get(b)
        assert record is not None and record.done and record.lookups
        known = by_id.get(record.lookups[0]["id"])
        assert known is not None, f"batch {b} joined with a table that never was"
        rows = [
            r.value
            for p, (start, end) in (record.sources or {})["left"].items()
            for r in log.read("orders", int(p), int(start), int(end) - int(start))
        ]
        if not rows:
            continue
        events = pd.DataFrame(rows).assign(
            ts=lambda f: pd.to_datetime(f["ts"], utc=True, format="ISO8601")
        )
        wants.append(events.merge(known, on="order_id", how="left"))
        labels |= set(known["label"])
    topic_rows = [r.value for p in range(4) for r in log.read("labelled_rows", p, 0, 10**6)]
    log.close()
    want = pd.concat(wants, ignore_index=True)
    assert len(labels) >= 3  # the table changed under the running join, more than once
    got = read_joined(home / "output" / "labelled")
    assert sorted(got["order_id"]) == sorted(orders["order_id"])  # every order once
    cols = ["order_id", "amount", "ts", "label"]

    def rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        out = frame[cols].astype(object).where(frame[cols].notna(), None)
        return sorted(
            (tuple(str(v) if isinstance(v, pd.Timestamp) else v for v in r)
             for r in out.itertuples(index=False)),
            key=lambda r: r[0],
        )  # fmt: skip

    assert rows(got) == rows(want)  # each with its batch's planned table
    assert got["label"].isna().sum() == (orders["order_id"] >= 1200).sum()
    published = pd.DataFrame(topic_rows).assign(
        ts=lambda f: pd.to_datetime(f["ts"], utc=True, format="ISO8601")
    )
    assert rows(published) == rows(got)  # the join's topic: the same rows, once
    # the console: the table as the right side, no state
    sources = Sources(Config(home=home))
    try:
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            page = client.get("/streams/labelled").text
            assert "as of each batch" in page and "no state (a lookup join)" in page
            assert f"table {table / 'part.parquet'}" in page
            shown = client.get("/api/streams/labelled").json()
            assert shown["joined"] == len(got) - shown["unmatched"]
            assert shown["unmatched"] == (orders["order_id"] >= 1200).sum()
    finally:
        sources.close()


def _backlogs(log_url: str, orders: pd.DataFrame, payments: pd.DataFrame) -> Any:
    """``release(k)``: start k's backlog — the next orders, and the payments up to their
    time (k = KILLS: the last orders)."""
    bounds = [len(orders) * i // (KILLS + 1) for i in range(KILLS + 2)]

    def release(k: int) -> None:
        chunk = orders.iloc[bounds[k] : bounds[k + 1]]
        lo = orders["ts"].iloc[bounds[k] - 1] if k else T0 - pd.Timedelta("1d")
        hi = chunk["ts"].iloc[-1]
        send(log_url, "orders", chunk, 3)
        send(log_url, "payments", payments[(payments["ts"] > lo) & (payments["ts"] <= hi)], 2)

    return release


def _held(log: Any) -> dict[str, pd.DataFrame]:
    """The orders and payments as the log holds them, read back."""
    held = {}
    for topic in ("orders", "payments"):
        rows = [
            r.value
            for p in range(log.topic(topic).partitions)
            for r in log.read(topic, p, 0, 10**6)
        ]
        held[topic] = pd.DataFrame(rows).assign(
            ts=lambda f: pd.to_datetime(f["ts"], utc=True, format="ISO8601")
        )
    return held


def _join(shape: str, how: str) -> Any:
    kind = {"within": ("10m", "1h")} if shape.startswith("within") else {"window": "30m"}
    return Join(name="paid", left="orders", right="payments", on="order_id", how=how, **kind)  # type: ignore[arg-type]


def test_a_standby_join_driver_takes_over_from_a_killed_one(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Two `stream run join.py` drivers: one leads, the other stands by; the leader is
    SIGKILLed while it works and the standby takes over (a newer term) and carries on;
    after a drain every row is there once, and batches were committed under both terms."""
    from riverbed.stream.fencing import recorded_driver
    from tests.jobs.cluster import until

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[1]"}
    env.pop("RIVERBED_CONTROL", None)
    log_url = f"file://{home / 'log'}"
    orders, payments = orders_and_payments(900, seed=6)
    half = len(orders) // 2
    cut = orders["ts"].iloc[half - 1]
    send(log_url, "orders", orders.iloc[:half], 3)
    send(log_url, "payments", payments[payments["ts"] <= cut], 2)
    spec = tmp_path / "join.py"
    spec.write_text(SPEC.format(how="left", shape='within=("10m", "1h")'))
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
               "--max-records-per-batch", "40", "--ttl", "3"]  # fmt: skip
    root = Checkpoint(home / "checkpoints" / "paid").root

    def leader() -> tuple[int, int] | None:
        """(term, pid) of the driver the checkpoint records as active."""
        record = recorded_driver(root)
        if record is None:
            return None
        return int(record["term"]), int(record["driver"].rpartition(":")[2])

    def committed_terms() -> set[int | None]:
        batches = open_batches(root)
        return {r.term for b in batches.ids() if (r := batches.get(b)) is not None and r.done}

    procs = [
        subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        for _ in range(2)
    ]  # fmt: skip
    try:
        until(lambda: leader() is not None and committed_terms(), 120, "the leader's batches")
        first = leader()
        assert first is not None
        (killed,) = [p for p in procs if p.pid == first[1]]
        os.killpg(killed.pid, signal.SIGKILL)  # the second half comes after: the standby's
        killed.wait()
        send(log_url, "orders", orders.iloc[half:], 3)
        send(log_url, "payments", payments[payments["ts"] > cut], 2)
        until(lambda: (now := leader()) is not None and now[0] != first[0], 90, "a takeover")
        second = leader()
        assert second is not None and second[1] != first[1]
        until(lambda: second[0] in committed_terms(), 90, "a batch of the new leader")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    last = LAST
    send(log_url, "payments", last.rename(columns={"amount": "paid"}), 2)
    send(log_url, "orders", last, 3)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    want = oracle(_join('within=("10m", "1h")', "left"), orders, payments)
    got = read_joined(home / "output" / "paid")
    assert rows_of(got[got["order_id"] != 10**6]) == rows_of(want)  # every row once
    assert {first[0], second[0]} <= committed_terms()


FRAMES_DRIVER = Path(__file__).with_name("join_frames_driver.py")


def test_a_join_of_dataframes_killed_mid_batch_gives_every_row_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The DataFrame path (both sides streaming DataFrames, one Spark streaming query
    over their union: tests/stream/join_frames_driver.py) SIGKILLed mid-batch 4 times
    while both topics are written: Spark's checkpoint gives a re-run micro-batch the same
    events, riverbed's record the same watermark — every joined row once, a left join's
    unmatched orders each once. (The window join's shape runs on this path in
    test_stream_join.py.)"""
    shape, how = "within", "left"
    root = Path(__file__).resolve().parents[2]
    env = {**subprocess_env, "PYTHONPATH": str(root)}
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(1500, seed=7)
    release = _backlogs(log_url, orders, payments)

    checkpoint, output = tmp_path / "cp", tmp_path / "out"
    command = [sys.executable, str(FRAMES_DRIVER), log_url, str(checkpoint), str(output),
               shape, how]  # fmt: skip
    aimed = kill_mid_batch(command, env, Checkpoint(checkpoint).batches, kills=KILLS,
                           rng=random.Random(13), before_start=release,
                           logs=tmp_path / "logs")  # fmt: skip
    assert len(aimed) == KILLS
    release(KILLS)
    send(log_url, "payments", payments[payments["ts"] > orders["ts"].iloc[-1]], 2)
    # then a far-later event on each side, twice: the first drain reads the rest and
    # the first ones in one micro-batch (after the killed driver's planned one, re-run:
    # riverbed's Spark source caps it at --records — far above what is left — so
    # nothing left is read after a far-later event and made late); the second drain's
    # micro-batch (one runs only with new events; its watermark comes from the batches
    # before it) passes every order: the unmatched ones are emitted
    last = LAST
    for _ in range(2):
        send(log_url, "payments", last.rename(columns={"amount": "paid"}), 2)
        send(log_url, "orders", last, 3)
        last = last.assign(order_id=last["order_id"] + 1, ts=last["ts"] + pd.Timedelta("1d"))
        finished = subprocess.run(
            [*command, "--once", "--records", "1000000"], env=env, capture_output=True,
            text=True, check=False, cwd=root,
        )  # fmt: skip
        assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-3000:]
    log = riverbed.log.open(log_url)
    held = _held(log)
    log.close()
    want = oracle(_join(shape, how), held["orders"], held["payments"])
    want = want[want["order_id"] < 10**6]
    got = read_joined(output)
    got = got[got["order_id"] < 10**6]
    assert len(want) > 500 and want["paid"].isna().any()  # unmatched orders among them
    assert rows_of(got) == rows_of(want)  # every row once, through four kills
    batches = open_batches(checkpoint)
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.totals is not None
    assert newest.totals["late"] == 0 and newest.totals["malformed"] == 0


def test_a_lookup_join_of_a_dataframe_killed_mid_batch_joins_each_batch_with_its_table(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The DataFrame path's lookup join (``Join(left=Frame(df), right=Lookup(...))``,
    tests/stream/join_frames_driver.py) SIGKILLed mid-batch while orders arrive and the
    table is rewritten before every start: every order is in the rows once (a left
    join: those the table lacks too), each with the label of the table version its
    micro-batch's record names — a version the table really had."""
    import pyarrow as pa

    from riverbed.stream.joins import Lookup
    from riverbed.stream.lookups import encoded, normalized

    kills = 3
    root = Path(__file__).resolve().parents[2]
    env = {**subprocess_env, "PYTHONPATH": str(root)}
    log_url = f"file://{tmp_path / 'log'}"
    orders, _ = orders_and_payments(900, seed=9)
    table = tmp_path / "labels.parquet"
    versions: list[pd.DataFrame] = []

    def release(k: int) -> None:
        """Version k of the table (orders below 700 labelled ``v<k>``), then k's orders."""
        frame = pd.DataFrame({"order_id": range(700), "label": [f"v{k}"] * 700})
        versions.append(frame)
        frame.to_parquet(tmp_path / "labels.tmp", index=False)
        (tmp_path / "labels.tmp").rename(table)  # whole, or not yet
        cut = [len(orders) * i // (kills + 1) for i in range(kills + 2)]
        send(log_url, "orders", orders.iloc[cut[k] : cut[k + 1]], 3)

    checkpoint, output = tmp_path / "cp", tmp_path / "out"
    command = [sys.executable, str(FRAMES_DRIVER), log_url, str(checkpoint), str(output),
               f"lookup:{table}", "left"]  # fmt: skip
    aimed = kill_mid_batch(command, env, Checkpoint(checkpoint).batches, kills=kills,
                           rng=random.Random(17), before_start=release,
                           logs=tmp_path / "logs")  # fmt: skip
    assert len(aimed) == kills
    release(kills)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False, cwd=root
    )
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-3000:]

    lookup = Lookup(str(table), on="order_id", columns={"label": "label"})
    by_id = {encoded(normalized(lookup, pa.Table.from_pandas(v)))[0]: v for v in versions}
    got = read_joined(output)
    assert sorted(got["order_id"]) == sorted(orders["order_id"])  # every order once
    batches = open_batches(checkpoint)
    labels = set()
    for b, rows in got.groupby("batch_id"):
        record = batches.get(int(b))
        assert record is not None and record.done and record.lookups
        known = by_id.get(record.lookups[0]["id"])
        assert known is not None, f"batch {b} joined with a table that never was"
        want = rows[["order_id"]].merge(known, on="order_id", how="left")
        assert list(rows.sort_values("order_id")["label"].fillna("-")) == list(
            want.sort_values("order_id")["label"].fillna("-")
        ), f"batch {b}: not its planned table's labels"
        labels |= set(known["label"])
    assert len(labels) >= 3  # the table changed under the running join, more than once
    assert got["label"].isna().sum() == (orders["order_id"] >= 700).sum()
    log = riverbed.log.open(log_url)
    on_topic = sum(o.end - o.start for o in log.offsets("labelled_rows"))
    log.close()
    assert on_topic == len(got)  # the join's topic: the same rows, once
