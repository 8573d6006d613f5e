"""The Parquet result table: per-batch directories, and their compaction."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.stream.results as results
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.dataframe import read_results
from riverbed.stream.metrics import Count
from riverbed.testing.signals import wait_stopped
from riverbed.windows import Tumbling
from tests.conftest import location_of

SPEC = Aggregation(name="t", key="k", time="ts", window=Tumbling("1h"), metrics={"n": Count()})
T = pd.Timestamp("2026-11-21", tz="UTC")


def batch(batch_id: int, keys: list[str], hour: int = 0) -> pd.DataFrame:
    start = T + pd.Timedelta(hours=hour)
    return pd.DataFrame(
        {
            "window_start": [start] * len(keys),
            "window_end": [start + pd.Timedelta(hours=1)] * len(keys),
            "key": keys,
            "n": [batch_id * 10 + i for i in range(len(keys))],
            "batch_id": [batch_id] * len(keys),
        }
    )


def table_without_batch_ids(out: Path) -> pd.DataFrame:
    return read_results(out).drop(columns="batch_id")


def test_compaction_keeps_the_table_and_survives_a_crash_before_its_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "COMPACT_AFTER", 3)
    out = tmp_path / "out"
    results.write_output(str(out), SPEC, 0, batch(0, ["a", "b", "c"]))
    results.write_output(str(out), SPEC, 1, batch(1, ["a", "d"]))
    results.write_output(str(out), SPEC, 2, batch(2, ["b"], hour=1))
    assert results.compact_output(str(out), SPEC, 2) == 0  # 2 older directories: not yet
    results.write_output(str(out), SPEC, 3, batch(3, ["b", "e"]))
    before = table_without_batch_ids(out)
    backup = tmp_path / "backup"
    shutil.copytree(out, backup)

    assert results.compact_output(str(out), SPEC, 3) == 3
    assert sorted(p.name for p in out.iterdir()) == ["batch_id=3"]
    after = read_results(out)
    pd.testing.assert_frame_equal(after.drop(columns="batch_id"), before)
    assert set(after["batch_id"]) == {3}  # carried rows say where they are now
    # batch 3's own rows were not duplicated into the compacted file
    compacted = pd.read_parquet(next((out / "batch_id=3").glob("compacted-*.parquet")))
    assert not {"b", "e"} & set(compacted.loc[compacted["window_start"] == T, "key"])

    # a crash after the compacted file, before the deletes: old rows lose to it
    for p in backup.iterdir():
        if p.name != "batch_id=3":
            shutil.copytree(p, out / p.name)
    pd.testing.assert_frame_equal(table_without_batch_ids(out), before)
    # ... and the next compaction folds them all again
    results.write_output(str(out), SPEC, 4, batch(4, ["a"]))
    assert results.compact_output(str(out), SPEC, 4) == 4
    want = before.set_index(["window_start", "key"])
    want.loc[(T, "a"), "n"] = 40
    pd.testing.assert_frame_equal(
        table_without_batch_ids(out).set_index(["window_start", "key"]), want
    )


def test_a_rerun_of_the_compaction_batch_keeps_the_compacted_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "COMPACT_AFTER", 1)
    out = tmp_path / "out"
    results.write_output(str(out), SPEC, 0, batch(0, ["a", "b"]))
    results.write_output(str(out), SPEC, 1, batch(1, ["a"]))
    assert results.compact_output(str(out), SPEC, 1) == 1
    results.write_output(str(out), SPEC, 1, batch(1, ["a"]))  # replaced by a re-run
    assert sorted(read_results(out)["key"]) == ["a", "b"]


def test_a_writer_fenced_after_writing_replaces_nothing_and_leaves_no_staging(
    tmp_path: Path,
) -> None:
    from riverbed.stream.fencing import DriverFencedError

    out = tmp_path / "out"
    results.write_output(str(out), SPEC, 0, batch(0, ["a", "b"]))
    part = next((out / "batch_id=0").glob("*.parquet"))
    before = (part.read_bytes(), part.stat().st_ino)

    def fenced() -> None:  # a takeover happened while this writer wrote its rows
        raise DriverFencedError("this driver lost the lead of 'x'")

    with pytest.raises(DriverFencedError):
        results.write_output(str(out), SPEC, 0, batch(0, ["z"]), fence=fenced)
    assert (part.read_bytes(), part.stat().st_ino) == before
    assert sorted(p.name for p in out.iterdir()) == ["batch_id=0"]  # no staging left


def test_compaction_drops_tombstones_with_the_rows_they_hid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session table: rows merged away have tombstones (``deleted``); the reader never
    shows them, and compaction folds them away with the rows they hid."""
    from riverbed.windows import Session

    spec = Aggregation(name="s", key="k", time="ts", window=Session("5m"), metrics={"n": Count()})
    monkeypatch.setattr(results, "COMPACT_AFTER", 2)
    out = tmp_path / "out"

    def rows(batch_id: int, keys: list[str], deleted: bool, hour: int = 0) -> pd.DataFrame:
        frame = batch(batch_id, keys, hour).assign(deleted=deleted)
        if deleted:
            frame["window_end"] = pd.NaT
        return frame

    results.write_output(str(out), spec, 0, rows(0, ["a", "b"], False))
    # batch 1: "a" now starts an hour earlier; its old row is a tombstone
    results.write_output(
        str(out),
        spec,
        1,
        pd.concat([rows(1, ["a"], False, hour=-1), rows(1, ["a"], True)], ignore_index=True),
    )
    results.write_output(str(out), spec, 2, rows(2, ["c"], False, hour=2))
    before = read_results(out)
    assert "deleted" not in before.columns
    assert sorted(zip(before["key"], before["window_start"], strict=True)) == [
        ("a", T - pd.Timedelta(hours=1)),
        ("b", T),
        ("c", T + pd.Timedelta(hours=2)),
    ]
    assert results.compact_output(str(out), spec, 2) == 2
    compacted = pd.read_parquet(next((out / "batch_id=2").glob("compacted-*.parquet")))
    assert not compacted["deleted"].any()
    pd.testing.assert_frame_equal(
        read_results(out).drop(columns="batch_id"), before.drop(columns="batch_id")
    )


