"""Where job outputs are published (riverbed.jobs.outputs) and the parts around the
publication that are not its contract: the orchestrator's sweep, and a job's
``ctx.published`` reading outputs from a bucket as local files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from riverbed.control import connect
from riverbed.jobs.context import Context, Output
from riverbed.jobs.orchestrator import Orchestrator
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import Publication, cache_dir, staging_dir
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.spec import Catalog
from riverbed.storage import open_store


def test_open_publication_follows_a_bucket_location(tmp_path: Path) -> None:
    home = str(tmp_path / "jobs" / "output")
    assert open_publication(tmp_path, None).location == home
    assert open_publication(tmp_path, tmp_path / "cp").location == home
    assert open_publication(tmp_path, (tmp_path / "cp").as_uri()).location == home
    pub = open_publication(tmp_path, "memory://pubs/prefix")
    assert pub.location == "memory://pubs/prefix/jobs/output"


def _publish(pub: Publication, job: str, chunk: int, attempt: int, **files: object) -> None:
    out = Output(staging_dir(pub.home, chunk, attempt))
    for name, value in files.items():
        out.write_json(f"{name}.json", value)
    assert pub.publish(job, chunk, attempt) is True


def test_ctx_published_reads_a_buckets_outputs_as_local_copies(tmp_path: Path) -> None:
    writer = Publication(open_store(f"memory://ctx-{os.urandom(4).hex()}"), tmp_path / "a")
    _publish(writer, "up", 1, 1, day1={"v": 1})
    _publish(writer, "up", 2, 3, day2={"v": 2}, day1={"v": "rerun"})
    # another machine: its own home, the same bucket
    reader = Publication(writer.store, tmp_path / "b")
    ctx = Context(1, 1, "down", [1], {}, None, Output(tmp_path / "s"), publication=reader)
    path = ctx.published("up", "day1.json")
    assert path is not None and json.loads(path.read_text()) == {"v": "rerun"}  # newest chunk
    assert path.is_relative_to(cache_dir(tmp_path / "b", "up", 2, 3))
    assert sorted(ctx.published_files("up")) == ["day1.json", "day2.json"]
    assert ctx.published("up", "day9.json") is None
    _publish(writer, "up", 2, 4, day2={"v": 4})  # a rerun of chunk 2: the copy follows
    assert json.loads(ctx.published_files("up", "day2*")["day2.json"].read_text()) == {"v": 4}
    assert not cache_dir(tmp_path / "b", "up", 2, 3).exists()  # the stale copy went
    assert json.loads(ctx.published("up", "day1.json").read_text()) == {"v": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["directory", "bucket"])
def test_the_leading_orchestrator_sweeps_leftovers_of_every_job(kind: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "j.py").write_text("from riverbed.jobs import Job\njob = Job(main=print)\n")
    location = None if kind == "directory" else f"memory://sweep-{os.urandom(4).hex()}"
    pub = open_publication(tmp_path, location)

    def leftover(attempt: int) -> None:  # what a publisher killed between its steps left
        pub.store.put(f"j/.attempts/chunk=1-{attempt}/x.json", b"{}")

    def kept() -> list[str]:
        return pub.store.entries("j/.attempts/")

    leftover(1)
    Output(staging_dir(tmp_path, 1, 2)).write_json("x.json", {})
    assert pub.publish("j", 1, 2)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    try:
        orch = Orchestrator(
            queue, cp, Catalog(jobs), tmp_path, checkpoints=location, sweep_every=3600
        )
        queue.fence(1, "test")
        orch.duties(1)
        assert kept() == ["chunk=1-2"] and orch.stats.swept == 1
        leftover(0)
        orch.duties(1)  # the next sweep is an hour away
        assert kept() == ["chunk=1-0", "chunk=1-2"] and orch.stats.swept == 1
    finally:
        queue.close()
        cp.close()
