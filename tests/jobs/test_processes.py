"""Workers and orchestrators as real processes, killed with SIGKILL and SIGSTOP.

Each crash scenario runs on one jobs database (``@on``), alternating between SQLite and
PostgreSQL: the queue's contract suite (``test_queue.py``) runs every database step on
both, and what a scenario tests is how workers and orchestrators recover."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from riverbed.control import connect
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.schema import chunks, fires, meta
from riverbed.jobs.schema import schedules as schedules_t
from riverbed.jobs.worker import log_path
from riverbed.processes import is_alive
from riverbed.spark import TEST_CONF
from riverbed.storage import open_store
from riverbed.testing.signals import stop_outside_writes
from tests.jobs.cluster import Cluster, published, run_state, until
from tests.jobs.conftest import SERVERS, on

pytestmark = pytest.mark.slow


@on("postgres", "mariadb")
def test_a_worker_killed_mid_chunk_is_reaped_and_the_effect_published_once(
    cluster: Cluster,
) -> None:
    cluster.orchestrator("o1")
    doomed = cluster.worker()
    run = cluster.cli("submit", "effect", "--work-ids", "1-2", "--kwarg", "sleep=3")["run"]
    until(lambda: cluster.marks_of("start"), 30, "the chunk to start")
    os.kill(doomed.pid, signal.SIGKILL)
    cluster.worker()
    until(lambda: run_state(cluster, run) != "MASTER", 60, "the run to end")
    assert run_state(cluster, run) == "DONE"
    (chunk,) = [r for r in cluster.queue.graph(run)]
    assert chunk["attempt"] == 2 and chunk["output_attempt"] == 2
    attempts = cluster.queue.get(chunk["id"])["attempts"]
    assert attempts[0]["state"] == "FAILED" and "lost" in attempts[0]["error"]
    assert published(cluster) == {chunk["id"]: {"ids": [1, 2], "attempt": 2}}


@on("sqlite", "s3")
def test_a_sigstopped_worker_resumed_after_its_chunk_was_reclaimed_records_nothing(
    cluster: Cluster,
) -> None:
    cluster.orchestrator("o1")
    paused = cluster.worker()
    run = cluster.cli("submit", "effect", "--work-ids", "1-2", "--kwarg", "sleep=2")["run"]
    until(lambda: cluster.marks_of("start"), 30, "the chunk to start")
    # outside a write of the SQLite databases (pausing it inside one would hold every
    # other writer back: riverbed.testing.signals)
    stop_outside_writes(paused.pid, cluster.control, cluster.db)
    cluster.worker()
    until(lambda: run_state(cluster, run) == "DONE", 60, "the reclaimed chunk to finish")
    (chunk,) = cluster.queue.graph(run)
    # The paused worker's executor finished attempt 1 meanwhile; its answer waits in
    # the pipe. Resume the worker: it must not record or publish attempt 1.
    until(lambda: f"end-{chunk['id']}-1" in cluster.marks_of("end"), 30, "attempt 1 to end")
    os.kill(paused.pid, signal.SIGCONT)
    log = cluster.tmp / "worker-1.log"
    # the resumed worker has read attempt 1's answer once it says what it did with it:
    # then the queue, the output and the staging show whether it recorded or published
    text = until(
        lambda: "nothing recorded or published" in log.read_text() and log.read_text(),
        60,
        "the resumed worker to report its fenced attempt",
    )
    assert f"chunk {chunk['id']} attempt 1" in text
    # after saying so it retracts what it may have published, then deletes its staging
    staging = cluster.home / "jobs" / "staging" / f"{chunk['id']}-1"
    until(lambda: not staging.exists(), 30, "the fenced attempt's staging to go")
    row = cluster.queue.get(chunk["id"])
    assert row["state"] == "DONE" and row["attempt"] == 2 and row["output_attempt"] == 2
    assert [a["state"] for a in row["attempts"]] == ["FAILED", "DONE"]
    assert published(cluster) == {chunk["id"]: {"ids": [1, 2], "attempt": 2}}
    if cluster.checkpoints is not None:  # in the bucket: attempt 2's objects and marker only
        store = open_store(f"{cluster.checkpoints}/jobs/output")
        assert store.entries("effect/.attempts/") == [f"chunk={chunk['id']}-2"]
        assert store.entries(f"effect/.published/chunk={chunk['id']}/") == [f"{2:020d}"]


@on("postgres", "mariadb")
def test_a_killed_orchestrator_is_replaced_and_the_new_one_grooms(cluster: Cluster) -> None:
    first = cluster.orchestrator("o1")

    def leader() -> tuple[int, str]:
        with cluster.queue.db.read() as conn:
            row = conn.execute(select(meta.c.term, meta.c.leader)).one()
            return int(row[0]), str(row[1])

    until(lambda: leader()[1] == "o1", 30, "o1 to lead")
    cluster.orchestrator("o2")
    term1 = leader()[0]
    os.kill(first.pid, signal.SIGKILL)
    until(lambda: leader()[1] == "o2", 30, "o2 to take over")
    assert leader()[0] > term1
    # The new leader does the duties: a worker killed now is reaped by o2.
    doomed = cluster.worker()
    run = cluster.cli("submit", "effect", "--work-ids", "1-2", "--kwarg", "sleep=3")["run"]
    until(lambda: cluster.marks_of("start"), 30, "the chunk to start")
    os.kill(doomed.pid, signal.SIGKILL)
    cluster.worker()
    until(lambda: run_state(cluster, run) == "DONE", 60, "the run to finish")
    (chunk,) = cluster.queue.graph(run)
    assert chunk["attempt"] == 2  # reaped exactly once


@pytest.mark.etcd
def test_orchestrators_and_workers_on_etcd_fail_over(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The same failover with the control plane on a real etcd: elections, worker leases
    and the registry all live there."""
    from riverbed.testing import EtcdServer

    with EtcdServer() as etcd:
        c = Cluster(tmp_path, subprocess_env)
        c.control = c.env["RIVERBED_CONTROL"] = etcd.url
        try:
            first = c.orchestrator("o1")

            def leader() -> str:
                with c.queue.db.read() as conn:
                    return str(conn.execute(select(meta.c.leader)).scalar_one_or_none())

            until(lambda: leader() == "o1", 30, "o1 to lead")
            c.orchestrator("o2")
            os.kill(first.pid, signal.SIGKILL)
            until(lambda: leader() == "o2", 30, "o2 to take over")
            doomed = c.worker()
            run = c.cli("submit", "effect", "--work-ids", "1-2", "--kwarg", "sleep=3")["run"]
            until(lambda: c.marks_of("start"), 30, "the chunk to start")
            os.kill(doomed.pid, signal.SIGKILL)  # its etcd lease ends; o2 reaps its chunk
            c.worker()
            until(lambda: run_state(c, run) == "DONE", 60, "the run to finish")
            (chunk,) = c.queue.graph(run)
            assert chunk["attempt"] == 2
            assert published(c) == {chunk["id"]: {"ids": [1, 2], "attempt": 2}}
        finally:
            c.stop()


