"""One contract for publishing a chunk's output (riverbed.jobs.publication: create-only
markers in an object store), on a home directory as workers open it (where ``chunk=<id>``
views show the published attempt to outside readers) and on memory and s3 stores.

The model: the published attempt only grows by publish; an older attempt arriving late
is refused and leaves nothing behind; a retract of attempt a removes the output when it
is of a or older; a reader sees the whole output of the published attempt or none."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.jobs import publication
from riverbed.jobs.context import Output
from riverbed.jobs.outputs import OUTPUTS, open_publication
from riverbed.jobs.publication import Publication, staging_dir
from riverbed.storage import ObjectStore, open_store

JOB = "j"


class Publisher:
    """A publication under test, and how the test looks behind it."""

    def __init__(self, pub: Publication, home: Path) -> None:
        self.pub = pub
        self.home = home
        self.store = pub.store

    def shown(self, chunk_id: int) -> list[int]:
        files = self.pub.published_files(JOB, chunk_id, "*.json")
        shown = [json.loads(files[n].read_text())["attempt"] for n in sorted(files)]
        urls = self.pub.published_urls(JOB, chunk_id)  # the local files are of these objects
        root = self.store.locate("").rstrip("/") + "/"
        keys = [u.removeprefix(root) for u in urls]
        assert [json.loads(self.store.get(k))["attempt"] for k in keys] == shown
        if self.store.url.startswith("file:"):  # what outside readers globbing chunk=* see
            view = self.home / OUTPUTS / JOB / f"chunk={chunk_id}"
            seen = [json.loads(f.read_text())["attempt"] for f in sorted(view.glob("*.json"))]
            assert seen == shown
        return shown

    def kept(self) -> list[str]:
        return self.store.entries(f"{JOB}/{publication.ATTEMPTS}/")


BACKENDS = ["directory", "memory", pytest.param("s3", marks=pytest.mark.s3)]


def _store(kind: str, request: pytest.FixtureRequest) -> ObjectStore:
    if kind == "memory":
        return open_store(f"memory://{request.node.name}-{os.urandom(4).hex()}")
    return open_store(f"{request.getfixturevalue('s3_url')}/{os.urandom(4).hex()}")


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of empty publishers of one backend (Hypothesis needs a fresh one per
    example); the directory one opened as workers open it."""

    def new() -> Publisher:
        home = Path(tempfile.mkdtemp(dir=tmp_path))
        if request.param == "directory":
            return Publisher(open_publication(home), home)
        return Publisher(Publication(_store(request.param, request), home), home)

    yield new


def stage(p: Publisher, chunk: int, attempt: int, files: int = 2) -> None:
    out = Output(staging_dir(p.home, chunk, attempt))
    for i in range(files):
        out.write_json(f"part-{i}.json", {"chunk": chunk, "attempt": attempt})


def test_publish_then_readers_see_every_file_once(make: Any) -> None:
    p = make()
    stage(p, 7, 1, files=3)
    assert p.pub.publish(JOB, 7, 1) is True
    assert not staging_dir(p.home, 7, 1).exists()
    assert p.pub.published_attempt(JOB, 7) == 1 and p.shown(7) == [1, 1, 1]
    assert p.pub.publish(JOB, 7, 1) is True  # again: nothing to do, still published
    assert p.pub.published_attempt(JOB, 8) is None and p.shown(8) == []


