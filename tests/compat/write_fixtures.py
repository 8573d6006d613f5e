"""Write the old-format fixtures: what a user's riverbed left on disk and in a bucket,
so a change of a format is tested against data the released code really wrote.

Run it with the riverbed whose formats are to be kept — the commit before a format
changes — from a checkout's root::

    .venv/bin/python -m tests.compat.write_fixtures [--only NAME ...]

Each fixture is ``tests/compat/fixtures/<name>.tar.gz``, stopped half way through its
work; ``MANIFEST.json`` says which commit wrote it and when. ``test_old_formats.py``
unpacks each, finishes the work with today's code and checks the answer against an
oracle over all the input. Keep old fixtures when adding new ones: a format must stay
readable as long as a user may hold it.

Fixtures (the events and readings are seeded, so the writer and the test agree):

- ``stream-dir``: a stream aggregation's checkpoint, state changelogs and result table
  in a directory, after the first half of a topic's events (3 batches);
- ``stream-bucket``: the same with checkpoints, state and results in a bucket (its
  objects as files under ``bucket/``; the test puts them back into its S3 server);
- ``stream-dir-snapshots``, ``stream-bucket-snapshots``: the same with a state snapshot
  every 2 versions, so a restore reads a snapshot of the writer's format;
- ``stream-hopping``: a hopping window's aggregation in a directory after the first half
  (3 batches), written before state held panes: one value per window and key, which
  the checkpoint keeps (riverbed.stream.panes);
- ``timerange-half``: a time-range job with 3 of its 6 chunks published (output files
  and the control plane's SQLite database with the chunk records);
- ``jobs-db``: a jobs database (SQLite) with one run DONE and one submitted, and the
  done run's published outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from tests.cli import run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]

T0 = datetime(2026, 11, 21, tzinfo=UTC)
EVENTS = 1200  # the stream fixtures: the first half before, the second after
BATCH = 200

STREAM_SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"users": Distinct("user_id"), "events": Count(), "amount": Sum("amount"),
             "top": Max("amount")},
    state_partitions=3,
)
"""

HOPPING_SPEC = """
from riverbed.stream import Aggregation, Count, Hopping, Max, Sum

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="hops", key="flag", time="ts", window=Hopping("2h", "30m"), watermark="5h",
    metrics={"events": Count(), "amount": Sum("amount"), "top": Max("amount")},
    state_partitions=3,
)
"""

TIMERANGE_SPEC = """
from riverbed.jobs.timerange import Cumulative, ParquetInput, Rolling, TimeRangeJob, Tumbling

job = TimeRangeJob(
    input=ParquetInput("readings", partition="hour"),
    key="sensor", time="ts",
    metrics=[Rolling("45min", "value", ["mean", "max"]), Cumulative("value", ["sum", "count"])],
    tumbling=[Tumbling("30min", "value", ["mean", "count"])],
    output="out", chunk="30m",
)
"""
TIMERANGE_FROM, TIMERANGE_HALF, TIMERANGE_TO = (
    "2026-01-01",
    "2026-01-01T01:30Z",
    "2026-01-01T03:00Z",
)

JOB = """
from riverbed.jobs import Job

def main(ctx, work_ids):
    for i in work_ids:
        ctx.output.write_text(f"square={i}.txt", str(i * i))

job = Job(main=main, kind="python", chunk_size=2)
"""


def events(n: int = EVENTS, seed: int = 0) -> pd.DataFrame:
    """The stream fixtures' events (the tests' usual shape: a flag key, users, amounts)."""
    rng = np.random.default_rng(seed)
    ts = T0 + pd.to_timedelta(np.sort(rng.integers(0, 4 * 3_600_000, n)), unit="ms")
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, 400, n),
            "flag": [f"f{i}" for i in rng.zipf(1.6, n) % 7],
            "amount": rng.integers(1, 100, n).astype(float),
            "ts": ts,
        }
    )


def write_events(log_url: str, frame: pd.DataFrame) -> None:
    import riverbed.log

    log = riverbed.log.open(log_url)
    if "events" not in log.topics():
        log.create_topic("events", 3)
    log.producer("events").send_batch(
        [
            {"user_id": int(u), "flag": f, "amount": a, "ts": t.isoformat()}
            for u, f, a, t in frame[["user_id", "flag", "amount", "ts"]].itertuples(index=False)
        ],
        key_field="flag",
    )
    log.close()


