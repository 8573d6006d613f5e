"""The jobs layer as people deploy it, under fire.

A supervisor starts two orchestrators, three workers and the submitting client at the
same moment on a fresh PostgreSQL or MariaDB database; a DAG of three jobs with dependent chunks,
poison ids and ids that hang on their first attempt runs while workers are SIGKILLed
every few seconds (and restarted, as a supervisor would), the leading orchestrator is
SIGKILLed once, and one worker is SIGSTOPped past its lease and resumed. Then:

* every chunk that ended DONE has its output published once, by the attempt recorded,
  and each work id's effect is published exactly once per job;
* every dependent read — by every attempt of every chunk — saw its upstream's published
  output;
* poison ids end isolated (each alone in a FAILED chunk), hanging ids timed out and
  succeeded on a later attempt;
* no process died except those killed, and no log holds a traceback other than the
  poison job's own error in its attempt's log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from typing import Any

import pytest
from sqlalchemy import select

from riverbed.jobs.schema import chunks, meta
from riverbed.jobs.worker import log_path
from riverbed.testing.signals import stop_outside_writes
from tests.jobs.cluster import Cluster, run_state
from tests.jobs.conftest import SERVERS

pytestmark = [pytest.mark.slow]

IDS = 60
POISON = {7, 41}
HANG = {12, 50}

A = f"""
import time
from riverbed.jobs import Job

def main(ctx, work_ids):
    time.sleep(1.0)  # work that takes a while: kills land mid-chunk
    for w in work_ids:
        if w in {sorted(POISON)}:
            raise ValueError(f"poison work id {{w}}")
        if w in {sorted(HANG)} and ctx.attempt == 1:
            time.sleep(60)  # hangs: the timeout stops it, a retry succeeds
        ctx.output.write_json(f"id={{w}}.json", {{"w": w, "v": w * 10, "chunk": ctx.chunk_id,
                                                "attempt": ctx.attempt}})

job = Job(main=main, chunk_size=2, retries=2, retry_backoff=0, timeout="8s", bisect=True)
"""

READER = """
import json, os, pathlib, time
from riverbed.jobs import Dependency, Job

def main(ctx, work_ids):
    time.sleep(0.5)
    marks = pathlib.Path(os.environ["MARKS"])
    for w in work_ids:
        path = ctx.published("{up}", f"id={{w}}.json")
        seen = json.loads(path.read_text()) if path is not None else None
        # atomically: a worker SIGKILLed mid-write must not leave a torn mark (an
        # empty file read back as what the chunk saw)
        mark = marks / f"read-{{ctx.job}}-{{ctx.chunk_id}}-{{ctx.attempt}}-{{w}}"
        tmp = marks / f".{{mark.name}}.{{os.getpid()}}"
        tmp.write_text(json.dumps(seen))
        os.replace(tmp, mark)
        ctx.output.write_json(f"id={{w}}.json", {{"w": w, "v": (seen or {{}}).get("v", -1) + 1,
                                                "chunk": ctx.chunk_id, "attempt": ctx.attempt}})

job = Job(main=main, chunk_size={size}, retries=5, retry_backoff=0,
          dependencies=[Dependency("{up}")])
