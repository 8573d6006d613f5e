"""What an earlier riverbed left behind keeps working: each fixture of
``fixtures/`` (written by the commit its MANIFEST names, see ``write_fixtures.py``) is
unpacked where no path of the writer's holds, its work finished with today's code as a
user would (the CLI), and the answer checked against an oracle over all the input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.compat.write_fixtures import (
    BATCH,
    EVENTS,
    FIXTURES,
    TIMERANGE_FROM,
    TIMERANGE_TO,
    events,
    riverbed,
    write_events,
)

MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())


def unpack(name: str, into: Path) -> Path:
    with tarfile.open(FIXTURES / f"{name}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into


def stream_oracle() -> pd.DataFrame:
    """Every (hour, flag) of all the events: what the result table must hold."""
    frame = events()
    frame["window_start"] = frame["ts"].dt.floor("1h")
    return (
        frame.groupby(["window_start", "flag"])
        .agg(
            users=("user_id", "nunique"),
            events=("user_id", "size"),
            amount=("amount", "sum"),
            top=("amount", "max"),
        )
        .reset_index()
        .rename(columns={"flag": "key"})
    )


def only_the_snapshot(root: Path) -> None:
    """Drop the changelogs a snapshot covers (versions 1 and 2), so state can only be
    restored through the writer's snapshot format."""
    dropped = [p for v in (1, 2) for p in root.glob(f"state/flags/*/changelog/{v:020d}.rbcl")]
    assert len(dropped) == 6  # 3 partitions
    assert len(list(root.glob("state/flags/*/snapshot/*"))) == 3
    for path in dropped:
        path.unlink()


