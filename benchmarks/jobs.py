"""The jobs queue: throughput, dependency latency, and big submissions, in one run.

    .venv/bin/python benchmarks/jobs.py [--chunks 5000] [--chains 10] [--ids 100000]

1. **Throughput**: no-op chunks claimed → run (in a worker's executor process) →
   recorded DONE, per second, with 1, 2 and 4 worker processes, on SQLite, PostgreSQL
   and MariaDB — workers as started by default (``--prefetch 0``: each success recorded
   on its own, with the next claim) and with ``--prefetch 16`` (short chunks held ahead,
   successes recorded in batches). **Baseline**: a bare claim loop on the same
   database with the same number of processes — ``UPDATE … WHERE id = (SELECT …
   FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING`` then ``UPDATE … SET state = 'done'``
   (SQLite: the same inside ``BEGIN IMMEDIATE``; MariaDB, without ``UPDATE …
   RETURNING``: ``SELECT id … FOR UPDATE SKIP LOCKED LIMIT 1`` and the ``UPDATE`` of
   it in one transaction), nothing else.
2. **Per-level latency**: a chain of 10 dependent jobs, one chunk each, one worker:
   the time from a chunk's DONE to its dependent's start, from the database's own
   timestamps (one clock). Targets: p50 ≤ 0.3 s, p99 ≤ 1 s.
3. **Resolve + submit** 100k work ids across a 5-job graph (about 500 chunks), with
   no history and with every work id already run (freshness read for all of them).
   Target ≤ 5 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

from riverbed.control import connect
from riverbed.jobs import Catalog
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.runs import submit
from riverbed.jobs.worker import Worker
from riverbed.testing import MariaDBServer, PostgresServer

NOOP = "from riverbed.jobs import Job\n\ndef main(ctx, work_ids):\n    pass\n\n"


def write_jobs(root: Path, levels: int) -> Path:
    jobs = root / "jobs"
    jobs.mkdir(exist_ok=True)
    (jobs / "noop.py").write_text(NOOP + "job = Job(main=main, chunk_size=1)\n")
    for i in range(levels):
        dep = f', dependencies=[Dependency("chain{i + 1}")]' if i + 1 < levels else ""
        (jobs / f"chain{i}.py").write_text(
            "from riverbed.jobs import Dependency, Job\n\ndef main(ctx, work_ids):\n    pass\n\n"
            f"job = Job(main=main{dep})\n"
        )
    sizes = {"big_a": 1000, "big_b": 500, "big_c": 2000, "big_d": 1000, "big_e": 5000}
    deps = {"big_a": ["big_b", "big_d"], "big_b": ["big_c"], "big_d": ["big_e"]}
    for name, size in sizes.items():
        ds = ", ".join(f'Dependency("{d}", max_lag="1h")' for d in deps.get(name, []))
        (jobs / f"{name}.py").write_text(
            "from riverbed.jobs import Dependency, Job\n\ndef main(ctx, work_ids):\n    pass\n\n"
            f"job = Job(main=main, chunk_size={size}, dependencies=[{ds}])\n"
        )
    return jobs


# -- the baseline: a bare claim loop ---------------------------------------------------


def bare_setup(queue: JobQueue, n: int) -> None:
    with queue.db.write() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_q"))
        if queue.db.dialect == "postgresql":
            conn.execute(text("CREATE TABLE bench_q (id BIGSERIAL PRIMARY KEY, state TEXT)"))
        elif queue.db.dialect == "mariadb":
            conn.execute(
                text("CREATE TABLE bench_q (id BIGINT AUTO_INCREMENT PRIMARY KEY, state CHAR(8))")
            )
        else:
            conn.execute(text("CREATE TABLE bench_q (id INTEGER PRIMARY KEY, state TEXT)"))
        conn.execute(text("CREATE INDEX bench_q_state ON bench_q (state, id)"))
        conn.execute(text("INSERT INTO bench_q (state) VALUES ('pending')"), [{}] * n)


def bare_loop(url: str, ready: Any) -> None:
    queue = JobQueue(url, create=False)
    ready.wait()
    lock = " FOR UPDATE SKIP LOCKED" if queue.db.dialect != "sqlite" else ""
    claim = text(
        "UPDATE bench_q SET state = 'running' WHERE id = (SELECT id FROM bench_q "
        f"WHERE state = 'pending' ORDER BY id LIMIT 1{lock}) RETURNING id"
    )
    pick = text(f"SELECT id FROM bench_q WHERE state = 'pending' ORDER BY id LIMIT 1{lock}")
    running = text("UPDATE bench_q SET state = 'running' WHERE id = :id")
    done = text("UPDATE bench_q SET state = 'done' WHERE id = :id")
    while True:
        with queue.db.write() as conn:
            if queue.db.dialect == "mariadb":
                row = conn.execute(pick).first()
                if row is not None:
                    conn.execute(running, {"id": row[0]})
            else:
                row = conn.execute(claim).first()
        if row is None:
            break
        with queue.db.write() as conn:
            conn.execute(done, {"id": row[0]})
    queue.close()


def run_procs(target: Callable[..., None], args: tuple[Any, ...], n: int) -> float:
    """Start ``n`` processes, let them import, then time them from one start signal."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    procs = [ctx.Process(target=target, args=(*args, ready)) for _ in range(n)]
    for p in procs:
        p.start()
    time.sleep(3.0)
    start = time.perf_counter()
    ready.set()
    for p in procs:
        p.join()
    return time.perf_counter() - start


# -- riverbed workers -----------------------------------------------------------------


