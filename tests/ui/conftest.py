"""A riverbed home with something in every part, for the console's tests: a topic with
records, a consumer group with committed offsets and a live member, a held lock and a
leader, and a jobs database with a run that succeeded, one that failed (with its
traceback and log) and one still queued."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import riverbed.log
from riverbed.config import Config
from riverbed.control import Election, Lock, Session, connect
from tests.cli import run_cli

JOB = """from riverbed.jobs import Job

def main(ctx, work_ids, **kwargs):
    print(f"working on {{work_ids}}", flush=True)
    if kwargs.get("fail"):
        raise RuntimeError("asked to fail")

job = Job(main=main, chunk_size={chunk})
"""


@dataclass
class Home:
    root: Path
    config: Config
    env: dict[str, str]
    records: int = 300
    committed: int = 0
    failed_run: int = 0
    done_run: int = 0
    kwargs_run: int = 0
    queued_run: int = 0
    holds: list[Any] = field(default_factory=list)


def _run_id(out: subprocess.CompletedProcess[str]) -> int:
    # "run 3: 2 chunk(s) ..." on the first line
    first = out.stdout.strip().splitlines()[0]
    return int(first.split()[1].rstrip(":"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    import json
    import os
    import sys
    import time

    from riverbed.jobs.reads import QueueReader

    root = tmp_path_factory.mktemp("console")
    jobs_dir = root / "jobs"
    jobs_dir.mkdir()
    (jobs_dir / "daily.py").write_text(JOB.format(chunk=3))
    (jobs_dir / "hourly.py").write_text(JOB.format(chunk=2))
    config = Config(
        home=root / "home",
        control=f"sqlite:///{root / 'control.db'}",
        jobs_db=f"sqlite:///{root / 'jobs.db'}",
        jobs_dir=jobs_dir,
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RIVERBED_HOME": str(config.home),
        "RIVERBED_CONTROL": config.control,
        "RIVERBED_JOBS_DB": config.jobs_db,
        "RIVERBED_JOBS_DIR": str(jobs_dir),
    }
    h = Home(root=root, config=config, env=env)

    log = riverbed.log.open(config.log_url)
    log.create_topic("clicks", 3)
    log.producer("clicks").send_batch(
        [{"user": i, "flag": f"flag-{i % 5:02d}", "n": i} for i in range(h.records)],
        key_field="flag",
    )
    log.create_topic("empty", 2)
    cp = connect(config.control_url)
    with log.consumer(cp, "readers", "clicks", session_ttl=30) as consumer:
        got = 0
        while got < 120:
            got += len(consumer.poll(timeout=2, max_records=120 - got))
        consumer.commit()
    h.committed = got
    # a live member of another group, a held lock and an elected leader while tests run
    member = log.consumer(cp, "watchers", "clicks", session_ttl=30)
    member.poll(timeout=2, max_records=1)
    session = Session(cp, ttl=30)
    lock = Lock(session, "nightly-compaction")
    lock.acquire()
    election = Election(cp, "orchestrator", session)
    election.campaign(json.dumps({"driver": "host-a:1", "since": "now"}).encode())
    # a host with a live log server on it (the worker's host, further down, is seen and
    # then left: down)
    from riverbed.control.processes import announce

    announce(session, "log-server", {"url": "flight://host-b:8815"}, host="host-b")
    h.holds = [member, lock, election, session]

    ok = run_cli("jobs", "run", "daily", "--work-ids", "1-6", env=env)
    assert ok.returncode == 0, ok.stderr
    h.done_run = _run_id(ok)
    with_kwargs = run_cli(
        "jobs", "run", "daily", "--work-ids", "10-12", "--kwarg", "region=eu", env=env
    )
    assert with_kwargs.returncode == 0, with_kwargs.stderr
    h.kwargs_run = _run_id(with_kwargs)
    # the failing run goes through a real worker: its attempt logs to a file the page tails
    bad = run_cli("jobs", "submit", "hourly", "--work-ids", "1-2", "--kwarg", "fail=true", env=env)
    assert bad.returncode == 0, bad.stderr
    h.failed_run = _run_id(bad)
    worker = subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "worker", "--ttl", "5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    reader = QueueReader(config.jobs_db_url)
    try:
        deadline = time.monotonic() + 60
        while reader.state(h.failed_run) == "MASTER" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reader.state(h.failed_run) == "FAILED"
    finally:
        worker.terminate()
        worker.wait(30)
        reader.close()
    queued = run_cli("jobs", "submit", "daily", "--work-ids", "7-9", env=env)
    assert queued.returncode == 0, queued.stderr
    h.queued_run = _run_id(queued)
    yield h
    member.close()
    lock.release()
    session.close()
    cp.close()
    log.close()
