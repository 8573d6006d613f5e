"""``riverbed demo jobs``: a data pipeline run by real processes, through two crashes.

1. Write two weeks of per-customer usage events to a riverbed log topic (``usage``).
2. Start two orchestrators (one is elected, one stands by) and three workers, each a
   separate process (``riverbed orchestrator`` / ``riverbed worker``).
3. Submit ``usage_report`` for the two weeks. The jobs are in ``examples/jobs/``:
   ``usage_daily`` (Spark, two days a chunk) → ``customer_features`` (a week a
   chunk) → ``usage_report`` (one chunk); riverbed resolves the graph into chunks.
4. SIGKILL the worker running the first daily chunk, mid-chunk. Its lease expires,
   the orchestrator re-queues the chunk, another worker runs attempt 2. (The killed
   worker's executor may still finish attempt 1 — as a zombie: it can neither record
   nor publish.)
5. SIGKILL the leading orchestrator. The standby is elected with a higher term and
   takes over; the dead one's term is fenced out of the database.
6. A closing table: every chunk, its attempts, and its published effect — checked
   against the events themselves: each day's usage published exactly once, the
   features and the report adding up to what was produced.

Everything lives in ``<RIVERBED_HOME>/demo-jobs/`` (SQLite jobs database and control
plane, file log, outputs), recreated on each run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import riverbed
from riverbed.config import Config
from riverbed.jobs.publication import job_output_dir, staging_root
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.runs import plan, submit
from riverbed.jobs.spec import Catalog

console = Console(highlight=False, width=max(Console().width, 110))

FIRST_DAY = date(2026, 11, 1)


def examples_dir() -> Path:
    """``examples/jobs`` of the checkout riverbed runs from."""
    root = Path(riverbed.__file__).resolve().parents[2] / "examples" / "jobs"
    if not (root / "usage_daily.py").exists():
        raise FileNotFoundError(
            f"the example jobs are not at {root}; run the demo from a riverbed checkout "
            "(pip install -e . there, as make bootstrap does)"
        )
    return root


def day_id(d: date) -> int:
    return int(d.strftime("%Y%m%d"))


def produce(log_url: str, days: list[int], customers: int, per_day: int) -> dict[int, int]:
    """Usage events into the ``usage`` topic of the log at ``log_url`` (the one the
    jobs read: ``RIVERBED_LOG``); returns the units per day (the oracle)."""
    import riverbed.log

    rng = random.Random(7)  # noqa: S311 - demo data, reproducible
    log = riverbed.log.open(log_url)
    log.create_topic("usage", partitions=4, serde="json")
    producer = log.producer("usage")
    units: Counter[int] = Counter()
    weights = [1.0 / (i + 1) for i in range(customers)]  # a few big customers
    for day in days:
        picks = rng.choices(range(customers), weights=weights, k=per_day)
        batch = []
        for c in picks:
            u = rng.randint(1, 20)
            units[day] += u
            batch.append({"customer": f"c{c:04d}", "day": day, "units": u})
        producer.send_batch(batch, key_field="customer")
    log.close()
    return dict(units)


class Processes:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (home / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str) -> None:
        out = open(self.home / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - the child's
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli.main", *args],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def name_of(self, pid: int) -> str:
        return next((n for n, p in self.procs.items() if p.pid == pid), f"pid {pid}")

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def worker_pid(worker_id: str | None) -> int | None:
    """Worker ids are ``<host>-<pid>-<random>``."""
    if not worker_id:
        return None
    try:
        return int(worker_id.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return None


def run_demo_jobs(
    config: Config, days: int = 14, customers: int = 300, per_day: int = 4000, pace: float = 2.0
) -> int:
    home = (config.home / "demo-jobs").resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    jobs_dir = examples_dir()
    day_ids = [day_id(FIRST_DAY + timedelta(days=i)) for i in range(days)]
    env = {
        **os.environ,
        "RIVERBED_HOME": str(home),
        "RIVERBED_JOBS_DIR": str(jobs_dir),
        "RIVERBED_JOBS_DB": f"sqlite:///{home / 'jobs.db'}",
        "RIVERBED_CONTROL": f"sqlite:///{home / 'control.db'}",
        "RIVERBED_LOG": f"file://{home / 'log'}",  # the usage topic, read by usage_daily
        "RIVERBED_SPARK_MASTER": "local[1]",
        "RIVERBED_DEMO_PACE": str(pace),
    }
    console.rule("[bold]riverbed jobs demo")
    console.print(f"home: [cyan]{home}[/cyan]   jobs: [cyan]{jobs_dir}[/cyan]")
    oracle = produce(env["RIVERBED_LOG"], day_ids, customers, per_day)
    console.print(
        f"produced {per_day * days:,} usage events for {customers} customers over {days} "
        f"days into topic [bold]usage[/bold]"
    )
    queue = JobQueue(env["RIVERBED_JOBS_DB"])
    procs = Processes(home, env)
    try:
        for name in ("orchestrator-1", "orchestrator-2"):
            procs.start(name, "orchestrator", "--ttl", "2", "--name", name)
        for i in range(1, 4):
            procs.start(f"worker-{i}", "worker", "--ttl", "2")
        catalog = Catalog(jobs_dir)
        ids = f"{day_ids[0]}-{day_ids[-1]}"
        master, planned = submit(catalog, queue, "usage_report", ids)
        console.print(
            f"\nsubmitted [bold]usage_report[/bold] for days {ids}: run {master}, "
            f"{len(planned.chunks)} chunks "
            + ", ".join(f"{n} {j}" for j, n in Counter(c.job for c in planned.chunks).items())
        )
        watch = _Watch(queue, procs, master)
        outcome = watch.run()
        watch.await_failover()
        if outcome != "DONE":
            console.print(f"[red]the run ended {outcome}[/red]; logs in {home / 'logs'}")
            return 1
        ok = closing_table(queue, procs, home, master, oracle, watch)
        again = plan(catalog, queue, "usage_report", ids)
        console.print(
            "\nplanned again now: "
            + (
                ", ".join(f"{c.job} {len(c.work_ids)} day(s)" for c in again.new_chunks)
                or "nothing"
            )
            + f" — {len(again.pruned)} dependency chunk(s) pruned as fresh (max_lag 1h)"
        )
    finally:
        procs.stop()
        queue.close()
    console.rule("[bold green]done" if ok else "[bold red]check failed")
    console.print(
        f"Look around: RIVERBED_JOBS_DB=sqlite:///{home / 'jobs.db'} riverbed jobs show {master}"
    )
    return 0 if ok else 1


class _Watch:
    """Follows the run, prints what happens, and causes the two crashes."""

    def __init__(self, queue: JobQueue, procs: Processes, master: int) -> None:
        self.queue, self.procs, self.master = queue, procs, master
        self.seen: dict[tuple[int, int, str], bool] = {}
        self.killed_worker: str | None = None
        self.killed_chunk: int | None = None
        self.killed_orchestrator: str | None = None
        self.terms: list[tuple[int, str]] = []
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        console.print(f"  [dim]{time.monotonic() - self.t0:6.1f}s[/dim]  {text}")

    def run(self, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._leader()
            graph = self.queue.graph(self.master)
            for c in graph:
                key = (int(c["id"]), int(c["attempt"]), str(c["state"]))
                if key in self.seen or (c["state"] in ("QUEUED", "PENDING") and c["attempt"] == 0):
                    continue
                self.seen[key] = True
                self._report(c)
            self._crashes(graph)
            state = self.queue.state(self.master)
            if state != "MASTER":
                self.say(f"run {self.master} ended [bold]{state}[/bold]")
                return state
            time.sleep(0.2)
        return "TIMED OUT"

    def await_failover(self, timeout: float = 20.0) -> None:
        """After the run: give the standby time to take over, if it has not yet."""
        deadline = time.monotonic() + timeout
        while self.killed_orchestrator and time.monotonic() < deadline:
            self._leader()
            if self.terms[-1][1] != self.killed_orchestrator:
                return
            time.sleep(0.2)

    def _leader(self) -> None:
        term, leader = self.queue.leader()
        if term and (not self.terms or self.terms[-1][0] != term):
            self.terms.append((term, leader))
            self.say(f"[bold]{leader}[/bold] leads the queue with term {term}")

    def _report(self, c: dict[str, Any]) -> None:
        span = _span(json.loads(c["work_ids"]))
        who = self.procs.name_of(worker_pid(c["worker"]) or -1)
        name = f"chunk {c['id']} {c['job']} [{span}] attempt {c['attempt']}"
        if c["state"] == "RUNNING":
            self.say(f"{name} runs on {who}")
        elif c["state"] == "DONE":
            self.say(f"[green]{name} done[/green]")
        elif c["state"] == "PENDING":
            self.say(f"[yellow]chunk {c['id']} re-queued[/yellow]: {c['error']}")
        else:
            self.say(f"[red]chunk {c['id']} {c['state']}[/red]: {c['error']}")

    def _crashes(self, graph: list[dict[str, Any]]) -> None:
        if self.killed_worker is None:
            for c in graph:
                started = c["started_at"]
                if c["job"] == "usage_daily" and c["state"] == "RUNNING" and started:
                    if self.queue.now() - float(started) < 1.0:
                        continue  # let it get going: the crash should land mid-chunk
                    name = self.procs.name_of(worker_pid(c["worker"]) or -1)
                    if name not in self.procs.procs:
                        continue
                    self.say(f"[red]SIGKILL {name}[/red] while it runs chunk {c['id']}")
                    self.procs.kill(name)
                    self.killed_worker, self.killed_chunk = name, int(c["id"])
                    return
            return
        if self.killed_orchestrator is None:
            redone = next((c for c in graph if c["id"] == self.killed_chunk), None)
            if redone is None or redone["attempt"] < 2:
                return  # first let the orchestrator re-queue the dead worker's chunk
            _, leader = self.queue.leader()
            if leader in self.procs.procs:
                self.say(f"[red]SIGKILL {leader}[/red], the leading orchestrator")
                self.procs.kill(leader)
                self.killed_orchestrator = leader


def _published(home: Path, job: str) -> dict[int, Path]:
    root = job_output_dir(home, job)
    return {int(d.name[6:]): d for d in root.glob("chunk=*")}


def _span(days: list[int]) -> str:
    """20261101…20261107 → 11-01…11-07."""

    def short(d: int) -> str:
        return f"{d // 100 % 100:02d}-{d % 100:02d}"

    return f"{short(days[0])}…{short(days[-1])}" if len(days) > 1 else short(days[0])


def _attempt(a: dict[str, Any], procs: Processes) -> str:
    who = procs.name_of(worker_pid(a["worker"]) or -1)
    state = "lost" if "lost" in (a["error"] or "") else a["state"].lower()
    return f"{a['attempt']} {state} ({who})"


def closing_table(
    queue: JobQueue,
    procs: Processes,
    home: Path,
    master: int,
    oracle: dict[int, int],
    watch: _Watch,
) -> bool:
    import pandas as pd

    graph = queue.graph(master)
    table = Table(title=f"run {master}: every chunk and its effect", title_justify="left")
    for col in ("chunk", "job", "days", "attempts", "output", "units", "expected", ""):
        table.add_column(
            col,
            justify="right" if col in ("units", "expected") else "left",
            no_wrap=col != "attempts",
        )
    ok = True
    day_files: Counter[int] = Counter()
    for c in graph:
        days = json.loads(c["work_ids"])
        attempts = queue.get(int(c["id"]))["attempts"]
        tries = " · ".join(_attempt(a, procs) for a in attempts)
        dirs = _published(home, c["job"])
        out = dirs.get(int(c["id"]))
        expected = sum(oracle[d] for d in days)
        units: int | None = None
        if out is not None:
            if c["job"] == "usage_daily":
                for d in days:
                    if (out / f"day={d}.parquet").exists():
                        day_files[d] += 1
                units = sum(
                    int(pd.read_parquet(f)["units"].sum()) for f in out.glob("day=*.parquet")
                )
            elif c["job"] == "customer_features":
                units = sum(int(pd.read_parquet(f)["units"].sum()) for f in out.glob("*.parquet"))
            else:
                units = int(json.loads((out / "report.json").read_text())["units"])
        good = c["state"] == "DONE" and out is not None and units == expected
        ok = ok and good
        table.add_row(
            str(c["id"]),
            c["job"],
            _span(days),
            tries,
            "1 dir" if out is not None else "[red]none[/red]",
            f"{units:,}" if units is not None else "-",
            f"{expected:,}",
            "[green]✓[/green]" if good else "[red]✗[/red]",
        )
    console.print()
    console.print(table)
    once = all(day_files[d] == 1 for d in oracle)
    staged = sorted(p.name for p in staging_root(home).glob("*"))
    verdict = "[green]yes[/green]" if once else "[red]no[/red]"
    console.print(
        f"each day's usage published exactly once: {verdict}"
        f"  ({len(oracle)} days, {sum(oracle.values()):,} units)"
    )
    if watch.killed_chunk is not None:
        console.print(
            f"chunk {watch.killed_chunk}: attempt 1 died with {watch.killed_worker}; "
            "attempt 2 is the one published"
            + (f"; unpublished zombie staging left: {', '.join(staged)}" if staged else "")
        )
    terms = ", ".join(f"{t} ({n})" for t, n in watch.terms)
    console.print(
        f"orchestrator terms: {terms}  (a term is the control plane's revision when the "
        "election was won: it only grows, and skips what other writes took meanwhile)"
    )
    failover = watch.killed_orchestrator is not None and len(watch.terms) >= 2
    console.print(
        "orchestrator failover: "
        + ("[green]yes[/green]" if failover else "[yellow]not exercised[/yellow]")
    )
    return ok and once and watch.killed_worker is not None