def test_an_older_attempt_never_replaces_a_newer_one(make: Any) -> None:
    p = make()
    stage(p, 1, 1)
    stage(p, 1, 2)
    assert p.pub.publish(JOB, 1, 2) is True
    assert p.pub.publish(JOB, 1, 1) is False  # the zombie arrives late: refused
    assert p.shown(1) == [2, 2] and p.kept() == ["chunk=1-2"]
    p.pub.retract(JOB, 1, 1)  # a fenced zombie retracting leaves the newer output
    assert p.shown(1) == [2, 2]
    p.pub.retract(JOB, 1, 2)
    assert p.pub.published_attempt(JOB, 1) is None and p.shown(1) == [] and p.kept() == []


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
            assert p.pub.publish(JOB, 1, attempt) is expect
            if expect:
                current = attempt
        elif op == "publish-empty":  # staged nothing: reports, changes nothing
            if attempt in staged:
                continue
            assert p.pub.publish(JOB, 1, attempt) is (current == attempt)
        else:
            p.pub.retract(JOB, 1, attempt)
            if current is not None and current <= attempt:
                current = None
        assert p.pub.published_attempt(JOB, 1) == current
        assert p.shown(1) == ([] if current is None else [current, current])
        assert p.kept() == ([] if current is None else [f"chunk=1-{current}"])


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.sampled_from(["publish", "retract"]), st.integers(1, 4)), max_size=8),
    st.sampled_from(["delta", "iceberg"]),
)
def test_a_jobs_table_follows_its_model(
    make: Any, tmp_path: Path, ops: list[tuple[str, int]], kind: str
) -> None:
    """A job with a table: each chunk's partition holds the Parquet rows of the newest
    attempt published, or none once it is retracted — never an older attempt's rows
    back (the table's versions: 2·attempt published, 2·attempt + 1 retracted)."""
    import pyarrow as pa

    from riverbed.tables import PARTITION

    p = make()
    where = Path(tempfile.mkdtemp(dir=tmp_path))
    spelled = (
        f"delta:{where / 'lake'}"
        if kind == "delta"
        else f"iceberg:sqlite:///{where / 'catalog.db'}#jobs.out"
    )
    p.pub.bind_table(JOB, spelled)
    table = p.pub.table(JOB)
    assert table is not None
    version, rows = -1, 0  # the model: the partition's version and its attempt's rows
    staged: set[int] = set()
    for op, attempt in ops:
        if op == "publish":
            if attempt in staged:
                continue
            staged.add(attempt)
            out = Output(staging_dir(p.home, 1, attempt))
            out.write_parquet("rows.parquet", pa.table({"attempt": [attempt] * attempt}))
            if p.pub.publish(JOB, 1, attempt) and 2 * attempt > version:
                version, rows = 2 * attempt, attempt
        else:
            p.pub.retract(JOB, 1, attempt)
            if 2 * attempt + 1 > version:
                version, rows = 2 * attempt + 1, 0
        got = table.read().to_pydict()
        assert got.get(PARTITION, []) == ["1"] * rows
        assert got.get("attempt", []) == [rows] * rows
        assert table.version("1") == (None if version < 0 else version)
    p.pub.bind_table(JOB, None)
    assert p.pub.table(JOB) is None


def test_a_table_that_cannot_be_written_now_is_a_storage_error_and_publishing_again_heals(
    make: Any, tmp_path: Path
) -> None:
    """The job's table away (here: its catalog's directory cannot be opened): publishing
    says so as a StorageError — what workers and the orchestrator retry — naming no
    credential; the files are published all the same, and publishing the attempt again
    once the table is back makes its commit."""
    import pyarrow as pa

    from riverbed.storage import StorageError

    p = make()
    away = tmp_path / "away"
    p.pub.bind_table(JOB, f"iceberg:sqlite:///{away / 'catalog.db'}#jobs.out@{tmp_path / 'wh'}")
    out = Output(staging_dir(p.home, 3, 1))
    out.write_parquet("rows.parquet", pa.table({"x": [1, 2]}))
    with pytest.raises(StorageError, match="the table of job 'j' cannot be written now"):
        p.pub.publish(JOB, 3, 1)
    assert p.pub.published_attempt(JOB, 3) == 1  # the files: published
    away.mkdir()  # the table is back
    assert p.pub.publish(JOB, 3, 1) is True
    table = p.pub.table(JOB)
    assert table is not None and table.read().column("x").to_pylist() == [1, 2]
    p.pub.bind_table(JOB, "iceberg:postgresql://rb:s3cret@127.0.0.1:1/cat#jobs.out@/tmp/wh")
    with pytest.raises(StorageError) as refused:
        p.pub.retract(JOB, 3, 1)
    assert "s3cret" not in str(refused.value)


def test_readers_find_chunks_and_files_by_pattern(make: Any) -> None:
    p = make()
    for chunk in (3, 12):
        out = Output(staging_dir(p.home, chunk, 1))
        out.write_json("a.json", {"attempt": 1})
        out.write_text("day=1.csv", "x\n")
        out.write_text("sub/deep.json", "{}")
        assert p.pub.publish(JOB, chunk, 1) is True
    assert sorted(p.pub.chunks(JOB)) == [3, 12] and p.pub.chunks("other") == []
    files = p.pub.published_files(JOB, 12)
    assert sorted(files) == ["a.json", "day=1.csv"]  # "*" stays in the top level, as glob
    assert files["day=1.csv"].read_text() == "x\n"
    assert list(p.pub.published_files(JOB, 12, "sub/*")) == ["sub/deep.json"]
    assert p.pub.published_files(JOB, 12, "*.parquet") == {}
    assert p.pub.published_files(JOB, 4) == {}
    out = Output(staging_dir(p.home, 12, 2))  # a rerun replaces the chunk's files
    out.write_json("b.json", {"attempt": 2})
    assert p.pub.publish(JOB, 12, 2) is True
    assert list(p.pub.published_files(JOB, 12)) == ["b.json"]
    assert p.shown(12) == [2]