TICKER = """
import os, pathlib
from riverbed.jobs import Job

def main(ctx, work_ids):
    (pathlib.Path(os.environ["MARKS"]) / f"tick-{ctx.chunk_id}").touch()

job = Job(main=main, schedule={"cron": "* * * * *", "grace": "10m"})
"""


@on("sqlite")  # waits for a minute
def test_cron_fires_once_per_fire_time_across_an_orchestrator_failover(cluster: Cluster) -> None:
    """o1 fires the current minute as it starts, records it, and is SIGKILLed; o2 takes
    over, does not fire that minute again, and fires the next one."""
    (cluster.tmp / "jobs" / "ticker.py").write_text(TICKER)

    def fired() -> list[tuple[float, int]]:
        with cluster.queue.db.read() as conn:
            rows = conn.execute(
                select(chunks.c.fire_time, chunks.c.id).where(
                    chunks.c.kind == "master", chunks.c.job == "ticker"
                )
            ).all()
        return sorted((float(t), int(i)) for t, i in rows)

    first = cluster.orchestrator("o1")
    until(fired, 30, "o1 to fire the current minute")
    standby = cluster.orchestrator("o2")
    time.sleep(1)
    os.kill(first.pid, signal.SIGKILL)
    cluster.worker()
    until(lambda: len(fired()) >= 2, 90, "o2 to fire the next minute")
    time.sleep(2)  # o2 keeps ticking: a second fire of either minute would show now
    runs = fired()
    times = [t for t, _ in runs]
    # every minute since o1's fire, each once — however long the takeover took (a
    # takeover slower than a minute catches the fires it missed up, catchup="all")
    assert times == [times[0] + 60 * i for i in range(len(runs))] and len(runs) >= 2
    with cluster.queue.db.read() as conn:
        recorded = conn.execute(select(func.count()).select_from(fires)).scalar_one()
    assert recorded == len(runs)
    ids = [r for _, r in runs]
    until(lambda: all(run_state(cluster, r) == "DONE" for r in ids), 60, "every run")
    assert len(cluster.marks_of("tick")) == len(runs)
    assert standby.poll() is None
    with cluster.queue.db.read() as conn:
        assert conn.execute(select(meta.c.leader)).scalar_one() == "o2"  # o2 fired the second


