"""``riverbed demo`` (the stream main job), ``demo jobs`` and ``demo timerange`` as a new
user runs them: real processes, SIGKILLs, no Spark noise on the terminal; and the
time-range CLI's one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import assert_quiet

pytestmark = pytest.mark.slow


def demo(home: Path, env: dict[str, str], *args: str) -> str:
    """Run ``riverbed demo ARGS`` with its home in ``home``; returns what it printed."""
    env = {**env, "RIVERBED_HOME": str(home), "COLUMNS": "140"}
    out = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert_quiet(out.stderr)  # Spark's noise and the drivers' goes to RIVERBED_HOME/logs
    return text


def test_the_stream_demo_survives_a_sigkill_and_equals_pandas(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "RIVERBED_SPARK_MASTER": "local[2]"}
    env.pop("RIVERBED_CONTROL", None)
    text = demo(tmp_path / "home", env, "stream", "--events", "4000")
    assert "SIGKILL the driver after" in text and "resumes from the checkpoint" in text
    assert "exact distinct users: IDENTICAL to the independent answer" in text
    assert "HLL distinct users: WITHIN the error bound" in text
    assert "batch 0: 400 records" in text  # the driver's own lines still reach the terminal
    # every batch that committed has its line, those the killed driver never printed too
    lines = text.splitlines()
    for batch in range(10):
        assert any(line.startswith(f"batch {batch}: 400 records") for line in lines), batch
    # the jump in terms is explained, not left to the reader
    assert "took over from term" in text and "it only grows, and skips the" in text
    # a typed topic: the producer refuses malformed values, naming field and reason
    assert "field 'user_id' is 'x', which is not a long" in text
    assert "3 malformed records refused → clicks.rejected" in text
    assert "malformed 3 = 4,003 of 4,003 produced" in text
    assert list((tmp_path / "home" / "logs").glob("demo-stream-*.log"))


@pytest.mark.s3
def test_the_durable_demo_loses_the_machine_and_resumes_from_the_bucket(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """``riverbed demo --durable s3`` as a new user runs it: no AWS settings, so it
    starts its own S3 server; after the SIGKILL the driver's machine directory is
    deleted, and a driver on a fresh one finishes from the bucket alone."""
    env = {**subprocess_env, "RIVERBED_SPARK_MASTER": "local[2]"}
    for name in [k for k in env if k.startswith("AWS_")] + ["RIVERBED_CONTROL"]:
        env.pop(name, None)
    home = tmp_path / "home"
    text = " ".join(demo(home, env, "stream", "--events", "4000", "--durable", "s3").split())
    assert "checkpoints, state and results in s3://riverbed-demo/" in text
    assert "SIGKILL the driver after" in text
    assert f"deleted the driver's machine directory {home / 'demo' / 'machine-a'}" in text
    assert not (home / "demo" / "machine-a").exists()
    for kind in ("riverbed/commits/", "riverbed/terms/", "output/flags_hourly/", "state/"):
        assert kind in text, kind
    assert "it resumes from the bucket" in text and "batches up to" in text
    assert "exact distinct users: IDENTICAL to the independent answer" in text
    assert "malformed 3 = 4,003 of 4,003 produced" in text
    # nothing the restarted driver needed came from the first machine's disk
    assert not list((home / "demo" / "machine-b").rglob("batches"))


def test_the_jobs_demo_publishes_every_chunk_once_through_both_crashes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    text = demo(tmp_path / "home", subprocess_env, "jobs", "--days", "4")
    assert "SIGKILL worker-" in text and "SIGKILL orchestrator-" in text
    assert "each day's usage published exactly once: yes" in text
    assert "orchestrator failover: yes" in text
    assert "lost (worker-" in text  # the killed worker's attempt, then a second one
    published = sorted((tmp_path / "home" / "demo-jobs" / "jobs" / "output").glob("*/chunk=*"))
    assert len(published) == 4  # 2 daily chunks, 1 features, 1 report: one dir each


@pytest.mark.s3
def test_the_durable_jobs_demo_loses_a_workers_machine_and_publishes_in_the_bucket(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """``riverbed demo jobs --durable s3`` as a new user runs it: its own S3 server; the
    worker running a daily chunk is lost with its machine directory; every output is in
    the bucket, read back from there, each day once."""
    env = dict(subprocess_env)
    for name in [k for k in env if k.startswith("AWS_")] + ["RIVERBED_CHECKPOINTS"]:
        env.pop(name, None)
    home = tmp_path / "home"
    text = " ".join(demo(home, env, "jobs", "--days", "4", "--durable", "s3").split())
    assert "outputs published in s3://riverbed-demo/" in text
    lost = re.search(r"lost (worker-\d)'s machine while it runs chunk (\d+)", text)
    assert lost, text
    worker, chunk = lost.groups()
    machine = home / "demo-jobs" / f"machine-{worker[-1]}"
    assert f"{machine} deleted" in text and not machine.exists()
    assert f"chunk {chunk} re-queued" in text
    assert "each day's usage published exactly once: yes" in text
    assert "orchestrator failover: yes" in text
    for kind in ("usage_daily/.published/", "customer_features/.attempts/", "usage_report/"):
        assert kind in text, kind
    # nothing was published on this disk; the verdict read the bucket into its own dir
    assert not list((home / "demo-jobs").glob("**/jobs/output/*/chunk=*"))
    assert list((home / "demo-jobs" / "verdict" / "jobs" / "cache").rglob("*.parquet"))
    assert "AWS_SECRET_ACCESS_KEY" not in text and "secret" not in text.lower()


def test_the_timerange_demo_resumes_after_a_sigkill_and_equals_one_pass(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "RIVERBED_SPARK_MASTER": "local[2]"}
    # 3 h (6 chunks; the default is 6 h): the driver is SIGKILLed after 3 chunks either way
    text = demo(tmp_path / "home", env, "timerange", "--hours", "3")
    assert "SIGKILLed the driver after" in text
    assert "6 of 6, each once: yes" in text and "IDENTICAL" in text
    files = sorted((tmp_path / "home" / "demo-timerange" / "out" / "rows").glob("*/part.parquet"))
    assert len(files) == 6


def test_timerange_cli_errors_are_one_line(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    spec = tmp_path / "s.py"
    spec.write_text(
        "from riverbed.jobs.timerange import ParquetInput, Rolling, TimeRangeJob\n"
        f"job = TimeRangeJob(input=ParquetInput({str(tmp_path / 'in')!r}), key='k', time='t',\n"
        "                    metrics=[Rolling('1h', 'v')])\n"
    )
    env = {**subprocess_env, "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'c.db'}"}
    cases = [
        (["--from", "2026-01-02", "--to", "2026-01-01"], "is not before --to"),
        (["--from", "2026-01-01", "--to", "2026-01-02", "--chunk", "7m"], "does not divide a day"),
        (["--from", "2026-01-01T00:10", "--to", "2026-01-02"], "not on a 1h edge"),
        (["--from", "2026-01-01", "--to", "2026-01-02"], "does not exist"),
    ]
    runs = [(["timerange", "run", str(spec), *extra], message, 1) for extra, message in cases]
    runs.append((["demo", "timerange", "--hours", "1"], "needs 2 to 168 hours", 2))  # usage
    whole_day = ["timerange", "run", str(spec), "--from", "2026-01-01", "--to", "2026-01-02"]
    runs.append(([*whole_day, "--batch", "0"], "argument --batch: must be a whole number", 2))
    for args, message, code in runs:
        out = subprocess.run(
            [sys.executable, "-m", "riverbed.cli.main", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == code, out.stderr
        lines = [line for line in out.stderr.splitlines() if "error:" in line]
        assert len(lines) == 1 and message in lines[0], out.stderr
        assert "Traceback" not in out.stderr