def test_a_jobs_files_are_the_newest_chunks_by_name(make: Any) -> None:
    """``job_files`` (what ``ctx.published`` reads): every chunk's published files; a
    name two chunks published is the newer chunk's; retracted chunks drop out."""
    p = make()
    for chunk, names in ((3, ["day=1.csv", "day=2.csv"]), (5, ["day=2.csv", "day=3.csv"])):
        out = Output(staging_dir(p.home, chunk, 1))
        for name in names:
            out.write_text(name, f"{chunk}\n")
        out.write_text("notes.txt", "-")
        assert p.pub.publish(JOB, chunk, 1) is True
    files = p.pub.job_files(JOB, "day=*")
    assert {n: f.read_text() for n, f in files.items()} == {
        "day=1.csv": "3\n",
        "day=2.csv": "5\n",  # chunk 5 is newer than chunk 3
        "day=3.csv": "5\n",
    }
    assert p.pub.job_files(JOB, "day=2.csv")["day=2.csv"].read_text() == "5\n"
    assert p.pub.job_files("other") == {}
    p.pub.retract(JOB, 5, 1)
    assert {n: f.read_text() for n, f in p.pub.job_files(JOB, "day=*").items()} == {
        "day=1.csv": "3\n",
        "day=2.csv": "3\n",
    }


def test_a_jobs_files_in_a_bucket_take_one_listing_whatever_its_chunks(tmp_path: Path) -> None:
    """Reading a job's outputs from a bucket lists its markers once, not once per chunk,
    and reads each marker once per publication object (a marker never changes)."""
    store = open_store(f"memory://one-listing-{os.urandom(4).hex()}")
    p = Publisher(Publication(store, tmp_path / "home"), tmp_path / "home")
    for chunk in range(1, 21):
        Output(staging_dir(p.home, chunk, 1)).write_text(f"day={chunk}.csv", "x\n")
        assert p.pub.publish(JOB, chunk, 1) is True
    calls: list[str] = []
    real_list, real_get = store.list, store.get
    store.list = lambda prefix="": calls.append("LIST") or real_list(prefix)  # type: ignore[method-assign]
    store.get = lambda key: calls.append(f"GET {key}") or real_get(key)  # type: ignore[method-assign]
    assert len(p.pub.job_files(JOB)) == 20
    markers = [c for c in calls if c.startswith(f"GET {JOB}/{publication.PUBLISHED}/")]
    assert calls.count("LIST") == 1 and len(markers) == 20
    calls.clear()
    assert p.pub.job_files(JOB, "day=7.csv")["day=7.csv"].read_text() == "x\n"
    assert calls == ["LIST"]  # markers known, files cached: one request in all


def _leftover(p: Publisher, chunk: int, attempt: int) -> None:
    """What a publisher killed after copying its files, before its marker, leaves."""
    p.store.put(publication.attempt_prefix(JOB, chunk, attempt) + "p.json", b"{}")


def test_a_sweep_removes_what_a_killed_zombie_left_and_spares_newer_attempts(make: Any) -> None:
    p = make()
    _leftover(p, 4, 1)  # attempt 1 died mid-publish
    stage(p, 4, 2)
    assert p.pub.publish(JOB, 4, 2) is True
    _leftover(p, 4, 3)  # attempt 3 publishing right now
    _leftover(p, 5, 1)  # a chunk nothing is published of yet
    assert p.pub.sweep(JOB) == 1
    assert p.kept() == ["chunk=4-2", "chunk=4-3", "chunk=5-1"]
    assert p.shown(4) == [2, 2]
    assert p.pub.sweep(JOB) == 0


def test_a_sweep_removes_markers_of_replaced_attempts(make: Any) -> None:
    p = make()
    store = p.store
    stage(p, 4, 2)
    assert p.pub.publish(JOB, 4, 2) is True
    store.put(f"{JOB}/{publication.PUBLISHED}/chunk=4/{1:020d}", b'{"files": []}')
    assert p.pub.sweep(JOB) == 1  # a zombie's marker, created before it saw attempt 2's
    assert store.entries(f"{JOB}/{publication.PUBLISHED}/chunk=4/") == [f"{2:020d}"]