def finish_stream(work: Path, env: dict[str, str]) -> None:
    """The second half of the events, then the old checkpoint resumed to the end; the
    result table (as `riverbed query` shows it) equals the oracle over all events."""
    write_events(f"file://{work / 'home' / 'log'}", events().iloc[EVENTS // 2 :])
    run = ("stream", "run", "flags.py", "--once", f"--max-records-per-batch={BATCH}")
    text = riverbed(work, env, *run)
    assert "resuming from the checkpoint: batches up to 2 are committed; next is 3" in text
    assert "batch 5: 200 records, 0 late, 0 malformed" in text
    shown = riverbed(work, env, "query", "flags", "--json").splitlines()
    rows = [json.loads(line) for line in shown if line.startswith("{")]
    got = pd.DataFrame(rows)
    got["window_start"] = pd.to_datetime(got["window_start"])
    got = got[["window_start", "key", "users", "events", "amount", "top"]]
    want = stream_oracle()
    keys = ["window_start", "key"]
    got, want = (f.sort_values(keys).reset_index(drop=True) for f in (got, want))
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def hopping_oracle() -> pd.DataFrame:
    """Every (2-hour window starting each half hour, flag) of all the events."""
    frame = events()
    newest = frame["ts"].dt.floor("30min")
    parts = [frame.assign(window_start=newest - pd.Timedelta(minutes=30 * i)) for i in range(4)]
    return (
        pd.concat(parts)
        .groupby(["window_start", "flag"])
        .agg(events=("user_id", "size"), amount=("amount", "sum"), top=("amount", "max"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )


@pytest.mark.spark
def test_a_hopping_windows_checkpoint_keeps_one_value_per_window(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """State written before it held panes (riverbed.stream.panes) holds one value per
    window: resumed, it goes on that way — read as panes, each window would be the
    merge of four windows' counts — for the result table and for a read of the state."""
    work = unpack("stream-hopping", tmp_path / "moved")
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(work / "home"),
        "RIVERBED_SPARK_MASTER": "local[2]",
    }
    write_events(f"file://{work / 'home' / 'log'}", events().iloc[EVENTS // 2 :])
    run = ("stream", "run", "hops.py", "--once", f"--max-records-per-batch={BATCH}")
    text = riverbed(work, env, *run)
    assert "resuming from the checkpoint: batches up to 3 are committed; next is 4" in text
    want = hopping_oracle()
    keys = ["window_start", "key"]
    for how in (("hops", "--json"), ("hops.py", "--from-state", "--json")):
        shown = riverbed(work, env, "query", *how).splitlines()
        got = pd.DataFrame([json.loads(line) for line in shown if line.startswith("{")])
        got["window_start"] = pd.to_datetime(got["window_start"])
        got = got[["window_start", "key", "events", "amount", "top"]]
        got = got.sort_values(keys).reset_index(drop=True)
        pd.testing.assert_frame_equal(
            got, want.sort_values(keys).reset_index(drop=True), check_dtype=False
        )
    shapes = list((work / "home" / "checkpoints" / "hops" / "riverbed" / "specs").glob("*.json"))
    assert shapes and all("state_layout" not in json.loads(p.read_text()) for p in shapes)


@pytest.mark.spark
@pytest.mark.parametrize("fixture", ["stream-dir", "stream-dir-snapshots"])
def test_a_stream_checkpoint_in_a_directory_resumes(
    tmp_path: Path, subprocess_env: dict[str, str], fixture: str
) -> None:
    work = unpack(fixture, tmp_path / "moved")
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(work / "home"),
        "RIVERBED_SPARK_MASTER": "local[2]",
    }
    finish_stream(work, env)


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.parametrize("fixture", ["stream-bucket", "stream-bucket-snapshots"])
def test_a_stream_checkpoint_in_a_bucket_resumes(
    s3_url: str,  # first: it puts the S3 server's settings in the environment subprocess_env copies
    tmp_path: Path,
    subprocess_env: dict[str, str],
    fixture: str,
) -> None:
    from riverbed.storage import open_store

    work = unpack(fixture, tmp_path / "moved")
    if fixture.endswith("-snapshots"):
        only_the_snapshot(work / "bucket")
    store = open_store(s3_url)  # another bucket prefix than the writer's
    objects = sorted(p for p in (work / "bucket").rglob("*") if p.is_file())
    for path in objects:
        store.put(path.relative_to(work / "bucket").as_posix(), path.read_bytes())
    assert len(objects) >= 20
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(work / "home"),
        "RIVERBED_SPARK_MASTER": "local[2]",
        "RIVERBED_CHECKPOINTS": s3_url,
    }
    finish_stream(work, env)


@pytest.mark.spark
def test_a_half_done_time_range_job_finishes_equal_to_pandas(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    from riverbed.demo.timerange import worst_difference
    from riverbed.jobs.timerange import load_spec
    from riverbed.timerange.oracle import pandas_rows

    work = unpack("timerange-half", tmp_path / "moved")
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(work / "home"),
        "RIVERBED_CONTROL": f"sqlite:///{work / 'control.db'}",
        "RIVERBED_SPARK_MASTER": "local[2]",
    }
    before = json.loads(riverbed(work, env, "timerange", "--json", "status", "sensors.py"))
    assert before["chunks_done"] == 3 and before["done_to"] == "2026-01-01T01:30:00Z", before
    run = ("timerange", "run", "sensors.py", "--from", TIMERANGE_FROM, "--to", TIMERANGE_TO)
    riverbed(work, env, *run, "--batch", "1")
    after = json.loads(riverbed(work, env, "timerange", "--json", "status", "sensors.py"))
    assert after["chunks_done"] == 6 and after["done_to"] == "2026-01-01T03:00:00Z", after
    files = sorted((work / "out" / "rows").glob("*/part.parquet"))
    assert len(files) == 6
    got = pd.concat(pq.read_table(f).to_pandas() for f in files)
    inputs = pd.concat(
        pq.read_table(f).to_pandas() for f in sorted((work / "readings").glob("*/*.parquet"))
    )
    spec = load_spec(work / "sensors.py")
    assert len(got) == len(inputs)
    assert worst_difference(got, pandas_rows(spec.job, inputs)) < 1e-9


@pytest.mark.slow
def test_a_jobs_database_keeps_its_runs_and_a_worker_finishes_the_queued_one(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    work = unpack("jobs-db", tmp_path / "moved")
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(work / "home"),
        "RIVERBED_JOBS_DB": f"sqlite:///{work / 'jobs.db'}",
        "RIVERBED_JOBS_DIR": str(work / "jobs"),
        "RIVERBED_CONTROL": f"sqlite:///{work / 'control.db'}",
        # a worker that does not stop is sent SIGABRT below: every thread's stack
        # goes to its log, so a hang names where it hangs
        "PYTHONFAULTHANDLER": "1",
    }

    def runs() -> dict[int, str]:
        listed = json.loads(riverbed(work, env, "jobs", "--json", "list"))
        return {int(r["id"]): r["state"] for r in listed}

    def chunks() -> list[tuple[int, str]]:
        listed = json.loads(riverbed(work, env, "jobs", "--json", "list", "--chunks"))
        return sorted((int(r["master"]), r["state"]) for r in listed)

    # run 1 (chunks 2-4) done; run 5 (chunks 6-8) waiting for a worker
    assert runs() == {1: "DONE", 5: "MASTER"}
    assert chunks() == [(1, "DONE")] * 3 + [(5, "PENDING")] * 3
    # the worker's log goes to a file: a pipe nobody reads while the test waits would
    # block a worker that logs more than the pipe holds, and look like a hang
    log = tmp_path / "worker.log"
    with open(log, "w") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli.main", "worker"],
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while runs()[5] != "DONE":
            assert worker.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, (
                f"run 5 is {runs()[5]} after 120 s; the worker's log ends:\n"
                + log.read_text()[-4000:]
            )
            time.sleep(0.5)
    finally:
        # SIGTERM, as a supervisor stops a worker (the CLI unwinds on it as on Ctrl-C):
        # not SIGINT, which a worker started with SIGINT ignored — under a shell's
        # background job, as this suite often runs — never sees
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGABRT)  # faulthandler: the stacks, then gone
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            raise AssertionError(
                "the worker did not stop within 60 s of SIGTERM; its log ends:\n"
                + log.read_text()[-4000:]
            ) from None
    published = {
        p.name: p.read_text()
        for p in (work / "home" / "jobs" / "output" / "squares").glob("chunk=*/square=*.txt")
    }
    assert published == {f"square={i}.txt": str(i * i) for i in range(1, 13)}