SEVERAL = """
import os, pathlib
from riverbed.jobs import Job

def main(ctx, work_ids, who):
    (pathlib.Path(os.environ["MARKS"]) / f"{ctx.job}-{who}-{ctx.chunk_id}").touch()

job = Job(main=main, schedule=[
    {"every": "3s", "name": "fast", "kwargs": {"who": "fast"}, "work_ids": "1-2"},
    {"every": "5s", "name": "slow", "kwargs": {"who": "slow"}},  # ids: _work_ids.py
])
"""
DEFAULT_IDS = """
def default_work_ids(job, **kwargs):
    return [40, 41, 42] if kwargs.get("who") == "slow" else [0]
"""


@on("postgres")
def test_several_interval_schedules_of_a_job_each_fire_once_per_period_across_a_failover(
    cluster: Cluster,
) -> None:
    """One job, two schedules (every 3s with its own work ids; every 5s taking the
    directory's default work ids): each fire of each schedule runs once with that
    schedule's kwargs, at the whole multiples of its period, through an orchestrator
    SIGKILLed between fires (its standby catches up what fell due meanwhile)."""
    (cluster.tmp / "jobs" / "pair.py").write_text(SEVERAL)
    (cluster.tmp / "jobs" / "_work_ids.py").write_text(DEFAULT_IDS)

    def fired() -> dict[str, list[tuple[float, str, str]]]:
        with cluster.queue.db.read() as conn:
            rows = conn.execute(
                select(chunks.c.schedule, chunks.c.fire_time, chunks.c.kwargs, chunks.c.work_ids)
                .where(chunks.c.kind == "master", chunks.c.job == "pair")
                .order_by(chunks.c.fire_time)
            ).all()
        out: dict[str, list[tuple[float, str, str]]] = {"pair:fast": [], "pair:slow": []}
        for key, at, kwargs, ids in rows:
            out[key].append((float(at), kwargs, ids))
        return out

    first = cluster.orchestrator("o1")
    cluster.worker()
    until(lambda: all(fired().values()), 30, "o1 to fire both schedules")
    standby = cluster.orchestrator("o2")
    os.kill(first.pid, signal.SIGKILL)
    until(lambda: all(len(v) >= 4 for v in fired().values()), 90, "o2 to fire on")
    runs = fired()
    for key, period, ids in (("pair:fast", 3.0, "[1, 2]"), ("pair:slow", 5.0, "[40, 41, 42]")):
        times = [t for t, _, _ in runs[key]]
        assert times[0] % period == 0, (key, times)  # whole multiples of the period
        assert times == [times[0] + period * i for i in range(len(times))], (key, times)
        who = key.split(":")[1]
        assert {(kw, w) for _, kw, w in runs[key]} == {(f'{{"who":"{who}"}}', ids)}
    with cluster.queue.db.read() as conn:
        recorded = conn.execute(
            select(fires.c.job, func.count()).group_by(fires.c.job).order_by(fires.c.job)
        ).all()
    assert [(k, n) for k, n in recorded] == [(k, len(v)) for k, v in sorted(runs.items())]
    listed = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "schedule", "list", "--json"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
    )
    shown = {r["schedule"]: r for r in json.loads(listed.stdout)["schedules"]}
    assert shown["pair:fast"]["cron"] == "@every 3s" and shown["pair:fast"]["work_ids"] == [1, 2]
    assert shown["pair:slow"]["work_ids"] is None and shown["pair:slow"]["stored"]
    assert standby.poll() is None


CATCHING_UP = """
import os, pathlib
from riverbed.jobs import Job

def main(ctx, work_ids):
    (pathlib.Path(os.environ["MARKS"]) / f"{ctx.job}-{ctx.chunk_id}").touch()

job = Job(main=main, schedule={SCHEDULE})
"""