def test_riverbed_query_shows_a_sessions_end_and_never_its_tombstones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from riverbed.cli.main import main
    from riverbed.windows import Session

    monkeypatch.setenv("RIVERBED_HOME", str(tmp_path))
    spec = Aggregation(name="s", key="k", time="ts", window=Session("5m"), metrics={"n": Count()})
    rows = pd.concat(
        [
            batch(0, ["a", "b"]).assign(deleted=False),
            batch(1, ["b"]).assign(deleted=True, window_end=pd.NaT),
        ],
        ignore_index=True,
    )
    results.write_output(str(tmp_path / "output" / "s"), spec, 0, rows.iloc[:2])
    results.write_output(str(tmp_path / "output" / "s"), spec, 1, rows.iloc[2:])
    assert main(["query", "s"]) == 0
    shown = capsys.readouterr().out
    assert "window_end" in shown and "s (1 rows)" in shown and "deleted" not in shown
    results.write_output(
        str(tmp_path / "output" / "t"),
        dataclasses.replace(SPEC, name="t"),
        0,
        batch(0, ["a"]),
    )
    assert main(["query", "t"]) == 0
    assert "window_end" not in capsys.readouterr().out  # a fixed window's end: start + size


ZOMBIE = """
import os, signal, sys
import pyarrow.parquet as pq
from riverbed.stream import results
from riverbed.stream.fencing import DriverFencedError, check_term

output, checkpoint, rows = sys.argv[1:]
checks = []

def fence():  # the driver's own fence, term 1; paused once its first check passed
    check_term(checkpoint, 1, "t")
    checks.append(1)
    if len(checks) == 1:
        os.kill(os.getpid(), signal.SIGSTOP)

try:
    wrote = results.store_batch(output, 7, pq.read_table(rows), fence)
except DriverFencedError as exc:
    print("fenced:", exc)
    sys.exit(3)
print("wrote" if wrote else "kept")
"""


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
@pytest.mark.parametrize("rows", ["the same rows", "other rows"])
def test_a_driver_paused_between_its_fence_and_its_write_writes_nothing_when_it_wakes(
    kind: str, rows: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A driver (a real process, holding term 1) passes its fence for batch 7's result
    file and is paused (SIGSTOP) before the write; a standby takes term 2 and stores the
    batch; the paused driver wakes. The same rows (the re-run's own order): its copy is
    dropped; other rows: its fence, checked again before a replace, stops it. Either
    way the standby's file is as it was — bytes and, on disk, inode — and no staging
    is left."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from riverbed.stream.fencing import check_term, record_term

    output = location_of(kind, request, tmp_path, "out")
    checkpoint = tmp_path / "checkpoint"
    standby = pa.Table.from_pandas(batch(7, ["a", "b", "c"]), preserve_index=False)
    standby = standby.cast(results.output_arrow_schema(SPEC))
    zombie = standby.take([2, 1, 0])  # the same rows in another order: other bytes
    if rows == "other rows":
        zombie = zombie.set_column(3, "n", pa.array([1, 2, 3], pa.int64()))
    pq.write_table(zombie, tmp_path / "zombie.parquet")
    record_term(checkpoint, 1, "zombie", "2026-12-07T00:00:00Z")
    process = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE, output, str(checkpoint), str(tmp_path / "zombie.parquet")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_stopped(process, 120, "the driver did not reach its write")
        record_term(checkpoint, 2, "standby", "2026-12-07T00:01:00Z")  # the takeover
        assert results.store_batch(output, 7, standby, lambda: check_term(checkpoint, 2, "t"))
        store = results.checkpoint_store(output)
        key = results.batch_key(7)
        before = store.get(key), store.head(key)
        if kind == "file":
            inode = (Path(output) / key).stat().st_ino
    finally:
        os.kill(process.pid, signal.SIGCONT)
    out, err = process.communicate(timeout=120)
    if rows == "the same rows":
        assert (process.returncode, out.strip()) == (0, "kept"), err
    else:
        assert process.returncode == 3, err
        assert "fenced: this driver of 't' (term 1) was replaced by" in out, out
    assert (store.get(key), store.head(key)) == before
    assert [i.key for i in store.list("batch_id=")] == [key]  # no staging left
    if kind == "file":
        assert (Path(output) / key).stat().st_ino == inode
        assert sorted(p.name for p in (Path(output) / "batch_id=7").iterdir()) == [results.PART]


def test_a_rerun_with_the_same_rows_leaves_the_file_and_other_rows_replace_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    results.write_output(str(out), SPEC, 3, batch(3, ["a", "b"]))
    part = out / results.batch_key(3)
    first = (part.read_bytes(), part.stat().st_ino)
    results.write_output(str(out), SPEC, 3, batch(3, ["a", "b"]).iloc[::-1])  # a re-run
    assert (part.read_bytes(), part.stat().st_ino) == first
    # a rollback's or a backfill's rows for the batch: replaced
    results.write_output(str(out), SPEC, 3, batch(4, ["a"]).assign(batch_id=3))
    assert read_results(out)[["key", "n"]].values.tolist() == [["a", 40]]


@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.text("ab", max_size=2),
            st.lists(st.integers(0, 2), max_size=2),
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda r: (r[0], r[1]),  # one row per window and key, as in a batch
    ),
    seed=st.randoms(use_true_random=False),
    change=st.integers(0, 2),
)
def test_same_rows_ignores_the_order_and_sees_any_changed_value(
    rows: list[tuple[int, str, list[int]]], seed: Any, change: int
) -> None:
    import pyarrow as pa

    def table(rs: list[tuple[int, str, list[int]]]) -> pa.Table:
        return pa.table(
            {
                "w": pa.array([r[0] for r in rs], pa.int64()),
                "key": pa.array([r[1] for r in rs], pa.string()),
                "top": pa.array([r[2] for r in rs], pa.list_(pa.int64())),
            }
        )

    shuffled = list(rows)
    seed.shuffle(shuffled)
    assert results.same_rows(table(rows), table(shuffled))
    w, key, top = shuffled[0]
    changed = [(w + 10, key, top), (w, key + "c", top), (w, key, [*top, 9])][change]
    assert not results.same_rows(table(rows), table([changed, *shuffled[1:]]))
    assert not results.same_rows(table(rows), table(shuffled[1:]))
