"""Phase 2 of ``riverbed demo cluster``: the jobs pipeline on the test hosts.

The pipeline of ``riverbed demo jobs`` — ``usage_daily`` (Spark, two days a chunk) →
``customer_features`` (a week a chunk) → ``usage_report`` — with its queue in
PostgreSQL at the gateway, an orchestrator on h3 (it leads) and one on h1 (standby),
a worker on each host, the ``usage`` topic in the diskless log and every published
output in the bucket. Then the same chaos as the stream's: h2 is lost while its worker
runs a chunk (the chunk runs again elsewhere), h2 comes back empty, and h3 — the
leading orchestrator and a worker — is cut off for 20 s (h1's orchestrator leads with
a higher term; nothing h3 held is published twice). The verdict checks every chunk's
one published output against the events: each day's usage published exactly once.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from riverbed.demo.jobs import FIRST_DAY, day_id, examples_dir, produce, published_units
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.runs import submit
from riverbed.jobs.spec import Catalog
from riverbed.parquetbytes import read_parquet_bytes
from riverbed.testing.cluster import BUCKET, Cluster
from riverbed.testing.testbed import TestBed

__all__ = ["JobsOutcome", "run_jobs_phase", "wait_for"]

JOBS_TTL = 3  # workers' and orchestrators' leases: how soon a lost one is noticed
ORCHESTRATORS = ("h3", "h1")  # h3's is started first, so it leads: h3 is cut off
WORKERS = ("h1", "h2", "h3")
PER_DAY = 1500  # usage events per day
HOURS, SENSORS = 16, 30  # the time-range job's readings: 32 chunks of 30 minutes
TR_NAME = "sensors"  # the spec file's stem: the job's name


@dataclass
class JobsOutcome:
    state: str = ""
    chunks: int = 0
    days: int = 0
    units: int = 0
    expected: int = 0
    exactly_once: bool = False  # each day in exactly one published usage_daily output
    counts_ok: bool = False  # every chunk DONE, its published units as produced
    lost_attempts: int = 0  # attempts that died with h2 or were cut off with h3
    rerun_s: float | None = None  # kill → the lost chunk done by another worker
    failover_s: float | None = None  # cut → h1's orchestrator leads
    terms: list[tuple[int, str]] = field(default_factory=list)
    # the time-range job (active driver on h2, hot standby on h1)
    tr_chunks: int = 0  # chunks of the range
    tr_once: bool = False  # each chunk published once (its record's first version)
    tr_rows_ok: bool = False  # the published rows equal the pandas oracle
    tr_worst: float = float("inf")
    tr_before_kill: int = 0  # chunks the driver on h2 published before it was lost
    tr_takeover_s: float | None = None  # kill → the next chunk published by h1's driver


def wait_for(what: str, check: Any, timeout: float) -> Any:
    """``check()``'s first true answer, asked four times a second; a TimeoutError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.25)
    return got


def wait_while_moving(what: str, check: Any, progress: Any, stalled: float) -> Any:
    """``check()``'s first true answer, asked four times a second; a TimeoutError naming
    ``what`` (and where ``progress()`` stood) only when ``progress()`` gave the same answer
    for ``stalled`` seconds — work of many steps takes as long as the host makes it (under
    one core's worth of CPU, each chunk of the time-range job took 6-11 s and the whole
    job longer than any fixed wait sized on a quicker host), and a hang still ends it."""
    seen, moved = progress(), time.monotonic()
    while not (got := check()):
        if time.monotonic() - moved > stalled:
            raise TimeoutError(
                f"{what} did not happen: {seen} after {stalled:.0f}s without progress"
            )
        time.sleep(0.25)
        if (now := progress()) != seen:
            seen, moved = now, time.monotonic()
    return got


def wait_for_progress(what: str, count: Any, target: int, stalled: float) -> None:
    """Until ``count()`` reaches ``target``, while it grows (:func:`wait_while_moving`)."""
    wait_while_moving(what, lambda: count() >= target, lambda: f"{count()} of {target}", stalled)