@on("mariadb")
def test_fires_missed_while_no_orchestrator_ran_are_caught_up_once_or_counted(
    cluster: Cluster,
) -> None:
    """o1 fires the current minute M and is SIGKILLed; the schedules' books are set back
    as if the last fire had been minutes earlier (the orchestrators were down since).
    o2 takes over: catchup="all" runs every missed fire once, oldest first, one run at a
    time, and not M again; catchup="latest" runs none of them; fires older than the
    grace are recorded as missed, with their count, and never run."""
    schedules = {
        "tick_all": '{"cron": "* * * * *", "grace": "10m"}',
        "tick_latest": '{"cron": "* * * * *", "grace": "10m", "catchup": "latest"}',
        "tick_short": '{"cron": "* * * * *", "grace": "150s"}',
    }
    for name, schedule in schedules.items():
        (cluster.tmp / "jobs" / f"{name}.py").write_text(
            CATCHING_UP.replace("{SCHEDULE}", schedule)
        )

    def fired(job: str) -> list[tuple[float, int | None, str | None]]:
        with cluster.queue.db.read() as conn:
            rows = conn.execute(
                select(fires.c.fire_time, fires.c.master, fires.c.note)
                .where(fires.c.job == job)
                .order_by(fires.c.fire_time)
            ).all()
        return [(float(t), m, n) for t, m, n in rows]

    first = cluster.orchestrator("o1")
    until(lambda: all(fired(j) for j in schedules), 30, "o1 to fire every schedule")
    os.kill(first.pid, signal.SIGKILL)
    m = fired("tick_all")[0][0]
    back = {"tick_all": m - 240, "tick_latest": m - 240, "tick_short": m - 600}
    with cluster.queue.db.write() as conn:  # the last fires were that long ago
        for job, last in back.items():
            conn.execute(update(schedules_t).where(schedules_t.c.job == job).values(last_fire=last))
    cluster.worker()
    cluster.orchestrator("o2")
    until(lambda: len(fired("tick_all")) >= 4, 60, "o2 to catch tick_all up")
    until(lambda: any(n for _, _, n in fired("tick_short")), 30, "the missed fires recorded")
    time.sleep(2)  # o2 keeps ticking: a second fire of any minute would show now
    now = cluster.queue.now()
    newest = now - now % 60

    times = [t for t, _, _ in fired("tick_all")]
    assert times == [m - 180 + 60 * i for i in range(len(times))]  # each minute once
    assert times[-1] in (newest, newest - 60)

    latest = fired("tick_latest")
    assert [t for t, _, _ in latest if t < m] == []  # none of the missed minutes ran

    short = fired("tick_short")
    ((when, master, note),) = [row for row in short if row[2]]
    assert master is None and note is not None and "older than the grace (150s)" in note
    missed = int(note.split()[1])  # "missed: N fire(s) from … to …"
    assert missed in (7, 8)  # older than 150 s at o2's tick: 7 or 8, by its second
    assert when == m - 600 + 60 * missed  # the newest of the missed fires
    ran = [t for t, _, n in short if not n]
    assert ran == [when + 60 * (i + 1) for i in range(len(ran))] and m in ran
    # every fire that ran, ran once: one run per fire, one mark per run
    runs = [r for job in schedules for _, r, _ in fired(job) if r is not None]
    until(lambda: all(run_state(cluster, r) == "DONE" for r in runs), 60, "every run to end")
    assert len(list(cluster.marks.glob("tick_*"))) == len(runs)


@pytest.mark.parametrize(
    ("cluster", "prefetch"),
    # prefetching workers hold claims ahead: on PostgreSQL's concurrent connections
    [
        ("sqlite", "0"),
        pytest.param("postgres", "8", marks=pytest.mark.postgres),
        pytest.param("mariadb", "8", marks=pytest.mark.mariadb),
    ],
    indirect=["cluster"],
)
def test_three_workers_run_every_chunk_once_and_isolate_a_poison_id(
    cluster: Cluster, prefetch: str
) -> None:
    """With ``--prefetch 8`` the workers hold chunks ahead and record short successes
    in batches; every effect is still recorded and published exactly once."""
    cluster.orchestrator("o1")
    for _ in range(3):
        cluster.worker("--concurrency", "2", "--prefetch", prefetch)
    run = cluster.cli("submit", "effect", "--work-ids", "1-40", "--kwarg", "fail_on=13")["run"]
    until(lambda: run_state(cluster, run) != "MASTER", 90, "the run to end")
    rows = cluster.queue.graph(run)
    failed = [json.loads(r["work_ids"]) for r in rows if r["state"] == "FAILED"]
    assert failed == [[13]]
    done = [r for r in rows if r["state"] == "DONE"]
    outputs = published(cluster)
    assert sorted(outputs) == sorted(r["id"] for r in done)
    ids = sorted(w for o in outputs.values() for w in o["ids"])
    assert ids == [w for w in range(1, 41) if w != 13]  # each effect exactly once
    starts = cluster.marks_of("start")
    assert len(starts) == len(set(starts))


