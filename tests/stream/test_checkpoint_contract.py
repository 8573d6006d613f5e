"""One contract for a checkpoint's batch records and driver terms, on every kind of
location: a directory, memory, and a bucket on the tests' real S3 server.

What the loop relies on, wherever the checkpoint is: a batch's plan reads back as
written, a done record is the batch's commit, ids and previous find the newest
records, pruning forgets old batches, a batch's plan and its commit are each created
once — a second driver never replaces them — and a driver whose term is not the newest
is fenced before it writes, a term never overwritten by an older one.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from riverbed.state import CorruptStateError
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.fencing import DriverFencedError, check_term, record_term, recorded_driver
from riverbed.stream.layout import checkpoint_store, commit_key
from tests.conftest import LOCATIONS, location_of

PLAN = {"0": [0, 10], "1": [0, 7]}


@pytest.fixture(params=LOCATIONS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return location_of(request.param, request, tmp_path, "ckpt")


def planned(watermark: int = 5, slices: dict[str, list[int]] | None = None) -> BatchRecord:
    return BatchRecord(watermark_ms=watermark, slices=slices or PLAN, co_located=True)


def test_a_plan_then_its_commit_read_back(location: str) -> None:
    batches = open_batches(location)
    assert batches.ids() == [] and batches.get(0) is None
    batches.put(0, planned())
    assert batches.ids() == [0]
    got = batches.get(0)
    assert got is not None and got.slices == PLAN and not got.done
    batches.put(0, replace(planned(), input=3))  # the same plan again, with counts: fine
    batches.update(0, side_outputs_written=True)
    assert batches.get(0).side_outputs_written  # type: ignore[union-attr]
    batches.put(0, _done(planned(), input=17))
    got = batches.get(0)
    assert got is not None and got.done and got.input == 17 and got.slices == PLAN


def test_ids_previous_and_prune(location: str) -> None:
    batches = open_batches(location)
    for b in range(6):
        batches.put(b, _done(planned(watermark=b), input=b))
    batches.put(6, planned(watermark=6))
    assert batches.ids() == list(range(7))
    assert batches.previous(6).watermark_ms == 5  # type: ignore[union-attr]
    assert batches.prune(4) == 4
    assert batches.ids() == [4, 5, 6]
    assert batches.previous(4) is None and batches.get(2) is None
    assert batches.previous(100).watermark_ms == 6  # type: ignore[union-attr]


def test_a_newer_term_fences_the_older_driver(location: str) -> None:
    assert recorded_driver(location) is None
    check_term(location, None, "agg")  # not elected (tests, notebooks): never fenced
    record_term(location, 7, "host-a:1", "2026-11-25T00:00:00+00:00")
    check_term(location, 7, "agg")
    record_term(location, 9, "host-b:2", "2026-11-25T00:01:00+00:00")
    assert recorded_driver(location) == {
        "term": 9,
        "driver": "host-b:2",
        "since": "2026-11-25T00:01:00+00:00",
    }
    with pytest.raises(DriverFencedError, match=r"term 7\).*host-b:2 \(term 9\)"):
        check_term(location, 7, "agg")
    fenced = open_batches(location, lambda: check_term(location, 7, "agg"))
    with pytest.raises(DriverFencedError):
        fenced.put(0, planned())
    assert open_batches(location).ids() == []  # the fenced driver wrote nothing


# -- create-only, never replaced ----------------------------------------


def test_a_second_plan_of_a_batch_is_refused_and_the_first_stays(location: str) -> None:
    batches = open_batches(location)
    batches.put(3, planned())
    with pytest.raises(CorruptStateError, match=r"batch 3 is recorded .* with another plan"):
        open_batches(location).put(3, planned(slices={"0": [0, 99]}))  # another driver
    assert batches.get(3).slices == PLAN  # type: ignore[union-attr]


def test_the_first_commit_of_a_batch_stays(location: str) -> None:
    """Two drivers racing to commit one batch: one object is created and it is never
    replaced — the loser carries on (it is fenced at its next write)."""
    batches = open_batches(location)
    batches.put(0, planned())
    barrier = threading.Barrier(8)

    def commit(i: int) -> None:
        barrier.wait()
        open_batches(location).put(0, _done(planned(), input=i, term=i))

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = batches.get(0)
    assert winner is not None and winner.done and winner.input == winner.term
    store = checkpoint_store(location)
    assert [i.key for i in store.list("riverbed/commits/")] == [commit_key(0)]
    batches.put(0, _done(planned(), input=99, term=99))  # later: still the first one
    assert batches.get(0).input == winner.input  # type: ignore[union-attr]


def test_an_older_term_recorded_late_does_not_rule(location: str) -> None:
    """A paused driver resumed after its successor was elected records nothing that
    wins (its claim is refused): the newest term rules whatever order the records
    arrive in."""
    record_term(location, 12, "new:1", "t1")
    with pytest.raises(DriverFencedError, match=r"replaced by new:1 \(term 12\)"):
        record_term(location, 10, "old:1", "t0")  # arrives late
    assert recorded_driver(location)["term"] == 12  # type: ignore[index]
    with pytest.raises(DriverFencedError):
        check_term(location, 10, "agg")


def test_term_records_are_pruned_to_the_newest_few(location: str) -> None:
    for term in range(1, 12):
        record_term(location, term, f"d{term}", "t")
    keys = [i.key for i in checkpoint_store(location).list("riverbed/terms/")]
    assert len(keys) == 5 and keys[-1].endswith(f"{11:020d}.json")


def test_a_legacy_driver_record_in_a_directory_rules_until_a_term_is_recorded(
    tmp_path: Path,
) -> None:
    """A directory's checkpoint from before term objects kept the term in one replaced
    file, ``riverbed/driver.json``: it reads, fences, and the next elected driver's
    term object rules from then on."""
    (tmp_path / "riverbed").mkdir()
    old = {"term": 4, "driver": "vm:1", "since": "2026-12-01T00:00:00+00:00"}
    (tmp_path / "riverbed" / "driver.json").write_text(json.dumps(old))
    assert recorded_driver(tmp_path) == old
    check_term(tmp_path, 4, "agg")
    with pytest.raises(DriverFencedError, match=r"vm:1 \(term 4\)"):
        check_term(tmp_path, 3, "agg")
    record_term(tmp_path, 5, "vm:2", "t")
    assert recorded_driver(tmp_path)["driver"] == "vm:2"  # type: ignore[index]
    with pytest.raises(DriverFencedError):
        check_term(tmp_path, 4, "agg")


def test_a_damaged_record_names_where_it_is_and_the_recovery(location: str) -> None:
    batches = open_batches(location)
    batches.put(1, planned())
    batches.put(2, planned())
    store = checkpoint_store(location)
    store.put("riverbed/batches/000000000002.json", b"{not json")
    with pytest.raises(CorruptStateError) as caught:
        open_batches(location).get(2)
    message = str(caught.value)
    where = store.locate("riverbed/batches/000000000002.json")
    assert f"batch 2 (its plan, watermark and counts) is damaged: {where}" in message
    assert "If it is the newest batch record, delete it" in message
    store.put("spark/commits/1", b"v1")  # a checkpoint Spark's own loop wrote
    with pytest.raises(CorruptStateError, match="If Spark has not committed that batch"):
        open_batches(location).get(2)
    with pytest.raises(CorruptStateError, match="batch 2"):
        batches.previous(3)
    assert batches.get(1).slices == PLAN  # type: ignore[union-attr]  # the others still read


def test_a_legacy_record_in_a_directory_reads_as_plan_or_commit(tmp_path: Path) -> None:
    """Checkpoints in a directory from before create-only records kept one file per
    batch, replaced as it went from planned to done: it reads as the commit when it
    says done, else as the plan, and the batch's commit is recorded beside it."""
    records = tmp_path / "riverbed" / "batches"
    records.mkdir(parents=True)
    (records / f"{4:012d}.json").write_text(json.dumps(_done(planned(), input=9).to_json()))
    (records / f"{5:012d}.json").write_text(json.dumps(planned(watermark=6).to_json()))
    batches = open_batches(str(tmp_path))
    assert batches.ids() == [4, 5]
    assert batches.get(4).done and batches.get(4).input == 9  # type: ignore[union-attr]
    assert not batches.get(5).done  # type: ignore[union-attr]
    batches.put(5, planned(watermark=6))  # the re-run's plan: the same, so fine
    batches.put(5, _done(planned(watermark=6), input=4))
    assert batches.get(5).done and batches.previous(5).input == 9  # type: ignore[union-attr]


def _done(record: BatchRecord, **changes: int) -> BatchRecord:
    return replace(record, done=True, totals={"batches": 1}, **changes)