def worker_proc(
    url: str,
    control: str,
    jobs: str,
    home: str,
    master: int,
    concurrency: int,
    prefetch: int,
    ready: Any,
) -> None:
    queue = JobQueue(url, create=False)
    cp = connect(control)
    worker = Worker(
        queue, cp, Path(jobs), Path(home), ttl=5, concurrency=concurrency, prefetch=prefetch
    )
    ready.wait()
    worker.run(until=lambda: queue.state(master) != "MASTER")
    cp.close()
    queue.close()


def riverbed_run(
    queue: JobQueue,
    url: str,
    root: Path,
    jobs: Path,
    job: str,
    ids: str,
    workers: int,
    concurrency: int,
    prefetch: int,
) -> tuple[float, int]:
    catalog = Catalog(jobs)
    master, plan = submit(catalog, queue, job, ids)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    control = f"sqlite:///{root / 'control.db'}"
    procs = [
        ctx.Process(
            target=worker_proc,
            args=(
                url,
                control,
                str(jobs),
                str(root / "home"),
                master,
                concurrency,
                prefetch,
                ready,
            ),
        )
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    time.sleep(3.0)  # let the workers import and register before the clock starts
    start = time.perf_counter()
    ready.set()
    while queue.state(master) == "MASTER":
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    return elapsed, len(plan.chunks)


def throughput(
    queue: JobQueue, url: str, root: Path, jobs: Path, n: int, concurrency: int, prefetch: int
) -> list[dict[str, Any]]:
    rows = []
    for workers in (1, 2, 4):
        bare_setup(queue, n)
        bare = n / run_procs(bare_loop, (url,), workers)
        row: dict[str, Any] = {"workers": workers, "bare": bare}
        line = f"  {workers} worker(s): bare claim loop {bare:6.0f} /s"
        for ahead in sorted({0, prefetch}):
            elapsed, count = riverbed_run(
                queue, url, root, jobs, "noop", f"1-{n}", workers, concurrency, ahead
            )
            ours = count / elapsed
            row[f"prefetch_{ahead}"] = ours
            line += f"   prefetch {ahead}: {ours:5.0f} chunks/s, ratio {ours / bare:.2f}"
        rows.append(row)
        print(line)
    return rows


def chain_latency(queue: JobQueue, url: str, root: Path, jobs: Path, chains: int) -> list[float]:
    gaps: list[float] = []
    for _ in range(chains):
        catalog = Catalog(jobs)
        master, _ = submit(catalog, queue, "chain0", None)
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        ready.set()
        control = f"sqlite:///{root / 'control.db'}"
        p = ctx.Process(
            target=worker_proc,
            args=(url, control, str(jobs), str(root / "home"), master, 1, 1, ready),
        )
        p.start()
        p.join()
        graph = sorted(queue.graph(master), key=lambda r: r["job"], reverse=True)  # chain9 first
        for below, above in itertools.pairwise(graph):
            gaps.append(float(above["started_at"]) - float(below["finished_at"]))
    return gaps


def big_submit(queue: JobQueue, jobs: Path, ids: int) -> tuple[float, float, int]:
    catalog = Catalog(jobs)
    start = time.perf_counter()
    master, plan = submit(catalog, queue, "big_a", f"1-{ids}")
    cold = time.perf_counter() - start
    queue.cancel(master)
    # Now give every work id of the four dependencies a success long ago (stale for
    # max_lag=1h), so the second submission reads and checks 400k freshness rows.
    with queue.db.write() as conn:
        for name in ("big_b", "big_c", "big_d", "big_e"):
            conn.execute(
                text(
                    "INSERT INTO rb_jobs_freshness (job, kwargs, work_id, succeeded_at) "
                    "VALUES (:j, '{}', :w, 0)"
                ),
                [{"j": name, "w": w} for w in range(1, ids + 1)],
            )
    start = time.perf_counter()
    submit(catalog, queue, "big_a", f"1-{ids}")
    warm = time.perf_counter() - start
    return cold, warm, len(plan.chunks)


def bench(name: str, url: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n== {name}")
    queue = JobQueue(url)
    jobs = write_jobs(root, 10)
    rows = throughput(queue, url, root, jobs, args.chunks, args.concurrency, args.prefetch)
    gaps = chain_latency(queue, url, root, jobs, args.chains)
    p50 = statistics.median(gaps)
    p99 = statistics.quantiles(gaps, n=100)[98] if len(gaps) >= 2 else gaps[0]
    print(
        f"  dependency level → next level running: p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms ({len(gaps)} hops)"
    )
    cold, warm, count = big_submit(queue, jobs, args.ids)
    print(
        f"  resolve + submit {args.ids:,} work ids, 5 jobs, {count} chunks: "
        f"{cold:.2f} s with no history, {warm:.2f} s with every id's history read"
    )
    queue.close()
    return {
        "throughput": rows,
        "p50": p50,
        "p99": p99,
        "submit_cold": cold,
        "submit_warm": warm,
        "chunks": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=1, help="executors per worker")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=16,
        help="chunks held ahead per worker, measured beside prefetch 0 (≥ 2: batched records)",
    )
    parser.add_argument("--only", choices=("sqlite", "postgresql", "mariadb"))
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "sqlite"):
            root = Path(tmp) / "sqlite"
            root.mkdir()
            results["sqlite"] = bench("SQLite", f"sqlite:///{root / 'jobs.db'}", root, args)
        if args.only in (None, "postgresql"):
            with PostgresServer() as server, server.database() as dsn:
                root = Path(tmp) / "pg"
                root.mkdir()
                results["postgresql"] = bench("PostgreSQL", dsn, root, args)
        if args.only in (None, "mariadb"):
            with MariaDBServer() as mserver, mserver.database() as dsn:
                root = Path(tmp) / "mariadb"
                root.mkdir()
                results["mariadb"] = bench("MariaDB", dsn, root, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