@on("sqlite")
def test_a_batching_worker_killed_with_unrecorded_successes_loses_no_effect(
    cluster: Cluster,
) -> None:
    """A worker that holds successes for its next batch is SIGKILLed: those chunks are
    reaped and rerun (their first attempt never recorded, never published), and every
    work id's effect is published exactly once."""
    cluster.orchestrator("o1")
    doomed = cluster.worker("--prefetch", "8")
    run = cluster.cli("submit", "effect", "--work-ids", "1-200", "--kwarg", "sleep=0.01")["run"]
    until(lambda: len(cluster.marks_of("end")) >= 30, 60, "thirty chunks to end")
    os.kill(doomed.pid, signal.SIGKILL)
    cluster.worker("--prefetch", "8")
    until(lambda: run_state(cluster, run) != "MASTER", 120, "the run to end")
    assert run_state(cluster, run) == "DONE"
    rows = cluster.queue.graph(run)
    outputs = published(cluster)
    assert sorted(outputs) == sorted(r["id"] for r in rows)
    assert sorted(w for o in outputs.values() for w in o["ids"]) == list(range(1, 201))
    for r in rows:  # the published output is the recorded attempt's
        assert outputs[r["id"]]["attempt"] == r["output_attempt"] == r["attempt"]
    assert any(r["attempt"] == 2 for r in rows)  # some were rerun after the kill


@on("postgres", "mariadb")
def test_cancel_stops_the_running_code(cluster: Cluster) -> None:
    cluster.worker()
    run = cluster.cli("submit", "patient")["run"]
    until(lambda: cluster.marks_of("start"), 30, "the chunk to start")
    cluster.cli("cancel", str(run))
    until(lambda: run_state(cluster, run) == "CANCELED", 15, "the run to be cancelled")
    (chunk,) = cluster.queue.graph(run)
    assert chunk["state"] == "CANCELED"
    time.sleep(1)
    assert cluster.marks_of("end") == []


@on("sqlite")
def test_a_chunk_past_its_timeout_is_stopped(cluster: Cluster) -> None:
    cluster.worker()
    run = cluster.cli("submit", "slow")["run"]
    until(lambda: run_state(cluster, run) == "FAILED", 30, "the timeout")
    (chunk,) = cluster.queue.graph(run)
    assert "timed out after 2s" in chunk["error"]
    assert cluster.marks_of("end") == []


