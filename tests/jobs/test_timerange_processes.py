"""Time-range drivers as real processes: SIGKILL at random points, a standby that takes
over, and a SIGSTOPped driver that wakes up after losing its term. The job also
publishes its datasets to lakehouse tables (rows to Delta, windows to Iceberg), a chunk
a partition: through the kills each table holds exactly the published files' rows, and
the woken driver commits nothing."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from riverbed.control import connect
from riverbed.jobs.timerange import load_spec
from riverbed.tables import PARTITION, partition_table
from riverbed.testing.signals import stop_outside_writes
from riverbed.timerange.compute import one_pass
from riverbed.timerange.oracle import pandas_rows
from riverbed.timerange.plan import parse_time
from tests.jobs.cluster import until
from tests.jobs.test_timerange_spark import assert_same, write_input

pytestmark = [pytest.mark.slow, pytest.mark.spark]

CLI = [sys.executable, "-m", "riverbed.cli.main"]

START = pd.Timestamp("2026-01-01", tz="UTC")
HOURS = 6
SPEC = """
from riverbed.jobs.timerange import (Cumulative, ParquetInput, Rolling, Rows, TimeRangeJob,
                                     Tumbling)

job = TimeRangeJob(
    input=ParquetInput({input!r}, partition="hour"),
    key="sensor", time="ts",
    metrics=[Rolling("45min", "value", ["mean", "max", "count"]), Rows(3, "value", ["sum"]),
             Cumulative("value", ["sum", "count"])],
    tumbling=[Tumbling("30min", "value", ["mean"])],
    output={output!r}, chunk="30m",
    tables={tables!r},
)
"""


def spec_text(input: str, output: str, tables: dict[str, str] | None = None) -> str:
    """The job's spec file: ``output`` "" for none (it follows the checkpoints)."""
    text = SPEC.format(input=input, output=output, tables=tables or {})
    return text.replace("output='', ", "")


