"""A time-range job's output (riverbed.timerange.output): one contract on a local
directory, memory and a bucket (the tests' Ceph RGW) — staged files become visible only
when published, each staged file moves once, readers never see a chunk twice."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from riverbed.errors import ConfigError
from riverbed.jobs.timerange import Output, parse_time
from riverbed.timerange.spec import output_location
from tests.conftest import LOCATIONS, location_of

T0 = parse_time("2026-01-01")
HOUR = 3_600_000_000


@pytest.fixture(params=LOCATIONS)
def output(request: pytest.FixtureRequest, tmp_path: Path) -> Output:
    return Output(location_of(request.param, request, tmp_path, "out"))


def rows(*values: int) -> pa.Table:
    return pa.table({"sensor": pa.array(values, pa.int64()), "v": [float(v) for v in values]})


def test_staged_files_are_unseen_until_published_and_move_once(output: Output) -> None:
    assert output.datasets() == [] and output.read("rows").num_rows == 0
    output.stage("t1", "rows", rows(1, 2))
    output.stage("t1", "windows_1h", rows(3))
    assert output.datasets() == [] and output.read("rows").num_rows == 0
    assert output.publish("t1", T0) == 2
    assert output.datasets() == ["rows", "windows_1h"]
    assert output.read("rows").column("sensor").to_pylist() == [1, 2]
    assert output.publish("t1", T0) == 0  # moved already: a second mover finds nothing
    assert output.read("rows").column("sensor").to_pylist() == [1, 2]


def test_a_rerun_replaces_a_chunk_and_readers_never_see_it_twice(output: Output) -> None:
    output.stage("a", "rows", rows(1))
    output.publish("a", T0)
    output.stage("b", "rows", rows(2))
    output.publish("b", T0 + HOUR)
    output.stage("c", "rows", rows(10, 11))  # the first chunk again, with late data
    output.publish("c", T0)
    got = sorted(output.read("rows").column("sensor").to_pylist())
    assert got == [2, 10, 11]


def test_concurrent_movers_of_one_token_move_each_file_once(output: Output) -> None:
    for i in range(4):
        output.stage("t", f"d{i}", rows(i))
    counts: list[int] = []
    barrier = threading.Barrier(3)

    def mover() -> None:
        barrier.wait()
        counts.append(output.publish("t", T0))

    threads = [threading.Thread(target=mover) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if output.location.startswith("s3://"):  # movers may all copy before one deletes
        assert 4 <= sum(counts) <= 12
    else:  # one rename each
        assert sum(counts) == 4
    assert output.datasets() == ["d0", "d1", "d2", "d3"]
    for i in range(4):
        assert output.read(f"d{i}").column("sensor").to_pylist() == [i]
    assert output.publish("t", T0) == 0


def test_carried_state_is_kept_for_named_tokens_and_forgotten_otherwise(output: Output) -> None:
    assert output.carried("t1", "cumulative") is None
    output.stage_carry("t1", "cumulative", rows(5))
    output.stage_carry("t2", "tail", rows(6))
    output.stage("t3", "rows", rows(7))  # staged by a driver that then lost its term
    output.stage("t4", "rows", rows(8))  # the pending chunk of the last driver
    carried = output.carried("t1", "cumulative")
    assert carried is not None and carried.column("sensor").to_pylist() == [5]
    assert output.carried("t1", "tail") is None
    assert output.forget(keep={"t1"}, pending="t4") == 2  # t2's carry, t3's staging
    assert output.carried("t1", "cumulative") is not None
    assert output.carried("t2", "tail") is None
    assert output.publish("t3", T0) == 0
    assert output.publish("t4", T0) == 1
    output.discard("t1")
    assert output.carried("t1", "cumulative") is None


def test_remove_deletes_the_whole_output(output: Output) -> None:
    output.stage("t", "rows", rows(1))
    output.publish("t", T0)
    output.stage_carry("t", "tail", rows(1))
    output.remove()
    assert output.datasets() == [] and output.read("rows").num_rows == 0
    assert output.carried("t", "tail") is None
    output.remove()  # nothing left is not an error


def test_reading_a_missing_local_output_makes_no_directory(tmp_path: Path) -> None:
    out = Output(tmp_path / "never")
    assert out.datasets() == [] and out.read().num_rows == 0 and out.publish("t", T0) == 0
    assert out.carried("t", "tail") is None and out.forget(set(), None) == 0
    assert not (tmp_path / "never").exists()


def test_where_an_output_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert output_location("", "job", "") == str(tmp_path / "output" / "job")
    assert output_location("", "job", str(tmp_path / "ckpt")) == str(tmp_path / "output" / "job")
    assert output_location("out/x", "job", "s3://b/p") == str(tmp_path / "out" / "x")
    assert output_location("", "job", "s3://b/p/") == "s3://b/p/output/job"
    assert output_location("s3://b/q/", "job", "") == "s3://b/q"
    with pytest.raises(ConfigError) as bad:
        output_location("s3://AKIA:very-secret@b/q", "job", "")
    assert "very-secret" not in str(bad.value) and "AKIA" not in str(bad.value)
    with pytest.raises(ConfigError, match="output 'gs://b/q'"):
        output_location("gs://b/q", "job", "")


def test_a_token_with_only_a_killed_writers_temporary_file_is_forgotten(tmp_path: Path) -> None:
    """A driver SIGKILLed while it wrote a staged file leaves only the hidden temporary
    file under its token (no object: the token is no entry of the store); the next
    driver's forget deletes it all the same (a fresh-clone run found one left)."""
    out = Output(tmp_path / "out")
    staged = tmp_path / "out" / "_riverbed" / "staging" / "dead" / ".rows.parquet.1f2e.tmp"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"half a file")
    assert out.store.entries("_riverbed/staging/") == []  # no object there
    assert out.forget(set(), None) == 1
    assert not (tmp_path / "out" / "_riverbed" / "staging").exists()


def test_a_chunk_published_to_a_table_replaces_its_partition_before_its_file_moves(
    tmp_path: Path,
) -> None:
    """A dataset with a table: its chunk's partition is replaced (at the record's
    revision) before the file moves, so a publisher killed between the two leaves the
    file staged and the next one finds the commit made and only moves it; a staged
    chunk older than what the table holds is another control plane's, named."""
    from riverbed.tables import partition_table
    from riverbed.timerange.errors import RangeError

    output = Output(str(tmp_path / "out"))
    tables = {"rows": partition_table(f"delta:{tmp_path / 'lake'}", "sensors")}
    output.stage("t1", "rows", rows(1, 2))
    output.stage("t1", "windows_1h", rows(3))
    label = "20260101T000000Z"
    tables["rows"].replace(label, rows(1, 2), 40)  # the killed publisher's commit
    assert output.publish("t1", T0, tables, 40) == 2
    table = tables["rows"].read()
    assert sorted(table.column("sensor").to_pylist()) == [1, 2]
    assert output.read("rows").column("sensor").to_pylist() == [1, 2]
    output.stage("t2", "rows", rows(5))  # a rerun of the chunk
    assert output.publish("t2", T0, tables, 57) == 1
    assert tables["rows"].read().column("sensor").to_pylist() == [5]
    assert tables["rows"].version(label) == 57
    output.stage("t3", "rows", rows(6))  # recorded by a control plane that restarted
    with pytest.raises(RangeError, match="another control plane"):
        output.publish("t3", T0, tables, 3)
    assert tables["rows"].read().column("sensor").to_pylist() == [5]
    assert output.read("rows").column("sensor").to_pylist() == [5]  # nothing moved
