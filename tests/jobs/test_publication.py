"""Publishing a chunk's output: idempotent, race-free, and never won by an older attempt."""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from pathlib import Path
from typing import Any

import pytest

from riverbed.jobs.context import Context, Output
from riverbed.jobs.publication import (
    attempt_dir,
    publish,
    published_attempt,
    published_dir,
    retract,
    staging_dir,
)

JOB = "j"


def stage(home: Path, chunk: int, attempt: int) -> None:
    out = Output(staging_dir(home, chunk, attempt))
    out.write_json("effect.json", {"chunk": chunk, "attempt": attempt})


def shown(home: Path, chunk: int) -> int | None:
    """The attempt whose file the published chunk directory shows, read as a reader."""
    path = published_dir(home, JOB, chunk) / "effect.json"
    if not path.exists():
        return None
    value: dict[str, int] = json.loads(path.read_text())
    assert value["chunk"] == chunk
    return value["attempt"]


def test_publish_moves_the_staging_and_readers_find_it() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        stage(home, 7, 1)
        assert publish(home, JOB, 7, 1) is True
        assert not staging_dir(home, 7, 1).exists()
        assert shown(home, 7) == 1 and published_attempt(home, JOB, 7) == 1
        assert publish(home, JOB, 7, 1) is True  # again: nothing to do, still published
        ctx = Context(7, 1, "reader", [], {}, None, Output(home / "x"), home=home)
        assert ctx.published(JOB, "effect.json") == published_dir(home, JOB, 7) / "effect.json"
        # readers globbing chunk=* see one entry per chunk, never the attempts
        assert [p.name for p in (home / "jobs" / "output" / JOB).glob("chunk=*")] == ["chunk=7"]


def test_an_older_attempt_never_replaces_a_newer_one() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        stage(home, 1, 1)
        stage(home, 1, 2)
        assert publish(home, JOB, 1, 2) is True
        assert publish(home, JOB, 1, 1) is False  # the zombie arrives late: refused
        assert shown(home, 1) == 2
        assert not attempt_dir(home, JOB, 1, 1).exists()  # and its copy is gone
        retract(home, JOB, 1, 1)  # a fenced zombie retracting leaves the newer output
        assert shown(home, 1) == 2


# The model of publication (publish, publish-empty, retract in any order) runs on this
# implementation and the object-store one in test_publication_contract.py.


ROUNDS = 1000


def _publish_all(home: str, attempts: list[int], barrier: Any, answers: Any) -> None:
    results = []
    for chunk, attempt in enumerate(attempts):
        barrier.wait(timeout=60)
        try:
            results.append(publish(Path(home), JOB, chunk, attempt))
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
        assert not attempt_dir(home, JOB, chunk, 1).exists()
    if who == "same attempt":  # both callers see it published
        assert all(all(results) for results in got)
    else:  # the current attempt always wins; the zombie only where it came first
        current = next(r for r in got if all(r))
        assert len(current) == ROUNDS