def run_jobs_phase(
    bed: TestBed,
    cluster: Cluster,
    control: str,
    log_url: str,
    clock: Any,
    console: Console,
    root: Path,
    days: int = 8,
    partition_s: float = 20,
) -> JobsOutcome:
    """The jobs pipeline through losing h2 and cutting off h3 (the module doc);
    ``clock(text)`` prints a timeline line and returns its time."""
    out = JobsOutcome()
    pg = cluster.start_postgres()
    db = pg.dsn()
    clock(f"PostgreSQL at the gateway {bed.plan.gateway}: the jobs queue")
    checkpoints = f"s3://{BUCKET}/jobs"
    day_ids = [day_id(FIRST_DAY + timedelta(days=i)) for i in range(days)]
    oracle = produce(log_url, day_ids, customers=200, per_day=PER_DAY)
    out.days, out.expected = days, sum(oracle.values())

    def env(host: str) -> dict[str, str]:
        return {
            **cluster.process_env(host, control, log_url),
            "RIVERBED_JOBS_DB": db,
            "RIVERBED_JOBS_DIR": str(examples_dir()),
            "RIVERBED_CHECKPOINTS": checkpoints,
            "RIVERBED_SPARK_MASTER": "local[1]",
            "RIVERBED_DEMO_PACE": "3",  # each daily chunk lasts long enough to be hit
        }

    def cli(*args: str) -> list[str]:
        return [sys.executable, "-m", "riverbed.cli.main", *args]

    from riverbed.control import connect

    queue = JobQueue(db)
    cp = connect(control)

    def published() -> int:
        return _chunks_published(cp)

    def orchestrator(host: str) -> None:
        # -v: its log says when it stood by, behind whom, and when it led
        argv = cli("-v", "orchestrator", "--ttl", str(JOBS_TTL), "--name", f"orchestrator-{host}")
        bed.spawn(host, "orchestrator", argv, env=env(host), kind="orchestrator")

    try:
        first, *others = ORCHESTRATORS
        orchestrator(first)
        wait_for("the first orchestrator to lead", lambda: queue.leader()[1], 120)
        for h in others:
            orchestrator(h)
        for h in WORKERS:
            bed.spawn(h, "jobs-worker", cli("worker", "--ttl", str(JOBS_TTL)),
                      env=env(h), kind="jobs-worker")  # fmt: skip
        out.terms.append(queue.leader())
        clock(f"jobs: orchestrators on {' and '.join(ORCHESTRATORS)} ({out.terms[0][1]} "
              f"leads), a worker on each host; {days * PER_DAY:,} usage events in the "
              "diskless topic usage")  # fmt: skip
        tr_total = _start_timerange(bed, root, env, cli, clock, cp, out)
        ids = f"{day_ids[0]}-{day_ids[-1]}"
        master, planned = submit(Catalog(examples_dir()), queue, "usage_report", ids)
        out.chunks = len(planned.chunks)
        per_job = Counter(c.job for c in planned.chunks)
        clock(f"submitted usage_report for {days} days: run {master}, {out.chunks} chunks "
              + ", ".join(f"{n} {j}" for j, n in per_job.items()))  # fmt: skip

        def running_on(host: str) -> dict[str, Any] | None:
            return next(
                (c for c in queue.graph(master) if c["state"] == "RUNNING" and c["host"] == host),
                None,
            )

        hit = wait_for("a chunk running on h2", lambda: running_on("h2"), 180)
        killed = clock(f"[bold red]kill-host h2[/bold red] while its worker runs chunk "
                       f"{hit['id']} ({hit['job']}): worker, log server, etcd member, Spark "
                       "worker SIGKILLed; its disk deleted")  # fmt: skip
        bed.kill_host("h2")
        out.tr_before_kill = published()
        bed.retire("h2", "timerange")  # lost with its host: h1's driver finishes the range
        wait_for(f"chunk {hit['id']} to run again elsewhere",
                 lambda: queue.state(int(hit["id"])) == "DONE", 240)  # fmt: skip
        done_by = queue.get(int(hit["id"]))["host"]
        out.rerun_s = clock(f"chunk {hit['id']} done by the worker on {done_by}") - killed
        if out.tr_before_kill < tr_total:
            wait_for("the time-range standby to publish",
                     lambda: published() > out.tr_before_kill, 240)  # fmt: skip
            said = clock(f"time-range: the standby on h1 published chunk "
                         f"{out.tr_before_kill + 1} of {tr_total} (the driver on h2 had "
                         f"published {out.tr_before_kill})")  # fmt: skip
            out.tr_takeover_s = said - killed
        cluster.wait_etcd(["h1", "h3"])
        bed.restart_host("h2")
        cluster.wait_etcd()
        cluster.wait_zookeeper()  # the Spark masters' quorum outlives h3's cut too
        clock("h2 restarted with an empty disk: its worker, log server, etcd member back")

        term, leader = queue.leader()
        cut = clock(f"[bold red]partition h3[/bold red] for {partition_s:.0f}s: the leading "
                    f"orchestrator ({leader}) and a worker cut off")  # fmt: skip
        bed.partition("h3")
        try:
            new = wait_for("the standby orchestrator to lead",
                           lambda: (t := queue.leader())[0] > term and t, 120)  # fmt: skip
        except TimeoutError as exc:  # what the next reader of the log needs to know
            raise TimeoutError(f"{exc}; {_failover_state(queue, cp)}") from None
        out.terms.append(new)
        out.failover_s = clock(f"{new[1]} leads (term {new[0]} > {term})") - cut
        time.sleep(max(partition_s - (time.monotonic() - clock.t0 - cut), 0))
        bed.heal("h3")
        clock("h3 healed")
        out.state = wait_while_moving(
            "the run to end",
            lambda: (s := queue.state(master)) != "MASTER" and s,
            lambda: sorted((c["id"], c["state"]) for c in queue.graph(master)),
            240,
        )
        clock(f"run {master} {out.state}")
        wait_for_progress("the time-range job to finish", published, tr_total, 240)
        clock(f"time-range: all {tr_total} chunks published")
        _verdict(queue, master, oracle, checkpoints, root, out, console)
        _timerange_verdict(cp, root, out, console)
    finally:
        queue.close()
        cp.close()
    return out