def test_a_crash_mid_submit_leaves_no_rows(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    JobQueue(url).close()
    procs = Path(__file__).with_name("procs.py")
    result = subprocess.run(
        [sys.executable, str(procs), "submit-and-die", url], env=subprocess_env, check=False
    )
    assert result.returncode == -signal.SIGKILL
    queue = JobQueue(url)
    with queue.db.read() as conn:
        assert conn.execute(select(func.count()).select_from(chunks)).scalar() == 0
    queue.close()


@on("sqlite")
def test_the_control_plane_sees_workers_come_and_go(cluster: Cluster) -> None:
    w = cluster.worker()
    cp = connect(cluster.control)
    from riverbed.control import Registry
    from riverbed.jobs.worker import WORKERS

    reg = Registry(cp, WORKERS)
    until(lambda: reg.members(), 30, "the worker to register")
    w.terminate()
    w.wait(timeout=10)
    until(lambda: not reg.members(), 10, "the worker to deregister")
    cp.close()


@pytest.mark.spark
@on("sqlite")  # not about the database
def test_spark_chunks_share_one_warm_session_and_cancel_ends_their_python_workers(
    cluster: Cluster,
) -> None:
    cluster.worker("--kinds", "spark")
    run = cluster.cli("submit", "sparky", "--work-ids", "1-3")["run"]
    until(lambda: run_state(cluster, run) != "MASTER", 180, "the Spark run to end")
    assert run_state(cluster, run) == "DONE"
    outputs = list(published(cluster, "sparky").values())
    assert sorted(o["ids"][0] for o in outputs) == [1, 2, 3]
    assert {o["count"] for o in outputs} == {1000}
    assert len({o["app"] for o in outputs}) == 1  # one SparkSession for every chunk
    assert len({o["pid"] for o in outputs}) == 1
    # the worker's Spark settings (RIVERBED_SPARK_CONF here, as riverbed.toml's [spark])
    # reach the chunks' session, not only its master
    assert {o["partitions"] for o in outputs} == {TEST_CONF["spark.sql.shuffle.partitions"]}
    # Cancel a chunk stuck in a Python task. PySpark's daemon puts itself and the
    # workers it forks in a process group of their own: killing the executor's group
    # would leave the worker running; the executor's session takes it along.
    stuck = cluster.cli("submit", "sparky", "--work-ids", "9", "--kwarg", "hang=1")["run"]
    (mark,) = until(lambda: list(cluster.marks.glob("pyworker-*")), 120, "the Python task")
    cluster.cli("cancel", str(stuck))
    until(lambda: run_state(cluster, stuck) == "CANCELED", 30, "the run to be cancelled")
    pid = int(mark.name.split("-")[1])
    until(lambda: not is_alive(pid), 15, f"the chunk's Python worker {pid} to be killed")


@on("sqlite")
def test_the_development_runner_gives_spark_chunks_the_configured_settings(
    cluster: Cluster,
) -> None:
    """`jobs run` runs the chunks in the CLI's own process (no worker here to take
    them): their session has riverbed's Spark settings, not only its master."""
    assert cluster.cli("run", "sparky", "--work-ids", "7")["state"] == "DONE"
    (output,) = published(cluster, "sparky").values()
    assert output["ids"] == [7] and output["pid"] != os.getpid()
    assert output["partitions"] == TEST_CONF["spark.sql.shuffle.partitions"]


def _drop_connections(server: Any, kind: str, dbname: str) -> None:
    """The database server ends every connection to ``dbname`` (but the asker's)."""
    if kind == "postgres":
        server.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
        )
        return
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = %s AND id <> "
                "CONNECTION_ID()",
                (dbname,),
            )
            for (thread,) in cur.fetchall():
                with contextlib.suppress(pymysql.Error):  # ended meanwhile
                    cur.execute(f"KILL CONNECTION {int(thread)}")
    finally:
        conn.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_workers_ride_out_lost_database_connections(
    tmp_path: Path, subprocess_env: dict[str, str], request: pytest.FixtureRequest, kind: str
) -> None:
    """The database server drops every connection of the jobs database, twice, mid-run:
    the worker and the orchestrator keep going, and every chunk is recorded and
    published once, by its first attempt."""
    server, db = request.getfixturevalue(f"{kind}_server"), request.getfixturevalue(f"{kind}_db")
    c = Cluster(tmp_path, subprocess_env, db=db)
    try:
        c.orchestrator("o1")
        worker = c.worker()
        run = c.cli("submit", "effect", "--work-ids", "1-8", "--kwarg", "sleep=0.5")["run"]
        dbname = db.rsplit("/", 1)[1].split("?")[0]
        for n in (1, 3):
            until(lambda: len(c.marks_of("start")) >= n, 60, f"chunk {n} to start")  # noqa: B023
            _drop_connections(server, kind, dbname)
        until(lambda: run_state(c, run) != "MASTER", 90, "the run to end")
        assert run_state(c, run) == "DONE"
        assert worker.poll() is None  # still working
        log = next(tmp_path.glob("worker-*.log")).read_text()
        assert "recording its end failed" in log or "jobs database error" in log  # it was hit
        graph = c.queue.graph(run)
        assert len(graph) == 4 and all(r["attempt"] == 1 for r in graph)
        assert published(c) == {
            r["id"]: {"ids": json.loads(r["work_ids"]), "attempt": 1} for r in graph
        }
    finally:
        c.stop()


