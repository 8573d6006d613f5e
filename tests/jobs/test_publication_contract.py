"""One contract for publishing a chunk's output, run on the directory implementation
(riverbed.jobs.publication: rename and a symlink under a lock) and the object-store one
(riverbed.jobs.objectpublication: create-only markers) on file, memory and s3 stores.

The model: the published attempt only grows by publish; an older attempt arriving late
is refused and leaves nothing behind; a retract of attempt a removes the output when it
is of a or older; a reader sees the whole output of the published attempt or none."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.jobs import publication
from riverbed.jobs.context import Output
from riverbed.jobs.objectpublication import ObjectPublication
from riverbed.jobs.publication import staging_dir
from riverbed.storage import ObjectStore, open_store

JOB = "j"


class Publisher(Protocol):
    home: Path

    def publish(self, job: str, chunk_id: int, attempt: int) -> bool: ...
    def retract(self, job: str, chunk_id: int, attempt: int) -> None: ...
    def published_attempt(self, job: str, chunk_id: int) -> int | None: ...
    def shown(self, chunk_id: int) -> list[int]: ...
    def kept(self) -> list[str]: ...


class Directory:
    """riverbed.jobs.publication, as the worker calls it."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def publish(self, job: str, chunk_id: int, attempt: int) -> bool:
        return publication.publish(self.home, job, chunk_id, attempt)

    def retract(self, job: str, chunk_id: int, attempt: int) -> None:
        publication.retract(self.home, job, chunk_id, attempt)

    def published_attempt(self, job: str, chunk_id: int) -> int | None:
        return publication.published_attempt(self.home, job, chunk_id)

    def shown(self, chunk_id: int) -> list[int]:
        folder = publication.published_dir(self.home, JOB, chunk_id)
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        return [json.loads(p.read_text())["attempt"] for p in files]

    def kept(self) -> list[str]:
        attempts = publication.job_output_dir(self.home, JOB) / publication.ATTEMPTS
        return sorted(p.name for p in attempts.glob("chunk=*")) if attempts.exists() else []


class Objects(ObjectPublication):
    def shown(self, chunk_id: int) -> list[int]:
        urls = self.published_files(JOB, chunk_id)
        keys = [u.removeprefix(self.store.url + "/") for u in urls]
        return [json.loads(self.store.get(k))["attempt"] for k in keys]

    def kept(self) -> list[str]:
        prefix = f"{JOB}/{publication.ATTEMPTS}/"
        return self.store.entries(prefix)


BACKENDS = ["directory", "file", "memory", pytest.param("s3", marks=pytest.mark.s3)]


def _store(kind: str, root: Path, request: pytest.FixtureRequest) -> ObjectStore:
    if kind == "file":
        return open_store((root / "bucket").as_uri())
    if kind == "memory":
        return open_store(f"memory://{request.node.name}-{os.urandom(4).hex()}")
    return open_store(f"{request.getfixturevalue('s3_url')}/{os.urandom(4).hex()}")


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of empty publishers of one backend (Hypothesis needs a fresh one per
    example)."""

    def new() -> Publisher:
        home = Path(tempfile.mkdtemp(dir=tmp_path))
        if request.param == "directory":
            return Directory(home)
        return Objects(_store(request.param, home, request), home)

    yield new


def stage(p: Publisher, chunk: int, attempt: int, files: int = 2) -> None:
    out = Output(staging_dir(p.home, chunk, attempt))
    for i in range(files):
        out.write_json(f"part-{i}.json", {"chunk": chunk, "attempt": attempt})


def test_publish_then_readers_see_every_file_once(make: Any) -> None:
    p = make()
    stage(p, 7, 1, files=3)
    assert p.publish(JOB, 7, 1) is True
    assert not staging_dir(p.home, 7, 1).exists()
    assert p.published_attempt(JOB, 7) == 1 and p.shown(7) == [1, 1, 1]
    assert p.publish(JOB, 7, 1) is True  # again: nothing to do, still published
    assert p.published_attempt(JOB, 8) is None and p.shown(8) == []


def test_an_older_attempt_never_replaces_a_newer_one(make: Any) -> None:
    p = make()
    stage(p, 1, 1)
    stage(p, 1, 2)
    assert p.publish(JOB, 1, 2) is True
    assert p.publish(JOB, 1, 1) is False  # the zombie arrives late: refused
    assert p.shown(1) == [2, 2] and p.kept() == ["chunk=1-2"]
    p.retract(JOB, 1, 1)  # a fenced zombie retracting leaves the newer output
    assert p.shown(1) == [2, 2]
    p.retract(JOB, 1, 2)
    assert p.published_attempt(JOB, 1) is None and p.shown(1) == [] and p.kept() == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["publish", "publish-empty", "retract"]), st.integers(1, 4)),
        max_size=10,
    )
)
def test_publication_follows_its_model(make: Any, ops: list[tuple[str, int]]) -> None:
    p = make()
    current: int | None = None
    staged: set[int] = set()
    for op, attempt in ops:
        if op == "publish":
            if attempt not in staged:  # each attempt stages once, as a worker does
                stage(p, 1, attempt)
                staged.add(attempt)
                expect = current is None or attempt >= current
            else:
                expect = current == attempt
            assert p.publish(JOB, 1, attempt) is expect
            if expect:
                current = attempt
        elif op == "publish-empty":  # staged nothing: reports, changes nothing
            if attempt in staged:
                continue
            assert p.publish(JOB, 1, attempt) is (current == attempt)
        else:
            p.retract(JOB, 1, attempt)
            if current is not None and current <= attempt:
                current = None
        assert p.published_attempt(JOB, 1) == current
        assert p.shown(1) == ([] if current is None else [current, current])
        assert p.kept() == ([] if current is None else [f"chunk=1-{current}"])


@pytest.mark.parametrize("kind", ["memory", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_sweep_removes_what_a_killed_zombie_uploaded_and_spares_newer_uploads(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(kind, tmp_path, request)
    p = Objects(store, tmp_path)
    prefix = f"{JOB}/{publication.ATTEMPTS}/"
    store.put(f"{prefix}chunk=4-1/part-0.json", b"{}")  # attempt 1 died mid-upload
    stage(p, 4, 2)
    assert p.publish(JOB, 4, 2) is True
    store.put(f"{prefix}chunk=4-3/part-0.json", b"{}")  # attempt 3 uploading right now
    assert p.sweep(JOB) == 1
    assert store.entries(prefix) == ["chunk=4-2", "chunk=4-3"]
    assert p.shown(4) == [2, 2]