def _failover_state(queue: JobQueue, cp: Any) -> str:
    """Who the election names and what the jobs database's sessions do — a standby
    that won the election but waits in the database shows as a session waiting on a
    lock beside the one that holds it."""
    from sqlalchemy import text

    from riverbed.control import Election
    from riverbed.jobs.orchestrator import ELECTION

    said = []
    try:
        kv = Election(cp, ELECTION).leader()
        said.append(
            "the election names nobody"
            if kv is None
            else f"the election names {kv.value.decode()!r} (lease {kv.lease:x})"
        )
    except Exception as exc:  # a diagnosis must not hide the timeout it explains
        said.append(f"the election could not be read: {exc}")
    try:
        with queue.db.read() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid, state, wait_event_type, "
                    "extract(epoch from now() - xact_start)::int, left(query, 60) "
                    "FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
                )
            ).all()
        said.append(
            "jobs database transactions: "
            + ("; ".join(f"pid {r[0]} {r[1]} wait={r[2]} {r[3]}s {r[4]!r}" for r in rows) or "none")
        )
    except Exception as exc:
        said.append(f"the jobs database's sessions could not be read: {exc}")
    return "; ".join(said)


def _chunks_published(cp: Any) -> int:
    from riverbed.timerange.driver import Keys

    return len(cp.get_prefix(Keys(TR_NAME).chunks.encode()))


def _start_timerange(
    bed: TestBed, root: Path, env: Any, cli: Any, clock: Any, cp: Any, out: JobsOutcome
) -> int:
    """Readings in the bucket, the spec, the active driver on h2 (once it published two
    chunks) and its standby on h1; returns how many chunks the range has."""
    from riverbed.demo.timerange import SPEC, generate_readings
    from riverbed.storage import shared_store

    local = root / "readings"
    rows = generate_readings(local, HOURS, SENSORS)
    store = shared_store(f"s3://{BUCKET}/readings")
    for f in sorted(local.rglob("*.parquet")):
        store.put_file(f.relative_to(local).as_posix(), f)
    spec = root / f"{TR_NAME}.py"
    spec.write_text(SPEC.format(input=f"s3://{BUCKET}/readings", output=f"s3://{BUCKET}/timerange"))
    start = "2026-01-01"
    end = (pd.Timestamp(start, tz="UTC") + pd.Timedelta(hours=HOURS)).strftime("%Y-%m-%dT%H:%MZ")
    # one chunk per Spark query, published one by one: the host loss lands mid-run
    argv = cli("timerange", "run", str(spec), "--from", start, "--to", end,
               "--ttl", str(JOBS_TTL), "--batch", "1")  # fmt: skip
    bed.spawn("h2", "timerange", argv, env=env("h2"), kind="timerange")
    wait_for("the time-range driver on h2 to publish two chunks",
             lambda: _chunks_published(cp) >= 2, 180)  # fmt: skip
    standby = bed.spawn("h1", "timerange", argv, env=env("h1"), kind="timerange")

    def standing_by() -> bool:
        with open(standby.log, "rb") as f:
            return b"standby:" in f.read()

    wait_for("the time-range standby on h1", standing_by, 120)
    total = HOURS * 2
    clock(f"time-range job: {rows:,} readings of {SENSORS} sensors in the bucket, {total} "
          f"chunks of 30 min; active driver on h2 ({_chunks_published(cp)} published), "
          "standby on h1")  # fmt: skip
    out.tr_chunks = total
    return total