def riverbed(cwd: Path, env: dict[str, str], *args: str) -> str:
    """``riverbed ARGS`` as a user runs it, in ``cwd``; what it printed (both streams).
    A failure raises, with its output: the writer stops, a test fails."""
    run = run_cli(*args, env=env, timeout=600, cwd=cwd)
    if run.returncode != 0:
        raise RuntimeError(f"riverbed {' '.join(args)} failed:\n{run.stdout}\n{run.stderr[-3000:]}")
    return run.stdout + run.stderr


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERBED_")}
    return env | {"RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}


def stream_dir(work: Path, *options: str) -> list[str]:
    (work / "flags.py").write_text(STREAM_SPEC)
    write_events(f"file://{work / 'home' / 'log'}", events().iloc[: EVENTS // 2])
    env = base_env(work / "home")
    run = ("stream", "run", "flags.py", "--once", f"--max-records-per-batch={BATCH}")
    riverbed(work, env, *run, *options)
    return ["flags.py", "home/log", "home/checkpoints", "home/output"]


def stream_hopping(work: Path) -> list[str]:
    (work / "hops.py").write_text(HOPPING_SPEC)
    write_events(f"file://{work / 'home' / 'log'}", events().iloc[: EVENTS // 2])
    env = base_env(work / "home")
    run = ("stream", "run", "hops.py", "--once", f"--max-records-per-batch={BATCH}")
    riverbed(work, env, *run)
    return ["hops.py", "home/log", "home/checkpoints", "home/output"]


def stream_bucket(work: Path, *options: str) -> list[str]:
    from riverbed.storage import open_store
    from riverbed.testing.s3 import CephS3Server

    (work / "flags.py").write_text(STREAM_SPEC)
    write_events(f"file://{work / 'home' / 'log'}", events().iloc[: EVENTS // 2])
    with CephS3Server() as server:
        server.create_bucket("riverbed-compat")
        env = base_env(work / "home") | server.env()
        env["RIVERBED_CHECKPOINTS"] = "s3://riverbed-compat/rb"
        run = ("stream", "run", "flags.py", "--once", f"--max-records-per-batch={BATCH}")
        riverbed(work, env, *run, *options)
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            store = open_store("s3://riverbed-compat/rb")
            for info in store.list(""):
                target = work / "bucket" / info.key
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(store.get(info.key))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return ["flags.py", "home/log", "bucket"]


def timerange_half(work: Path) -> list[str]:
    from riverbed.demo.timerange import generate_readings

    generate_readings(work / "readings", hours=3, sensors=20)  # stored in the fixture
    (work / "sensors.py").write_text(TIMERANGE_SPEC)
    env = base_env(work / "home") | {"RIVERBED_CONTROL": f"sqlite:///{work / 'control.db'}"}
    args = ("timerange", "run", "sensors.py", "--from", TIMERANGE_FROM, "--to", TIMERANGE_HALF)
    riverbed(work, env, *args, "--batch", "1")
    return ["sensors.py", "readings", "out", "control.db"]


def jobs_db(work: Path) -> list[str]:
    (work / "jobs").mkdir()
    (work / "jobs" / "squares.py").write_text(JOB)
    env = base_env(work / "home") | {
        "RIVERBED_JOBS_DB": f"sqlite:///{work / 'jobs.db'}",
        "RIVERBED_JOBS_DIR": str(work / "jobs"),
        "RIVERBED_CONTROL": f"sqlite:///{work / 'control.db'}",
    }
    riverbed(work, env, "jobs", "run", "squares", "--work-ids", "1-6")  # run 1, here, to DONE
    riverbed(work, env, "jobs", "submit", "squares", "--work-ids", "7-12")  # run 2, queued
    return ["jobs", "jobs.db", "home/jobs/output"]


SNAPSHOTS = ("--snapshot-every", "2")

WRITERS = {
    "stream-dir": stream_dir,
    "stream-bucket": stream_bucket,
    "stream-dir-snapshots": lambda work: stream_dir(work, *SNAPSHOTS),
    "stream-bucket-snapshots": lambda work: stream_bucket(work, *SNAPSHOTS),
    "stream-hopping": stream_hopping,
    "timerange-half": timerange_half,
    "jobs-db": jobs_db,
}


def commit() -> str:
    run = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return run.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(WRITERS), default=sorted(WRITERS))
    args = parser.parse_args()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    manifest_path = FIXTURES / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix=f"riverbed-compat-{name}-") as tmp:
            work = Path(tmp)
            parts = WRITERS[name](work)
            for lock in work.rglob("*.lock"):  # a process's, not the format's
                lock.unlink()
            archive = FIXTURES / f"{name}.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                for part in parts:
                    tar.add(work / part, arcname=part)
            manifest[name] = {
                "commit": commit(),
                "written": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "bytes": archive.stat().st_size,
            }
            print(f"{archive.relative_to(ROOT)}: {archive.stat().st_size:,} bytes")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
