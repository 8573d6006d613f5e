"""Publishing a chunk's output on a worker's home directory: idempotent, race-free,
never won by an older attempt, seen by outside readers through ``chunk=<id>``, and
outputs an older riverbed published there adopted."""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from riverbed.jobs.context import Context, Output
from riverbed.jobs.outputs import OUTPUTS, open_publication
from riverbed.jobs.publication import attempt_prefix, staging_dir

JOB = "j"


def stage(home: Path, chunk: int, attempt: int) -> None:
    out = Output(staging_dir(home, chunk, attempt))
    out.write_json("effect.json", {"chunk": chunk, "attempt": attempt})


def published_dir(home: Path, chunk: int) -> Path:
    return home / OUTPUTS / JOB / f"chunk={chunk}"


def attempt_dir(home: Path, chunk: int, attempt: int) -> Path:
    return home / OUTPUTS / attempt_prefix(JOB, chunk, attempt)


def shown(home: Path, chunk: int) -> int | None:
    """The attempt whose file the published chunk directory shows, read as a reader."""
    path = published_dir(home, chunk) / "effect.json"
    if not path.exists():
        return None
    value: dict[str, int] = json.loads(path.read_text())
    assert value["chunk"] == chunk
    return value["attempt"]


def test_publish_moves_the_staging_and_readers_find_it() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        pub = open_publication(home)
        stage(home, 7, 1)
        assert pub.publish(JOB, 7, 1) is True
        assert not staging_dir(home, 7, 1).exists()
        assert shown(home, 7) == 1 and pub.published_attempt(JOB, 7) == 1
        assert pub.publish(JOB, 7, 1) is True  # again: nothing to do, still published
        ctx = Context(7, 1, "reader", [], {}, None, Output(home / "x"), home=home)
        found = ctx.published(JOB, "effect.json")
        assert found == attempt_dir(home, 7, 1) / "effect.json"  # read in place, no copy
        assert not (home / "jobs" / "cache").exists()
        # readers globbing chunk=* see one entry per chunk, never the attempts
        assert [p.name for p in (home / OUTPUTS / JOB).glob("chunk=*")] == ["chunk=7"]


def test_an_older_attempt_never_replaces_a_newer_one() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        pub = open_publication(home)
        stage(home, 1, 1)
        stage(home, 1, 2)
        assert pub.publish(JOB, 1, 2) is True
        assert pub.publish(JOB, 1, 1) is False  # the zombie arrives late: refused
        assert shown(home, 1) == 2
        assert not attempt_dir(home, 1, 1).exists()  # and its copy is gone
        pub.retract(JOB, 1, 1)  # a fenced zombie retracting leaves the newer output
        assert shown(home, 1) == 2
        pub.retract(JOB, 1, 2)
        assert shown(home, 1) is None and not published_dir(home, 1).is_symlink()


def test_outputs_an_older_riverbed_published_are_adopted_once(tmp_path: Path) -> None:
    """Before markers: ``chunk=<id>`` a symlink to ``.attempts/chunk=<id>-<n>`` (or, older
    still, the directory itself). Opening the home gives them markers; they read as
    published, a rerun replaces them, and a retract removes them."""
    home = tmp_path
    root = home / OUTPUTS / JOB
    old = root / ".attempts" / "chunk=1-3"
    old.mkdir(parents=True)
    (old / "effect.json").write_text('{"chunk": 1, "attempt": 3}')
    os.symlink(Path(".attempts") / "chunk=1-3", root / "chunk=1")
    (root / "chunk=2").mkdir()  # "attempt 0"
    (root / "chunk=2" / "effect.json").write_text('{"chunk": 2, "attempt": 0}')
    pub = open_publication(home)
    assert sorted(pub.chunks(JOB)) == [1, 2]
    assert (pub.published_attempt(JOB, 1), pub.published_attempt(JOB, 2)) == (3, 0)
    assert (shown(home, 1), shown(home, 2)) == (3, 0)
    assert published_dir(home, 2).is_symlink()  # now a view, as every chunk's
    stage(home, 2, 1)
    assert pub.publish(JOB, 2, 1) is True and shown(home, 2) == 1
    assert not attempt_dir(home, 2, 0).exists()
    pub.retract(JOB, 1, 3)
    assert shown(home, 1) is None and pub.chunks(JOB) == [2] and not old.exists()
    # adopted once: a chunk published the old way after that is not looked for again
    again = root / ".attempts" / "chunk=9-1"
    again.mkdir()
    os.symlink(Path(".attempts") / "chunk=9-1", root / "chunk=9")
    from riverbed.jobs.publication import Publication, adopt_old_layout

    assert adopt_old_layout(pub.store) == 0
    assert Publication(pub.store, home).published_attempt(JOB, 9) is None


# The model of publication (publish, publish-empty, retract in any order) runs on this
# implementation and the object-store one in test_publication_contract.py.


ROUNDS = 1000


def _publish_all(home: str, attempts: list[int], barrier: Any, answers: Any) -> None:
    results = []
    pub = open_publication(Path(home))
    for chunk, attempt in enumerate(attempts):
        barrier.wait(timeout=60)
        try:
            results.append(pub.publish(JOB, chunk, attempt))
        except Exception as exc:  # every error is reported back, with its type
            results.append(f"{type(exc).__name__}: {exc}")
    answers.put(results)


@pytest.mark.slow
@pytest.mark.parametrize("who", ["same attempt", "zombie and current"])
def test_two_processes_publishing_at_once_1000_times(tmp_path: Path, who: str) -> None:
    """The worker and an orchestrator publishing one attempt, or a zombie and the
    current attempt publishing theirs, at the same moment, 1,000 times."""
    home = tmp_path
    for chunk in range(ROUNDS):
        stage(home, chunk, 2)
        if who != "same attempt":
            stage(home, chunk, 1)
    first = [2] * ROUNDS
    second = [2] * ROUNDS if who == "same attempt" else [1] * ROUNDS
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    answers = ctx.Queue()
    procs = [
        ctx.Process(target=_publish_all, args=(str(home), attempts, barrier, answers))
        for attempts in (first, second)
    ]
    for p in procs:
        p.start()
    got = [answers.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [r for results in got for r in results if not isinstance(r, bool)]
    assert errors == []
    for chunk in range(ROUNDS):
        assert shown(home, chunk) == 2
        assert not staging_dir(home, chunk, 2).exists()
        assert not attempt_dir(home, chunk, 1).exists()
    if who == "same attempt":  # both callers see it published
        assert all(all(results) for results in got)
    else:  # the current attempt always wins; the zombie only where it came first
        current = next(r for r in got if all(r))
        assert len(current) == ROUNDS
