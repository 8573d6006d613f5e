"""What a dependent may assume when it starts: its upstream chunks' output is in place.

Workers here publish and record DONE with a failpoint between the two steps
(``RIVERBED_JOBS_FAULT``): a 0.3 s delay, and a SIGKILL of the worker with probability
0.3, at that point of every success. Whatever the order of those two steps, a dependent
chunk claimed in that window, or after a crash in it, must find its inputs — on this
machine's disk, and in a bucket when each killed worker's machine is lost with it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from riverbed.storage import open_store
from tests.jobs.cluster import Cluster, published, run_state
from tests.jobs.conftest import on

pytestmark = pytest.mark.slow

UP = """
from riverbed.jobs import Job

def main(ctx, work_ids):
    for w in work_ids:
        ctx.output.write_json(f"id={w}.json", {"w": w, "chunk": ctx.chunk_id,
                                               "attempt": ctx.attempt})

job = Job(main=main, chunk_size=1, retries=9, retry_backoff=0)
"""

DOWN = """
import json, os, pathlib
from riverbed.jobs import Dependency, Job

def main(ctx, work_ids):
    marks = pathlib.Path(os.environ["MARKS"])
    for w in work_ids:
        path = ctx.published("up", f"id={w}.json")
        seen = json.loads(path.read_text()) if path is not None else None
        # atomically: a worker killed mid-write leaves no torn mark
        mark = marks / f"read-{ctx.chunk_id}-{ctx.attempt}-{w}"
        tmp = marks / f".{mark.name}.{os.getpid()}"
        tmp.write_text(json.dumps(seen))
        os.replace(tmp, mark)
    ctx.output.write_json("done.json", {"ids": work_ids})

job = Job(main=main, chunk_size=2, retries=9, retry_backoff=0,
          dependencies=[Dependency("up")])
"""

IDS = 16


# s3 is SQLite with outputs in a bucket: every database, both backends
@on("postgres", "mariadb", "s3")
def test_every_dependent_read_finds_published_upstream_output(cluster: Cluster) -> None:
    in_bucket = cluster.checkpoints is not None
    run, machines = _dependents_read_what_is_published(cluster, lose_machines=in_bucket)
    if not in_bucket:
        return
    # In a bucket, each killed worker's machine was lost with it (its home deleted).
    assert len(machines) > 3
    assert not (cluster.home / "jobs" / "output").exists()  # nothing published on a disk
    kept = open_store(f"{cluster.checkpoints}/jobs/output").entries("up/.attempts/")
    graph = cluster.queue.graph(run)
    recorded = {f"chunk={r['id']}-{r['output_attempt']}" for r in graph if r["job"] == "up"}
    assert set(kept) >= recorded  # every recorded output is there; the rest is swept later


def _dependents_read_what_is_published(
    c: Cluster, lose_machines: bool = False
) -> tuple[int, list[Path]]:
    """The scenario; with ``lose_machines``, each worker has a home of its own (its
    machine), deleted when the failpoint kills it. Returns the homes used."""
    cluster = c
    (cluster.tmp / "jobs" / "up.py").write_text(UP)
    (cluster.tmp / "jobs" / "down.py").write_text(DOWN)
    cluster.env["RIVERBED_JOBS_FAULT"] = "publish_done:0.3:0.3"
    cluster.orchestrator("o1")
    homes: list[Path] = []

    def machine() -> Path | None:
        if not lose_machines:
            return None
        homes.append(cluster.tmp / f"machine-{len(homes)}")
        return homes[-1]

    workers = [(cluster.worker(home=home), home) for home in [machine() for _ in range(3)]]
    run = cluster.cli("submit", "down", "--work-ids", f"1-{IDS}")["run"]
    kills = 0
    deadline = time.monotonic() + 150
    while run_state(cluster, run) == "MASTER":  # a supervisor: restart what the fault killed
        assert time.monotonic() < deadline, "the run did not end in 150 s"
        for i, (w, home) in enumerate(workers):
            if w.poll() is not None:
                kills += 1
                if home is not None:
                    shutil.rmtree(home)  # the machine is lost with the worker
                new = machine()
                workers[i] = (cluster.worker(home=new), new)
        time.sleep(0.1)
    assert run_state(cluster, run) == "DONE"
    assert kills >= 1  # the failpoint killed workers in the window (P(none) ~ 1e-5)

    up = {row["id"]: row for row in cluster.queue.graph(run) if row["job"] == "up"}
    final = {}  # work id -> the up output that is published (and recorded) now
    for chunk_id, out in published(cluster, "up", "id=*.json").items():
        assert out["attempt"] == up[chunk_id]["output_attempt"] == up[chunk_id]["attempt"]
        final[out["w"]] = out
    assert sorted(final) == list(range(1, IDS + 1))
    reads = sorted(cluster.marks.glob("read-*"))
    assert {int(p.name.rsplit("-", 1)[1]) for p in reads} == set(range(1, IDS + 1))
    for path in reads:  # every read, by every attempt of every dependent
        seen = json.loads(path.read_text())
        w = int(path.name.rsplit("-", 1)[1])
        assert seen == final[w], f"{path.name} read {seen}, published is {final[w]}"
    return run, homes


ONCE = """
from riverbed.jobs import Job

def main(ctx, work_ids):
    ctx.output.write_json("out.json", {"ids": work_ids, "attempt": ctx.attempt})

job = Job(main=main)  # no retries: a lost attempt ends the chunk FAILED
"""


def test_output_of_an_attempt_lost_after_publishing_is_retracted_when_the_reap_fails_it(
    cluster: Cluster,
) -> None:
    """The worker dies right after publishing, before DONE (failpoint, probability 1);
    the orchestrator reaps the chunk and, with no retry left, fails it: the published
    output of the lost attempt is taken back, then its objects deleted. Both happen in
    the orchestrator's duty right after the reap's commit, so the run reads FAILED a
    moment before they are done (a window riverbed does not close yet: retracting
    before the reap could take back the output of a worker that records DONE meanwhile)."""
    (cluster.tmp / "jobs" / "once.py").write_text(ONCE)
    cluster.env["RIVERBED_JOBS_FAULT"] = "publish_done:0:1"
    cluster.orchestrator("o1")
    doomed = cluster.worker()
    run = cluster.cli("submit", "once", "--work-ids", "1")["run"]
    assert doomed.wait(timeout=60) == -9  # killed by the failpoint, after publishing
    deadline = time.monotonic() + 60
    while run_state(cluster, run) == "MASTER":
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.1)
    (chunk,) = cluster.queue.graph(run)
    assert chunk["state"] == "FAILED" and "lost" in (chunk["error"] or "")
    attempts = cluster.home / "jobs" / "output" / "once" / ".attempts"
    # the duty that reaped it retracts next (its reader view first, then the objects)
    deadline = time.monotonic() + 30
    while published(cluster, "once", "out.json") or list(attempts.glob("chunk=*")):
        assert time.monotonic() < deadline, (
            "the lost attempt's output is still there 30 s after its chunk FAILED: "
            f"{published(cluster, 'once', 'out.json')}, {list(attempts.glob('chunk=*'))}"
        )
        time.sleep(0.1)
