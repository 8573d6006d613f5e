"""Orchestrators and workers of one jobs setup as child processes, for the process tests."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from riverbed.jobs.outputs import open_publication
from riverbed.jobs.queue import JobQueue

EFFECT = """
import json, os, pathlib, time
from riverbed.jobs import Job

def main(ctx, work_ids, sleep=0.0, fail_on=None):
    marks = pathlib.Path(os.environ["MARKS"])
    (marks / f"start-{ctx.chunk_id}-{ctx.attempt}").write_text(str(os.getpid()))
    if fail_on is not None and fail_on in work_ids:
        raise ValueError(f"poison work id {fail_on}")
    time.sleep(sleep)
    ctx.output.write_json("effect.json", {"ids": work_ids, "attempt": ctx.attempt})
    (marks / f"end-{ctx.chunk_id}-{ctx.attempt}").touch()

job = Job(main=main, chunk_size=2, retries=3, retry_backoff=0, bisect=True)
"""

SLOW = """
import os, pathlib, time
from riverbed.jobs import Job

def main(ctx, work_ids):
    marks = pathlib.Path(os.environ["MARKS"])
    (marks / f"start-{ctx.chunk_id}-{ctx.attempt}").touch()
    time.sleep(60)
    (marks / f"end-{ctx.chunk_id}-{ctx.attempt}").touch()

job = Job(main=main, timeout="2s")
"""


SPARKY = """
import os
from riverbed.jobs import Job

def stuck(rows, marks=os.environ["MARKS"]):
    # a Python task: it runs in a worker forked by PySpark's daemon (its own group)
    open(os.path.join(marks, f"pyworker-{os.getpid()}"), "w").close()
    import time
    time.sleep(600)
    yield 1

def main(ctx, work_ids, hang=None):
    if hang:
        ctx.spark.sparkContext.parallelize([0], 1).mapPartitions(stuck).collect()
    n = ctx.spark.range(0, 1000 * len(work_ids)).count()
    ctx.output.write_json("effect.json", {"ids": work_ids, "attempt": ctx.attempt,
                                           "app": ctx.spark.sparkContext.applicationId,
                                           "pid": os.getpid(), "count": n,
                                           "partitions": ctx.spark.conf.get(
                                               "spark.sql.shuffle.partitions")})

job = Job(main=main, chunk_size=1, kind="spark")
"""

TIMERANGE = """
from riverbed.jobs.timerange import Cumulative, ParquetInput, Rolling, TimeRangeJob

metrics = TimeRangeJob(
    input=ParquetInput("input", partition="hour"),
    key="sensor", time="ts",
    metrics=[Rolling("45min", "value", ["mean", "count"]), Cumulative("value", ["sum"])],
    output="trout", chunk="1h",
)
job = metrics.as_job(start="2026-01-01", retries=1, retry_backoff=0)
"""


class Cluster:
    """Orchestrators and workers of one jobs setup, as child processes."""

    def __init__(
        self, tmp: Path, env: dict[str, str], db: str | None = None, checkpoints: str | None = None
    ) -> None:
        self.tmp = tmp
        self.checkpoints = checkpoints  # a bucket: outputs are published there
        (tmp / "jobs").mkdir()
        (tmp / "jobs" / "effect.py").write_text(EFFECT)
        (tmp / "jobs" / "slow.py").write_text(SLOW)
        # the same code with a timeout no slow machine reaches before a cancel lands
        # (a CLI call takes ~3 s where Python starts slowly; `slow` times out after 2 s)
        (tmp / "jobs" / "patient.py").write_text(SLOW.replace('timeout="2s"', 'timeout="60s"'))
        (tmp / "jobs" / "sparky.py").write_text(SPARKY)
        (tmp / "jobs" / "readings.py").write_text(TIMERANGE)
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.home = tmp / "home"
        self.db = db or f"sqlite:///{tmp / 'jobs.db'}"
        self.control = f"sqlite:///{tmp / 'control.db'}"
        self.env = {
            **env,
            "RIVERBED_HOME": str(self.home),
            "RIVERBED_JOBS_DIR": str(tmp / "jobs"),
            "RIVERBED_JOBS_DB": self.db,
            "RIVERBED_CONTROL": self.control,
            "MARKS": str(self.marks),
            "RIVERBED_SPARK_MASTER": "local[1]",
        }
        if checkpoints:
            self.env["RIVERBED_CHECKPOINTS"] = checkpoints
        self.procs: list[subprocess.Popen[bytes]] = []
        self.command = [sys.executable, "-m", "riverbed.cli.main"]

    @functools.cached_property
    def queue(self) -> JobQueue:
        """The test's own view of the jobs database (made on first use, so processes
        can be the first to meet a fresh database)."""
        return JobQueue(self.db)

    def start(self, *args: str, home: Path | None = None) -> subprocess.Popen[bytes]:
        """A riverbed command as a child process; ``home``: its own RIVERBED_HOME (a
        machine of its own, whose disk the test may throw away)."""
        name = "-".join(args[:1]) + f"-{len(self.procs)}"
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        env = self.env if home is None else {**self.env, "RIVERBED_HOME": str(home)}
        proc = subprocess.Popen(
            [*self.command, *args],
            env=env,
            cwd=self.tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def worker(self, *extra: str, home: Path | None = None) -> subprocess.Popen[bytes]:
        return self.start("worker", "--ttl", "2", *extra, home=home)

    def orchestrator(self, name: str) -> subprocess.Popen[bytes]:
        return self.start("orchestrator", "--ttl", "2", "--name", name)

    def cli(self, *args: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "riverbed.cli.main", "jobs", *args, "--json"],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            check=True,
        )
        parsed: dict[str, Any] = json.loads(out.stdout)
        return parsed

    def marks_of(self, kind: str) -> list[str]:
        return sorted(p.name for p in self.marks.glob(f"{kind}-*"))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if "queue" in self.__dict__:
            self.queue.close()


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_state(c: Cluster, run: int) -> str:
    return str(c.queue.get(run)["state"])


def published(c: Cluster, job: str = "effect", name: str = "effect.json") -> dict[int, Any]:
    """The published output of each chunk of ``job``: its one file matching ``name``
    (under the cluster's home, or in its bucket)."""
    pub = open_publication(c.home, c.checkpoints)
    found = {}
    for chunk in sorted(pub.chunks(job)):
        (path,) = pub.published_files(job, chunk, name).values()
        found[chunk] = json.loads(path.read_text())
    return found
