"""The object store contract (riverbed.storage.base), run on every backend: file,
memory and s3 (the tests' Ceph RGW)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.storage import (
    ObjectNotFoundError,
    ObjectStore,
    Pointer,
    StorageValueError,
    open_store,
)

BACKENDS = ["file", "memory", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "file":
        url = (tmp_path / "objects").as_uri()
    elif request.param == "memory":
        url = f"memory://{request.node.name}-{os.urandom(4).hex()}"
    else:
        url = request.getfixturevalue("s3_url")
    with open_store(url) as s:
        yield s


def test_put_get_replace_and_delete(store: ObjectStore) -> None:
    store.put("a/b/c.json", b"one")
    assert store.get("a/b/c.json") == b"one"
    store.put("a/b/c.json", b"two, longer")
    assert store.get("a/b/c.json") == b"two, longer"
    info = store.head("a/b/c.json")
    assert info is not None and info.size == len(b"two, longer")
    store.delete("a/b/c.json")
    assert store.head("a/b/c.json") is None
    store.delete("a/b/c.json")  # deleting what is gone is not an error
    with pytest.raises(ObjectNotFoundError, match=r"a/b/c\.json"):
        store.get("a/b/c.json")


def test_empty_objects_and_binary_bytes(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    data = bytes(range(256)) * 3
    store.put("bin", data)
    assert store.get("bin") == data


def test_create_only_write_has_one_winner(store: ObjectStore) -> None:
    assert store.put_if_absent("term/00000001", b"first")
    assert not store.put_if_absent("term/00000001", b"second")
    assert store.get("term/00000001") == b"first"
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        barrier.wait()
        if store.put_if_absent("race/key", f"writer {i}".encode()):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.get("race/key") == f"writer {wins[0]}".encode()


def test_write_once_leaves_the_same_content_and_replaces_other_content_after_its_check(
    store: ObjectStore,
) -> None:
    checks: list[str] = []
    assert store.write_once("batch/1", b"rows a,b", before_replace=lambda: checks.append("x"))
    assert checks == []  # a create needs no second check
    # the same bytes, or what ``same`` calls the same (rows in another order): left as it is
    assert not store.write_once("batch/1", b"rows a,b", before_replace=lambda: checks.append("x"))
    assert not store.write_once(
        "batch/1", b"rows b,a", same=lambda found: sorted(found) == sorted(b"rows b,a")
    )
    assert store.get("batch/1") == b"rows a,b" and checks == []

    class Fenced(Exception):
        pass

    def refuse() -> None:
        raise Fenced

    # other content is checked once more, then replaces
    with pytest.raises(Fenced):
        store.write_once("batch/1", b"rows c", same=lambda found: False, before_replace=refuse)
    assert store.get("batch/1") == b"rows a,b"
    assert store.write_once("batch/1", b"rows c", before_replace=lambda: checks.append("x"))
    assert store.get("batch/1") == b"rows c" and checks == ["x"]
    # writers of the same bytes at once: one writes, the others leave its object
    wrote: list[bool] = []
    barrier = threading.Barrier(6)

    def race() -> None:
        barrier.wait()
        wrote.append(store.write_once("race/once", b"same"))

    threads = [threading.Thread(target=race) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wrote) == [False] * 5 + [True] and store.get("race/once") == b"same"


def test_move_gives_the_bytes_to_the_target_once(store: ObjectStore) -> None:
    store.put("staged/t1/rows.parquet", b"new rows")
    store.put("rows/chunk=1/part.parquet", b"old rows")
    store.move("staged/t1/rows.parquet", "rows/chunk=1/part.parquet")
    assert store.get("rows/chunk=1/part.parquet") == b"new rows"
    assert store.head("staged/t1/rows.parquet") is None
    # a second mover of the same source learns it was moved
    with pytest.raises(ObjectNotFoundError, match=r"staged/t1/rows\.parquet"):
        store.move("staged/t1/rows.parquet", "rows/chunk=1/part.parquet")
    assert store.get("rows/chunk=1/part.parquet") == b"new rows"
    store.put("staged/t2/a", b"a")
    store.move("staged/t2/a", "fresh/place/a")  # a target with no parents yet
    assert store.get("fresh/place/a") == b"a"
    assert store.list("staged/") == []


def test_list_by_prefix_is_sorted_and_complete(store: ObjectStore) -> None:
    keys = [f"batches/{i:06d}.json" for i in range(30)] + ["batches2/x", "other/y", "bat"]
    for key in reversed(keys):
        store.put(key, key.encode())
    assert [o.key for o in store.list("batches/")] == sorted(keys[:30])
    assert [o.key for o in store.list("batches")] == sorted([*keys[:30], "batches2/x"])
    assert [o.key for o in store.list("batches/00001")] == [
        f"batches/{i:06d}.json" for i in range(10, 20)
    ]
    assert [o.key for o in store.list()] == sorted(keys)
    assert all(o.size == len(o.key) for o in store.list())
    store.delete_many(keys[:10])
    assert [o.key for o in store.list("batches/")] == sorted(keys[10:30])
    assert store.list("nothing/") == []


def test_range_reads(store: ObjectStore) -> None:
    data = os.urandom(100_000)
    store.put("blob", data)
    assert store.get_range("blob", 0, 10) == data[:10]
    assert store.get_range("blob", 99_990, 100_000) == data[99_990:]
    assert store.get_range("blob", 99_990, 200_000) == data[99_990:]  # short at the end
    assert store.get_range("blob", 5, 5) == b""
    assert store.get_range("blob", 100_000, 100_010) == b""  # starts at the end
    assert store.get_range("blob", 200_000, 300_000) == b""  # past it
    with pytest.raises(ObjectNotFoundError):
        store.get_range("missing", 0, 1)


def test_a_prefix_read_tells_the_size(store: ObjectStore) -> None:
    data = os.urandom(50_000)
    store.put("blob", data)
    assert store.get_prefix("blob", 10) == (data[:10], 50_000)
    assert store.get_prefix("blob", 80_000) == (data, 50_000)  # shorter than asked
    assert store.get_prefix("blob", 0) == (b"", 50_000)
    store.put("empty", b"")
    assert store.get_prefix("empty", 10) == (b"", 0)
    with pytest.raises(ObjectNotFoundError):
        store.get_prefix("missing", 10)


def test_large_files_go_up_and_come_back_whole(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(40 * 1024 * 1024 + 12345))  # over the part size: multipart
    store.put_file("snap/big.sst", src)
    info = store.head("snap/big.sst")
    assert info is not None and info.size == src.stat().st_size
    back = tmp_path / "deep" / "back.bin"
    back.parent.mkdir()
    store.get_file("snap/big.sst", back)
    assert back.read_bytes() == src.read_bytes()
    assert not [p for p in back.parent.iterdir() if p.name != "back.bin"]  # no temporaries
    with pytest.raises(ObjectNotFoundError):
        store.get_file("snap/missing.sst", tmp_path / "x")


def test_hidden_names_are_listed_but_not_entries(store: ObjectStore) -> None:
    """A ``.``-prefixed name (a snapshot set aside) is an object like any other for
    ``list`` on every backend, and left out of ``entries``."""
    store.put("snap/.old.corrupt-1/MANIFEST", b"{}")
    store.put("snap/00000001/MANIFEST", b"{}")
    store.put("snap/.note", b"x")
    assert [o.key for o in store.list("snap/")] == [
        "snap/.note",
        "snap/.old.corrupt-1/MANIFEST",
        "snap/00000001/MANIFEST",
    ]
    assert store.entries("snap/") == ["00000001"]
    assert store.entries() == ["snap"]


def test_a_prefix_whose_objects_are_all_deleted_is_no_entry(store: ObjectStore) -> None:
    store.put("runs/a/deep/x", b"1")
    store.put("runs/b/y", b"2")
    store.delete("runs/a/deep/x")
    assert store.entries("runs/") == ["b"]
    # nothing an interrupted write left: the same names when those are asked for too
    assert store.entries("runs/", with_partial=True) == ["b"]
    store.delete("runs/b/y")
    assert store.entries("runs/") == [] and store.entries() == []


def test_a_view_shows_a_prefix_and_is_no_object(store: ObjectStore) -> None:
    """Where a store keeps views (a directory), ``chunk=1`` shows the attempt given last
    and outside readers find its objects there; ``list``/``entries`` never show a view.
    Where it keeps none (a bucket), ``show`` asks nothing and changes nothing."""
    store.put("j/.attempts/chunk=1-1/a", b"1")
    store.put("j/.attempts/chunk=1-2/a", b"2")
    asked: list[str] = []

    def attempt(n: int | None) -> str | None:
        asked.append(str(n))
        return None if n is None else f"j/.attempts/chunk=1-{n}"

    before = [o.key for o in store.list("j/")]
    keeps = store.show("j/chunk=1", lambda: attempt(1))
    assert [o.key for o in store.list("j/")] == before and store.entries("j/") == []
    if not keeps:
        assert asked == [] and store.views("j/") == {}
        return
    assert store.views("j/") == {"chunk=1": "j/.attempts/chunk=1-1"}
    assert (Path(store.locate("j/chunk=1")) / "a").read_bytes() == b"1"
    assert store.show("j/chunk=1", lambda: attempt(2))
    assert (Path(store.locate("j/chunk=1")) / "a").read_bytes() == b"2"
    assert store.show("j/chunk=1", lambda: attempt(None))
    assert store.views("j/") == {} and asked == ["1", "2", "None"]
    assert store.get("j/.attempts/chunk=1-2/a") == b"2"  # what it showed stays


def test_delete_prefix_removes_everything_under_it_and_nothing_beside(
    store: ObjectStore, tmp_path: Path
) -> None:
    for key in ("a/x", "a/b/y", "ab/z", "a/.hidden"):
        store.put(key, b"1")
    if store.url.startswith("file:"):  # what Spark or a killed write leaves in a directory
        folder = Path(store.locate("a/b"))
        (folder / ".part.0.tmp").write_bytes(b"partial")
        (folder / "_temporary" / "0").mkdir(parents=True)
    store.delete_prefix("a/")
    assert [o.key for o in store.list()] == ["ab/z"] and store.entries() == ["ab"]
    if store.url.startswith("file:"):
        assert not Path(store.locate("a")).exists()
    with pytest.raises(StorageValueError, match="ending in '/'"):
        store.delete_prefix("ab")
    store.delete_prefix("")
    assert store.list() == []


def test_a_sweep_removes_what_killed_writes_left_once_old_enough(store: ObjectStore) -> None:
    """A bucket keeps nothing of a failed write; a directory keeps its temporary file —
    and a view being replaced, its temporary symlink — until swept."""
    store.put("p/.attempts/a-1/x", b"1")
    store.put("p/kept", b"2")
    if store.url.startswith("file:"):
        folder = Path(store.locate("p"))
        (folder / ".kept.0123.tmp").write_bytes(b"half")  # a put killed before its rename
        os.symlink(".attempts/a-1", folder / ".view.0123.tmp")  # a show() killed likewise
        (folder / "snapshot" / "v9").mkdir(parents=True)  # killed before its first file
        assert store.sweep_partial("p", older_than=3600) == 0  # young: may be under way
        assert (folder / "snapshot" / "v9").is_dir()
        assert store.sweep_partial("p", older_than=0) == 2
        assert sorted(q.name for q in folder.iterdir()) == [".attempts", "kept"]
        lone = Path(store.locate("q"))  # a folder only a killed write was in goes with it
        lone.mkdir()
        (lone / ".x.0123.tmp").write_bytes(b"half")
        assert store.sweep_partial("", older_than=0) == 1 and not lone.exists()
    else:
        assert store.sweep_partial("p", older_than=0) == 0
    assert [o.key for o in store.list("p/")] == ["p/.attempts/a-1/x", "p/kept"]


def test_a_local_file_is_the_object_itself_or_none(store: ObjectStore) -> None:
    store.put("d/x", b"bytes")
    local = store.local_file("d/x")
    assert (local is not None) == store.url.startswith("file:")  # only a directory's are
    if local is not None:  # a directory's object: read in place, never copied
        assert local.read_bytes() == b"bytes"
    assert store.local_file("d/missing") is None


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/./b", "../up", "a/.."])
def test_bad_keys_are_refused_before_any_request(store: ObjectStore, key: str) -> None:
    with pytest.raises(StorageValueError, match="not a relative path"):
        store.put(key, b"x")


def test_pointer_moves_once_per_version_and_a_stale_writer_loses(store: ObjectStore) -> None:
    pointer = Pointer(store, "checkpoint/current")
    assert pointer.current() is None
    assert pointer.advance(None, b"v0")
    assert not pointer.advance(None, b"late v0")  # somebody moved it first
    now = pointer.current()
    assert now is not None and (now.number, now.value) == (0, b"v0")
    assert pointer.advance(0, b"v1")
    assert not pointer.advance(0, b"a zombie that read version 0")
    wins: list[bytes] = []
    barrier = threading.Barrier(6)

    def race(i: int) -> None:
        barrier.wait()
        if pointer.advance(1, f"writer {i}".encode()):
            wins.append(f"writer {i}".encode())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    now = pointer.current()
    assert now is not None and (now.number, now.value) == (2, wins[0])
    for i in range(3, 8):
        assert pointer.advance(i - 1, b"v%d" % i)
    assert pointer.prune(keep=2) == 6
    now = pointer.current()
    assert now is not None and now.number == 7
    assert [o.key for o in store.list("checkpoint/current/")] == [
        "checkpoint/current/00000000000000000006",
        "checkpoint/current/00000000000000000007",
    ]


@pytest.mark.parametrize("local", ["file", "memory"])
def test_a_key_that_would_be_file_and_directory_is_refused(local: str, tmp_path: Path) -> None:
    url = (tmp_path / "o").as_uri() if local == "file" else f"memory://tree-{os.urandom(4).hex()}"
    store = open_store(url)
    store.put("a/b", b"x")
    with pytest.raises(StorageValueError, match="directory of other keys"):
        store.put("a", b"y")
    with pytest.raises(StorageValueError, match="below a key that is an object"):
        store.put("a/b/c", b"z")
    assert store.get("a/b") == b"x" and [o.key for o in store.list()] == ["a/b"]


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "create", "delete"]),
        st.sampled_from(["c", "a/b", "a/c", "b/a", "ab", "a/b2/x"]),  # a tree (base.py)
        st.binary(max_size=16),
    ),
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations)
def test_the_store_behaves_like_a_dict(
    store: ObjectStore, ops: list[tuple[str, str, bytes]]
) -> None:
    """Any sequence of writes leaves the store equal to a dict that took the same
    writes (create-only writes only where the key was absent)."""
    for info in store.list("model/"):
        store.delete(info.key)
    model: dict[str, bytes] = {}
    for op, key, data in ops:
        full = f"model/{key}"
        if op == "put":
            store.put(full, data)
            model[full] = data
        elif op == "create":
            assert store.put_if_absent(full, data) == (full not in model)
            model.setdefault(full, data)
        else:
            store.delete(full)
            model.pop(full, None)
    assert {o.key: store.get(o.key) for o in store.list("model/")} == model


def test_a_directory_is_no_object_of_a_file_store(tmp_path: Path) -> None:
    """As in a bucket: opening a store makes nothing, the first write makes the root,
    and a directory goes with the last object below it (the root stays)."""
    from riverbed.storage import open_store

    store = open_store(tmp_path / "root")
    assert not (tmp_path / "root").exists() and store.list() == []
    store.put("a/b/c", b"1")
    store.put("a/d", b"2")
    store.delete("a/b/c")
    assert not (tmp_path / "root" / "a" / "b").exists()
    store.delete("a/d")
    assert not (tmp_path / "root" / "a").exists() and (tmp_path / "root").is_dir()
    store.put("a/b/c", b"3")  # the emptied directories come back with a write
    assert store.get("a/b/c") == b"3"


def test_a_write_beside_the_delete_that_empties_its_directory_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one directory: one deletes its last object (the directory goes
    with it) just as the other makes the directory for a write — after ``mkdir`` found
    it there, before ``Path.mkdir`` saw it was a directory. The write succeeds: the
    directory was not a file in the way. (The interleaving is forced here; two threads
    putting and deleting keys in one directory hit it within seconds.)"""
    store = open_store(tmp_path / "root")
    store.put("d/other", b"1")
    real_mkdir, removed = os.mkdir, []

    def mkdir(path: Any, mode: int = 0o777, **kw: Any) -> None:
        try:
            real_mkdir(path, mode, **kw)
        except FileExistsError:
            if Path(path).name == "d" and not removed:  # the other writer's delete, now
                store.delete("d/other")
                removed.append(path)
            raise

    monkeypatch.setattr(os, "mkdir", mkdir)
    store.put("d/mine", b"2")
    assert removed and store.get("d/mine") == b"2" and store.list("d/") != []