@pytest.fixture
def setup(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    n = 3000
    frame = pd.DataFrame(
        {
            "sensor": rng.integers(0, 8, n),
            "ts": START + pd.to_timedelta(rng.integers(0, HOURS * 3600, n), unit="s"),
            "value": rng.integers(0, 200, n) / 4,
        }
    )
    for hour in range(HOURS):
        lo = START + pd.Timedelta(hours=hour)
        part = frame[(frame.ts >= lo) & (frame.ts < lo + pd.Timedelta(hours=1))]
        write_input(tmp_path / "in" / f"hour={lo:%Y-%m-%dT%H}", part)
    spec = tmp_path / "sensors.py"
    tables = {
        "rows": f"delta:{tmp_path / 'lake'}",
        "windows_30m": f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.windows",
    }
    spec.write_text(spec_text(str(tmp_path / "in"), str(tmp_path / "out"), tables))
    env = {
        **subprocess_env,
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
        "RIVERBED_SPARK_MASTER": "local[2]",
    }
    expected = {  # rows per 30-minute chunk label
        f"chunk={t:%Y%m%dT%H%M%SZ}": int(
            ((frame.ts >= t) & (frame.ts < t + pd.Timedelta(minutes=30))).sum()
        )
        for t in pd.date_range(START, periods=HOURS * 2, freq="30min")
    }
    return {"tmp": tmp_path, "spec": spec, "env": env, "frame": frame, "expected": expected}


def driver(s: dict[str, Any], *extra: str, hours: int = HOURS) -> subprocess.Popen[str]:
    """``riverbed timerange run`` over the first ``hours`` of the input."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "riverbed.cli.main",
            "timerange",
            "run",
            str(s["spec"]),
            "--from",
            "2026-01-01",
            "--to",
            f"2026-01-01T{hours:02d}:00",
            "--ttl",
            "2",
            "--batch",  # a chunk per query: published one at a time, slow enough to kill
            "1",
            *extra,
        ],
        env=s["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def records(s: dict[str, Any]) -> list[Any]:
    return connect(s["env"]["RIVERBED_CONTROL"]).get_prefix(b"riverbed/timerange/sensors/chunks/")


class Watcher(threading.Thread):
    """Reads the published output over and over while drivers die: every chunk file it can
    see must be whole (all of that chunk's rows, once)."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.s, self.stop, self.reads, self.bad = s, threading.Event(), 0, []

    def run(self) -> None:
        rows = self.s["tmp"] / "out" / "rows"
        while not self.stop.is_set():
            for path in sorted(rows.glob("chunk=*/part.parquet")):
                try:
                    n = pq.read_metadata(path).num_rows
                except FileNotFoundError:
                    continue  # replaced between the listing and the read
                if n != self.s["expected"][path.parent.name]:
                    self.bad.append((path.parent.name, n))
                self.reads += 1
            time.sleep(0.02)


def check_output(s: dict[str, Any], spark: Any, hours: int = HOURS) -> None:
    """The published output of a run over the first ``hours`` equals pandas and one
    pass, and each chunk was published once. (A row's metrics depend only on rows
    before it, so the oracle over the first hours' rows is the whole range's, cut.)"""
    spec = load_spec(s["spec"])
    frame = s["frame"][s["frame"].ts < START + pd.Timedelta(hours=hours)]
    got = pd.concat(
        pq.read_table(p).to_pandas()
        for p in sorted((s["tmp"] / "out" / "rows").glob("*/part.parquet"))
    )
    assert_same(got, pandas_rows(spec.job, frame), exact=False)
    end = parse_time(f"2026-01-01T{hours:02d}:00")
    whole = one_pass(spark, spec.job, parse_time("2026-01-01"), end)
    assert whole.rows is not None
    assert_same(got, whole.rows.toPandas(), exact=True)
    published = [kv.version for kv in records(s)]
    assert published == [1] * (hours * 2), "a chunk was published more than once"
    for dataset, text in spec.job.tables.items():  # each table: the published rows, once
        table = partition_table(text, spec.name).read().to_pandas()
        files = sorted((s["tmp"] / "out" / dataset).glob("*/part.parquet"))
        want = pd.concat(
            pq.read_table(f).to_pandas().assign(chunk=f.parent.name.removeprefix("chunk="))
            for f in files
        )
        assert want[PARTITION].nunique() == hours * 2, dataset
        pd.testing.assert_frame_equal(
            in_order(table[want.columns]), in_order(want), check_dtype=False, obj=dataset
        )
    assert not list((s["tmp"] / "out" / "_riverbed" / "staging").glob("*"))


def in_order(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` sorted by every column, its times in UTC, its index dropped."""
    frame = frame.copy()
    for col in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[col]):
            frame[col] = pd.to_datetime(frame[col], utc=True).astype("datetime64[us, UTC]")
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_sigkill_at_random_points_then_resume_equals_one_pass(
    setup: dict[str, Any], spark: Any
) -> None:
    rng = random.Random(7)
    watcher = Watcher(setup)
    watcher.start()
    kills = 0
    while kills < 5:
        proc = driver(setup)
        # half the kills at a random moment of the start (Spark's JVM, the election), half
        # after this driver recorded a chunk, at a random moment of the chunks after it
        # (computing, staging, publishing): a start alone takes ~15 s on 2 slow cores
        if kills % 2:
            done = len(records(setup))

            def progressed(done: int = done, proc: subprocess.Popen[str] = proc) -> bool:
                return len(records(setup)) > done or proc.poll() is not None

            until(progressed, 180, "a chunk")
        time.sleep(rng.uniform(0.5, 6.0))
        if proc.poll() is not None:
            break  # it finished before this kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    recorded_before_final = len(records(setup))
    final = driver(setup)
    _, err = final.communicate(timeout=420)  # all 12 chunks, on a busy machine
    watcher.stop.set()
    watcher.join()
    assert final.returncode == 0, err
    assert kills >= 4, "the run finished too early to be killed often"
    assert recorded_before_final > 0, "no kill came after a driver had recorded a chunk"
    assert watcher.reads > 0 and watcher.bad == [], watcher.bad
    check_output(setup, spark)


def table_commits(s: dict[str, Any]) -> list[int]:
    """Each of the job's (Delta) tables' version."""
    from deltalake import DeltaTable

    spec = load_spec(s["spec"])
    return [DeltaTable(text.removeprefix("delta:")).version() for text in spec.job.tables.values()]


def test_a_standby_takes_over_and_a_woken_zombie_cannot_publish(
    setup: dict[str, Any], spark: Any
) -> None:
    hours = 3  # 6 chunks: 2 by the first driver, the rest by the standby
    # both datasets to Delta tables here: a process paused inside a write of a SQLite
    # Iceberg catalog would hold every other writer of it back (as one paused inside a
    # write of the SQLite control plane would: docs/control.md); the SIGKILL test above
    # publishes to Iceberg
    tmp = setup["tmp"]
    tables = {"rows": f"delta:{tmp / 'lake'}", "windows_30m": f"delta:{tmp / 'lake-windows'}"}
    setup["spec"].write_text(spec_text(str(tmp / "in"), str(tmp / "out"), tables))
    first = driver(setup, hours=hours)
    until(lambda: len(records(setup)) >= 2, 120, "the first driver's chunks")
    second = driver(setup, hours=hours)
    time.sleep(2)  # the second is a standby while the first lives
    assert second.poll() is None
    # paused: its lease runs out, the standby takes over. Not inside a write of the
    # SQLite control plane: a process paused there holds every writer back until it
    # resumes (docs/control.md) — the test takes the write lock for the moment of the
    # signal, so the first driver is outside a write or waiting for one
    stop_outside_writes(first.pid, setup["env"]["RIVERBED_CONTROL"])
    try:
        _, err2 = second.communicate(timeout=240)
        assert second.returncode == 0, err2
        assert "standby" in err2
        files = {p: p.stat().st_mtime_ns for p in (setup["tmp"] / "out").glob("*/*/part.parquet")}
        commits = table_commits(setup)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 1
    assert "lost the lead" in err1, err1
    after = {p: p.stat().st_mtime_ns for p in (setup["tmp"] / "out").glob("*/*/part.parquet")}
    assert after == files, "the woken driver published something"
    assert table_commits(setup) == commits, "the woken driver committed to a table"
    check_output(setup, spark, hours)
    info = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "riverbed.cli.main",
                "timerange",
                "status",
                str(setup["spec"]),
                "--json",
            ],
            env=setup["env"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    rows = int((setup["frame"].ts < START + pd.Timedelta(hours=hours)).sum())
    assert (info["chunks_done"], info["chunks_total"], info["rows"]) == (6, 6, rows)
    reset = subprocess.run(
        [*CLI, "timerange", "reset", str(setup["spec"]), "--output"],
        env=setup["env"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "2 table(s) dropped" in reset.stdout, reset.stdout
    spec = load_spec(setup["spec"])
    for text in spec.job.tables.values():
        assert partition_table(text, spec.name).read().num_rows == 0