"""


def outputs(c: Cluster, job: str) -> dict[int, list[dict[str, Any]]]:
    """Every published file of ``job``, by chunk id."""
    found: dict[int, list[dict[str, Any]]] = {}
    for d in (c.home / "jobs" / "output" / job).glob("chunk=*"):
        found[int(d.name[6:])] = [json.loads(p.read_text()) for p in d.glob("id=*.json")]
    return found


@pytest.mark.parametrize("kind", SERVERS)
def test_jobs_hold_under_chaos_on_a_fresh_database(
    tmp_path: Any, subprocess_env: dict[str, str], request: pytest.FixtureRequest, kind: str
) -> None:
    c = Cluster(tmp_path, subprocess_env, db=request.getfixturevalue(f"{kind}_db"))
    try:
        _chaos(c)
    finally:
        c.stop()


def _spared(c: Cluster) -> set[int]:
    """Pids of the workers a kill must spare: those running a chunk that holds a hanging
    id (its timeout, not a kill, must stop it), or a chunk on its last attempt (a kill
    there fails the chunk: kills may cost only what retries absorb — on a slow host
    fresh workers die before finishing anything, and the same chunk, claimed first
    each time, would otherwise lose every attempt). A worker's id is
    ``<host>-<pid>-<random>``."""
    with c.queue.db.read() as conn:
        rows = conn.execute(
            select(
                chunks.c.worker, chunks.c.work_ids, chunks.c.attempt, chunks.c.max_attempts
            ).where(chunks.c.state == "RUNNING")
        ).all()
    return {
        int(w.split("-")[-2])
        for w, ids, attempt, most in rows
        if w and (set(json.loads(ids)) & HANG or attempt >= most)
    }


def _chaos(c: Cluster) -> None:
    (c.tmp / "jobs" / "a.py").write_text(A)
    (c.tmp / "jobs" / "b.py").write_text(READER.format(up="a", size=3))
    (c.tmp / "jobs" / "c.py").write_text(READER.format(up="b", size=6))
    c.env["RIVERBED_JOBS_FAULT"] = "publish_done:0.05:0"  # a wider window between the steps
    rng = random.Random(28)

    # everything starts at the same moment, the database empty
    orchestrators = {name: c.orchestrator(name) for name in ("o1", "o2")}
    workers = [c.worker() for _ in range(3)]
    submit = subprocess.Popen(
        [*c.command, "jobs", "submit", "c", "--work-ids", f"1-{IDS}", "--json"],
        env=c.env,
        cwd=c.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    run = json.loads(out)["run"]

    killed: set[int] = set()  # pids this test killed
    stopped: subprocess.Popen[bytes] | None = None
    start = time.monotonic()
    next_kill = start + 3.0
    leader_killed = False
    while run_state(c, run) == "MASTER":
        now = time.monotonic()
        assert now - start < 100, "the run did not end in 100 s"
        if stopped is None and now - start > 2.0:  # past its 2 s lease, then resumed
            stopped = workers[0]
            stop_outside_writes(stopped.pid, c.control, c.db)  # not mid-write: docs/control.md
            stop_until = now + 5.0
        if stopped is not None and stop_until and now > stop_until:
            os.kill(stopped.pid, signal.SIGCONT)
            stop_until = 0.0
        if not leader_killed and now - start > 5.0:
            with c.queue.db.read() as conn:
                leader = conn.execute(meta.select()).first()
            if leader is not None and leader.leader in orchestrators:
                proc = orchestrators.pop(leader.leader)
                os.kill(proc.pid, signal.SIGKILL)
                killed.add(proc.pid)
                orchestrators["o3"] = c.orchestrator("o3")  # the supervisor restarts it
                leader_killed = True
        if now > next_kill:
            # spare a worker that runs a hanging id (else both hang chunks can lose their
            # first attempt to kills, and the timeout path the test checks never runs)
            # or a last attempt. The victims are stopped while the test reads what they
            # run, so none claims a chunk between the read and the kill (a claim not yet
            # committed dies with its connection).
            alive = [p for p in workers[1:] if p.poll() is None and p is not stopped]
            for p in alive:
                os.kill(p.pid, signal.SIGSTOP)
            spared = _spared(c)
            victims = [p for p in alive if p.pid not in spared]
            victim = rng.choice(victims) if victims else None
            if victim is not None:
                os.kill(victim.pid, signal.SIGKILL)
                killed.add(victim.pid)
            for p in alive:
                if p is not victim:
                    os.kill(p.pid, signal.SIGCONT)
            if victim is not None:
                workers[workers.index(victim)] = c.worker()
            next_kill = now + (rng.uniform(2.0, 4.0) if victim is not None else 0.5)
        time.sleep(0.05)
    assert leader_killed and stopped is not None and len(killed) >= 4

    # no process died but those killed
    for proc in c.procs:
        if proc.pid not in killed:
            assert proc.poll() is None, f"pid {proc.pid} ({proc.args}) exited {proc.returncode}"

    graph = c.queue.graph(run)
    by_job: dict[str, list[dict[str, Any]]] = {}
    for row in graph:
        by_job.setdefault(row["job"], []).append(row)

    # poison ids isolated: each alone in a FAILED chunk of a; nothing else failed in a
    failed_a = [r for r in by_job["a"] if r["state"] == "FAILED"]
    assert sorted(json.loads(r["work_ids"])[0] for r in failed_a) == sorted(POISON), [
        (r["work_ids"], [(a["attempt"], a["error"]) for a in c.queue.get(r["id"])["attempts"]])
        for r in failed_a
    ]
    assert all(r["n_ids"] == 1 for r in failed_a)
    # hanging ids: their first attempt was stopped — by its timeout, or lost with a
    # killed worker first — and a later attempt succeeded; the timeout stopped one
    endings = []
    for r in by_job["a"]:
        if set(json.loads(r["work_ids"])) & HANG:
            assert r["state"] == "DONE", r
            first = c.queue.get(r["id"])["attempts"][0]
            assert first["state"] == "FAILED", first
            endings.append(first["error"])
    assert any("timed out" in e for e in endings), endings

    # every DONE chunk's output is published once, by its recorded attempt; each id once
    for job in ("a", "b", "c"):
        published = outputs(c, job)
        done = {r["id"]: r for r in by_job[job] if r["state"] == "DONE"}
        assert set(published) == set(done), job
        ids: list[int] = []
        for chunk, files in published.items():
            row = done[chunk]
            assert {f["attempt"] for f in files} == {row["attempt"]} == {row["output_attempt"]}
            assert sorted(f["w"] for f in files) == sorted(json.loads(row["work_ids"]))
            ids += [f["w"] for f in files]
        assert len(ids) == len(set(ids)), f"{job}: a work id published twice"
    a_ids = {f["w"] for files in outputs(c, "a").values() for f in files}
    assert a_ids == set(range(1, IDS + 1)) - POISON

    # every dependent read saw the upstream's published output
    final = {job: {f["w"]: f for files in outputs(c, job).values() for f in files} for job in "ab"}
    reads = list(c.marks.glob("read-*"))
    assert reads
    for path in reads:
        _, job, _chunk, _attempt, w = path.name.split("-")
        up = "a" if job == "b" else "b"
        assert json.loads(path.read_text()) == final[up][int(w)], path.name

    # no traceback in any process log; in attempt logs only the poison job's own error
    for log in c.tmp.glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name
    for r in graph:
        for a in c.queue.get(r["id"])["attempts"] if r["kind"] != "master" else []:
            path = log_path(c.home, r["id"], a["attempt"])
            text = path.read_text() if path.exists() else ""
            if "Traceback" in text:
                assert "ValueError: poison work id" in text, (path.name, text[-2000:])
