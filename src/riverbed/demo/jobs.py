"""``riverbed demo jobs``: a data pipeline run by real processes, through two crashes.

1. Write two weeks of per-customer usage events to a riverbed log topic (``usage``).
2. Start two orchestrators (one is elected, one stands by) and three workers, each a
   separate process (``riverbed orchestrator`` / ``riverbed worker``).
3. Submit ``usage_report`` for the two weeks. The jobs are in ``riverbed/demo/jobs_examples/``:
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

With ``--durable s3`` the outputs are published in a bucket (``<checkpoints>/jobs/output``
— the tests' S3 server on loopback unless ``AWS_ENDPOINT_URL`` names one), each worker is
a machine of its own (its own directory and process group), and step 4 loses the whole
machine: the worker and everything it started are SIGKILLed and its directory deleted.
The dependent chunks read what they need from the bucket, and the closing table reads
every output back from the bucket into an empty directory.
"""

from __future__ import annotations

import contextlib
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

from riverbed.config import Config, child_environment
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import Publication, staging_root
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.runs import plan, submit
from riverbed.jobs.spec import Catalog

console = Console(highlight=False, width=max(Console().width, 110))

FIRST_DAY = date(2026, 11, 1)


def examples_dir() -> Path:
    """The demo's jobs, shipped inside the package (``riverbed/demo/jobs_examples``)."""
    return Path(__file__).resolve().parent / "jobs_examples"


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
        self.machines: dict[str, Path] = {}  # a process that is a machine of its own
        (home / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str, machine: Path | None = None) -> None:
        """Start ``riverbed ARGS``; with ``machine``, as a machine of its own: that
        directory is its home and it leads a process group (what it starts dies with it
        in :meth:`lose`)."""
        out = open(self.home / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - the child's
        env = self.env
        if machine is not None:
            machine.mkdir(parents=True, exist_ok=True)
            self.machines[name] = machine
            env = {**env, "RIVERBED_HOME": str(machine)}
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli.main", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=machine is not None,
        )

    def lose(self, name: str) -> Path:
        """Lose ``name``'s machine: SIGKILL it and everything it started, then delete its
        directory. Returns the directory."""
        proc, machine = self.procs[name], self.machines[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # its Spark JVM and Python workers may take a moment to go
        shutil.rmtree(machine, ignore_errors=True)
        return machine

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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_pid(worker_id: str | None) -> int | None:
    """Worker ids are ``<host>-<pid>-<random>``."""
    if not worker_id:
        return None
    try:
        return int(worker_id.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return None


def run_demo_jobs(
    config: Config,
    days: int = 14,
    customers: int = 300,
    per_day: int = 4000,
    pace: float = 2.0,
    durable: str = "file",
) -> int:
    """The demo (see the module doc); ``durable``: ``file`` (outputs on this disk) or
    ``s3`` (in a bucket, and the killed worker's machine lost with it)."""
    home = (config.home / "demo-jobs").resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    if durable == "s3":
        from riverbed.testing.s3 import demo_bucket

        with demo_bucket(home, console.print) as checkpoints:
            return _run(home, days, customers, per_day, pace, checkpoints)
    return _run(home, days, customers, per_day, pace)


def _run(
    home: Path, days: int, customers: int, per_day: int, pace: float, checkpoints: str | None = None
) -> int:
    jobs_dir = examples_dir()
    day_ids = [day_id(FIRST_DAY + timedelta(days=i)) for i in range(days)]
    env = child_environment(
        {
            "RIVERBED_HOME": str(home),
            "RIVERBED_JOBS_DIR": str(jobs_dir),
            "RIVERBED_JOBS_DB": f"sqlite:///{home / 'jobs.db'}",
            "RIVERBED_CONTROL": f"sqlite:///{home / 'control.db'}",
            "RIVERBED_LOG": f"file://{home / 'log'}",  # the usage topic, read by usage_daily
            "RIVERBED_SPARK_MASTER": "local[1]",
            "RIVERBED_DEMO_PACE": str(pace),
            # the bucket's own settings are in this process's environment (demo_bucket)
            "RIVERBED_CHECKPOINTS": checkpoints,
        }
    )
    console.rule("[bold]riverbed jobs demo")
    console.print(f"home: [cyan]{home}[/cyan]   jobs: [cyan]{jobs_dir}[/cyan]")
    if checkpoints is not None:
        console.print(
            f"outputs published in [cyan]{checkpoints}/jobs/output[/cyan]; each worker is a "
            f"machine of its own ({home}/machine-<n>)"
        )
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
            machine = home / f"machine-{i}" if checkpoints is not None else None
            procs.start(f"worker-{i}", "worker", "--ttl", "2", machine=machine)
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
        # with a bucket, read back into an empty directory: nothing comes from a machine
        pub = open_publication(home if checkpoints is None else home / "verdict", checkpoints)
        ok = closing_table(queue, procs, pub, home, master, oracle, watch)
        if checkpoints is not None:
            _bucket_listing(checkpoints)
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
                    if name in self.procs.machines:
                        gone = self.procs.lose(name)
                        self.say(
                            f"[red]lost {name}'s machine[/red] while it runs chunk {c['id']}: "
                            f"SIGKILL to it and all it started, {gone} deleted"
                        )
                    else:
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


def published_units(
    pub: Publication, job: str, chunk_id: int, days: list[int]
) -> tuple[int | None, set[int]]:
    """What a chunk of the demo pipeline published: its units (None when it published
    nothing) and, for ``usage_daily``, the days it has a file for."""
    import pandas as pd

    files = pub.published_files(job, chunk_id)
    if not files:
        return None, set()
    if job == "usage_report":
        return int(json.loads(files["report.json"].read_text())["units"]), set()
    units = sum(int(pd.read_parquet(f)["units"].sum()) for f in files.values())
    if job == "usage_daily":
        return units, {d for d in days if f"day={d}.parquet" in files}
    return units, set()


def _bucket_listing(checkpoints: str) -> None:
    """What the bucket holds: one line per job and kind of object."""
    from riverbed.jobs.outputs import OUTPUTS
    from riverbed.storage import shared_store

    kinds: dict[str, list[int]] = {}
    for info in shared_store(f"{checkpoints}/{OUTPUTS}").list():
        job, kind = info.key.split("/")[:2]
        kinds.setdefault(f"{job}/{kind}/", []).append(info.size)
    console.print(f"the bucket's {checkpoints}/{OUTPUTS} holds:")
    for kind, sizes in sorted(kinds.items()):
        console.print(f"  {kind:<36} {len(sizes):>5} objects {sum(sizes) / 1e3:>9.1f} kB")


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
    pub: Publication,
    home: Path,
    master: int,
    oracle: dict[int, int],
    watch: _Watch,
) -> bool:
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
        units, with_file = published_units(pub, c["job"], int(c["id"]), days)
        day_files.update(with_file)
        expected = sum(oracle[d] for d in days)
        good = c["state"] == "DONE" and units == expected
        ok = ok and good
        table.add_row(
            str(c["id"]),
            c["job"],
            _span(days),
            tries,
            "1 output" if units is not None else "[red]none[/red]",
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
        current = pub.published_attempt("usage_daily", watch.killed_chunk)
        console.print(
            f"chunk {watch.killed_chunk}: attempt 1 died with {watch.killed_worker}; "
            f"attempt {current} is the one published"
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