@pytest.mark.spark
@on("sqlite")  # not about the database
def test_a_time_range_job_runs_under_the_orchestrator_and_resumes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TimeRangeJob.as_job``: each run drives the job up to its ``end``, resuming what
    earlier runs published; a run whose input is not there yet fails (and is retried)
    without publishing anything."""
    import numpy as np
    import pandas as pd

    from riverbed.jobs.timerange import Output, load_spec
    from riverbed.timerange.oracle import pandas_rows
    from tests.jobs.test_timerange_spark import assert_same, write_input

    start = pd.Timestamp("2026-01-01", tz="UTC")
    rng = np.random.default_rng(4)
    frame = pd.DataFrame(
        {
            "sensor": rng.integers(0, 4, 400),
            "ts": start + pd.to_timedelta(rng.integers(0, 4 * 3600, 400), unit="s"),
            "value": rng.integers(0, 100, 400) / 4,
        }
    )
    for hour in range(4):
        lo = start + pd.Timedelta(hours=hour)
        part = frame[(frame.ts >= lo) & (frame.ts < lo + pd.Timedelta(hours=1))]
        write_input(cluster.tmp / "input" / f"hour={lo:%Y-%m-%dT%H}", part)
    cluster.orchestrator("o1")
    cluster.worker("--kinds", "spark,python")
    cp = connect(cluster.control)

    def chunk_versions() -> dict[str, int]:
        prefix = b"riverbed/timerange/readings/chunks/"
        return {kv.key.decode().rsplit("/", 1)[1]: kv.version for kv in cp.get_prefix(prefix)}

    first = cluster.cli("submit", "readings", "--kwarg", "end=2026-01-01T02:00")["run"]
    until(lambda: run_state(cluster, first) != "MASTER", 240, "the first run to end")
    assert run_state(cluster, first) == "DONE"
    assert len(chunk_versions()) == 2

    second = cluster.cli("submit", "readings", "--kwarg", "end=2026-01-01T04:00")["run"]
    until(lambda: run_state(cluster, second) != "MASTER", 240, "the second run to end")
    assert run_state(cluster, second) == "DONE"
    versions = chunk_versions()
    assert len(versions) == 4 and set(versions.values()) == {1}  # each chunk published once

    # hour 4 has no input yet: the run fails on its last attempt, naming the partition
    third = cluster.cli("submit", "readings", "--kwarg", "end=2026-01-01T05:00")["run"]
    until(lambda: run_state(cluster, third) != "MASTER", 240, "the third run to end")
    assert run_state(cluster, third) == "FAILED"
    (chunk,) = cluster.queue.graph(third)
    assert chunk["attempt"] == 2
    assert "hour=2026-01-01T04 does not exist" in cluster.queue.get(chunk["id"])["error"]
    assert len(chunk_versions()) == 4
    cp.close()

    monkeypatch.chdir(cluster.tmp)  # relative paths in a spec are the caller's, like the workers'
    spec = load_spec(cluster.tmp / "jobs" / "readings.py")  # the CLI reads the same file
    assert spec.job.output == str(cluster.tmp / "trout")
    got = Output(str(cluster.tmp / "trout")).read("rows").to_pandas()
    assert_same(got, pandas_rows(spec.job, frame), exact=False)


@on("mariadb")
def test_an_executor_whose_worker_was_killed_stops_quietly(cluster: Cluster) -> None:
    """SIGKILL a worker mid-chunk: its executor (own process group, so not killed with
    it) stops its chunk at once and exits with one log line — no traceback anywhere."""
    cluster.orchestrator("o1")
    doomed = cluster.worker()
    run = cluster.cli("submit", "effect", "--work-ids", "1-2", "--kwarg", "sleep=60")["run"]
    (mark,) = until(lambda: list(cluster.marks.glob("start-*")), 30, "the chunk to start")
    executor = int(until(mark.read_text, 5, "the executor's pid"))
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    until(lambda: not Path(f"/proc/{executor}").exists(), 10, "the orphaned executor to exit")
    cluster.worker()
    until(
        lambda: run_state(cluster, run) != "MASTER" or len(cluster.marks_of("start")) > 1,
        60,
        "the chunk to be reaped and started again",
    )
    assert cluster.marks_of("end") == []  # the orphan did not finish its chunk
    chunk, attempt = (int(part) for part in mark.name.split("-")[1:])
    said = log_path(cluster.home, chunk, attempt).read_text()  # the attempt's own log
    assert said.count(f"its worker (pid {doomed.pid}) is gone; stopping its chunk") == 1
    for log in [*cluster.tmp.glob("*.log"), *(cluster.home / "jobs" / "logs").glob("*.log")]:
        assert "Traceback" not in log.read_text(), log.name