def _timerange_verdict(cp: Any, root: Path, out: JobsOutcome, console: Console) -> None:
    """Each chunk published once, and the published rows against one pass of pandas."""
    import pyarrow.parquet as pq

    from riverbed.demo.timerange import worst_difference
    from riverbed.jobs.timerange import load_spec
    from riverbed.storage import shared_store
    from riverbed.timerange.driver import Keys
    from riverbed.timerange.oracle import pandas_rows

    versions = [kv.version for kv in cp.get_prefix(Keys(TR_NAME).chunks.encode())]
    out.tr_once = versions == [1] * out.tr_chunks
    store = shared_store(f"s3://{BUCKET}/timerange")
    parts = [o.key for o in store.list("rows/") if o.key.endswith("part.parquet")]
    got = pd.concat(read_parquet_bytes(store.get(k)).to_pandas() for k in parts)
    inputs = pd.concat(
        pq.read_table(f).to_pandas() for f in sorted((root / "readings").rglob("*.parquet"))
    )
    oracle = pandas_rows(load_spec(root / f"{TR_NAME}.py").job, inputs)
    out.tr_worst = worst_difference(got, oracle)
    out.tr_rows_ok = len(got) == len(inputs) and out.tr_worst < 1e-9
    console.print(
        f"time-range: {len(versions)} of {out.tr_chunks} chunks, each published once: "
        f"[bold]{'yes' if out.tr_once else 'NO'}[/bold]; {len(got):,} rows for "
        f"{len(inputs):,} readings, max |difference| to one pass of pandas {out.tr_worst:.1e} "
        f"— [bold]{'IDENTICAL' if out.tr_rows_ok else 'DIFFERENT'}[/bold]"
    )


def _outcome(attempt: dict[str, Any]) -> str:
    """An attempt's state, and ``lost`` for one reaped with its worker."""
    return "lost" if "lost" in (attempt["error"] or "") else str(attempt["state"]).lower()


def _verdict(
    queue: JobQueue,
    master: int,
    oracle: dict[int, int],
    checkpoints: str,
    root: Path,
    out: JobsOutcome,
    console: Console,
) -> None:
    """Every chunk's published output against the events (the jobs demo's checks)."""
    pub = open_publication(root / "verdict", checkpoints)
    table = Table(title=f"jobs run {master}: every chunk and its published effect")
    for col in ("chunk", "job", "days", "attempts", "units", "expected", ""):
        table.add_column(col, justify="right" if col in ("units", "expected") else "left")
    ok = True
    day_files: Counter[int] = Counter()
    for c in queue.graph(master):
        days = json.loads(c["work_ids"])
        attempts = queue.get(int(c["id"]))["attempts"]
        out.lost_attempts += sum(1 for a in attempts if a["state"] != "DONE")
        tries = " · ".join(f"{a['attempt']} {_outcome(a)} ({a['host']})" for a in attempts)
        units, with_file = published_units(pub, c["job"], int(c["id"]), days)
        day_files.update(with_file)
        expected = sum(oracle[d] for d in days)
        if c["job"] == "usage_report" and units is not None:
            out.units = units
        good = c["state"] == "DONE" and units == expected
        ok = ok and good
        table.add_row(str(c["id"]), c["job"], f"{days[0]}…{days[-1]}", tries,
                      f"{units:,}" if units is not None else "-", f"{expected:,}",
                      "[green]✓[/green]" if good else "[red]✗[/red]")  # fmt: skip
    console.print(table)
    out.counts_ok = ok and out.state == "DONE"
    out.exactly_once = all(day_files[d] == 1 for d in oracle)
    console.print(
        f"jobs: each day's usage published exactly once: "
        f"[bold]{'yes' if out.exactly_once else 'NO'}[/bold] ({len(oracle)} days, "
        f"{out.expected:,} units; the report says {out.units:,}) — "
        f"{out.lost_attempts} attempt(s) lost with a host and run again"
    )
