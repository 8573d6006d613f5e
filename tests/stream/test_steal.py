"""Work stealing between co-located tasks: the pure plan (pieces, who tries what in
which order), the claim board, and the task protocol run by hand in the orders Spark
may run it in — a helper first, an owner whose helper was lost — then through Spark."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.log
from riverbed.spark.source import LogSlice
from riverbed.state import StateConfig
from riverbed.stream.batchlog import next_record, open_batches
from riverbed.stream.dataframe import read_results
from riverbed.stream.layout import Checkpoint, handoff_dir
from riverbed.stream.lognative import colocated_task, run_planned
from riverbed.stream.nativeconfig import DirectConfig, prepare
from riverbed.stream.plan import balanced_groups
from riverbed.stream.steal import Board, lopsided, split, steal_order
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import SCHEMA
from tests.stream.test_lognative import check, engine_config

slices = st.builds(
    lambda p, start, n: LogSlice(p, start, start + n),
    st.integers(0, 20),
    st.integers(0, 10_000),
    st.integers(0, 5_000),
)


@given(slices, st.integers(1, 700))
def test_pieces_tile_their_slice_in_order(piece: LogSlice, size: int) -> None:
    pieces = split(piece, size)
    assert [p.partition for p in pieces] == [piece.partition] * len(pieces)
    covered = [offset for p in pieces for offset in range(p.start, p.end)]
    assert covered == list(range(piece.start, piece.end))
    assert all(0 < p.end - p.start <= size for p in pieces)
    assert all(p.end - p.start == size for p in pieces[:-1])


def test_a_piece_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        split(LogSlice(0, 0, 10), 0)


@given(
    st.lists(st.integers(0, 3_000), min_size=1, max_size=9),
    st.integers(1, 4),
    st.integers(50, 900),
    st.data(),
)
def test_a_helper_tries_every_other_piece_once_from_the_far_end(
    sizes: list[int], tasks: int, size: int, data: st.DataObject
) -> None:
    work = [LogSlice(p, 100 * p, 100 * p + n) for p, n in enumerate(sizes)]
    groups = balanced_groups(work, lambda s: s.end - s.start, tasks)
    me = data.draw(st.integers(0, len(groups) - 1))
    order = steal_order(groups, me, size)
    others = [s for i, g in enumerate(groups) if i != me for s in g]
    # exactly the other tasks' pieces, each once, none of its own
    assert Counter(order) == Counter(p for s in others for p in split(s, size))
    mine = {s.partition for s in groups[me]}
    assert not any(p.partition in mine for p in order)
    # within a partition back to front; an owner's partitions last-processed first
    for i, group in enumerate(groups):
        if i == me:
            continue
        seen = [p for p in order if p.partition in {s.partition for s in group}]
        parts = list(dict.fromkeys(p.partition for p in seen))
        assert parts == [s.partition for s in reversed(group) if s.end > s.start]
        for part in parts:
            starts = [p.start for p in seen if p.partition == part]
            assert starts == sorted(starts, reverse=True)
    # the most loaded task is helped first
    loads = [sum(s.end - s.start for s in g) for g in groups]
    first = {p.partition for p in order[:1]}
    if first:
        owner = next(i for i, g in enumerate(groups) if first & {s.partition for s in g})
        assert loads[owner] == max(loads[i] for i in range(len(groups)) if i != me)


@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_evenly_spread_work_is_not_lopsided(per_task: int, tasks: int, size: int) -> None:
    work = [LogSlice(p, 0, size) for p in range(per_task * tasks)]
    assert not lopsided(balanced_groups(work, lambda s: s.end - s.start, tasks))


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=8), st.integers(1, 4))
def test_lopsidedness_depends_on_the_shares_alone(sizes: list[int], tasks: int) -> None:
    def groups(scale: int) -> list[list[LogSlice]]:
        work = [LogSlice(p, 0, n * scale) for p, n in enumerate(sizes)]
        return balanced_groups(work, lambda s: s.end - s.start, tasks)

    assert lopsided(groups(1)) == lopsided(groups(7)) == lopsided(groups(1)[::-1])
    if len(groups(1)) == 1:
        assert not lopsided(groups(1))  # nobody to help


def test_a_zipf_skewed_batch_is_lopsided_on_two_cores() -> None:
    """The benchmark's shares of 2M events (zipf flags keyed over 4 partitions): one
    core gets the hot partition (43 %), the other the rest (57 %)."""
    shares = [0.147, 0.263, 0.158, 0.432]
    work = [LogSlice(p, 0, int(2_000_000 * f)) for p, f in enumerate(shares)]
    assert lopsided(balanced_groups(work, lambda s: s.end - s.start, 2))


def test_only_one_of_many_claimers_wins_a_piece(tmp_path: Path) -> None:
    board = Board.create(tmp_path / "ckpt", 7)
    piece = LogSlice(2, 100, 200)
    wins: dict[int, bool] = {}
    go = threading.Barrier(16)

    def claim(task: int) -> None:
        go.wait()
        wins[task] = board.claim(piece, task)

    threads = [threading.Thread(target=claim, args=(task,)) for task in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [task for task, won in wins.items() if won]
    assert len(winners) == 1 and len(wins) == 16
    # a retried attempt of the winner finds the claim its own; nobody else does
    assert board.claim(piece, winners[0])
    assert not any(board.claim(piece, task) for task in range(16) if task != winners[0])
    assert board.claim(LogSlice(2, 200, 300), 3)  # another piece is its own claim


def test_a_handed_over_result_is_taken_whole_and_a_missing_one_times_out(
    tmp_path: Path,
) -> None:
    board = Board.create(tmp_path / "ckpt", 3)
    board.wait_s = 0.2
    piece = LogSlice(0, 0, 50)
    result = ([(0, "f1", {"events": 3})], {"input": 3})
    board.put(piece, result)
    assert board.take(piece) == result
    assert board.take(LogSlice(0, 50, 100)) is None  # claimed by nobody who answers
    assert not list(board.root.glob("*.tmp"))


def test_a_board_is_fresh_per_run_and_old_ones_are_swept(tmp_path: Path) -> None:
    first = Board.create(tmp_path / "ckpt", 1)
    first.claim(LogSlice(0, 0, 10), 0)
    second = Board.create(tmp_path / "ckpt", 1)
    assert second.root != first.root and second.claim(LogSlice(0, 0, 10), 1)
    Board.create(tmp_path / "ckpt", 2, stale_s=-1)  # everything older than now is stale
    assert len(list((tmp_path / "ckpt").iterdir())) == 1
    second.remove()
    assert not second.root.exists()


@pytest.fixture
def setup(spark: Any, log_url: str, tmp_path: Path) -> tuple[DirectConfig, pd.DataFrame]:
    events = make_events(3000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    # driverBatchRecords 0: these small batches run as Spark jobs, as big ones do
    options = {"topic": "events", "log": log_url, "schema": SCHEMA, "driverBatchRecords": "0"}
    cfg = prepare(engine_config(tmp_path), options)
    assert cfg.co_located
    return dataclasses.replace(cfg, piece_records=100), events


def batch_groups(log_url: str) -> list[list[LogSlice]]:
    ends = riverbed.log.open(log_url).offsets("events")
    work = [LogSlice(p.partition, 0, p.end) for p in ends]
    return balanced_groups(work, lambda s: s.end - s.start, 2)


def rows_and_input(results: list[list[tuple[pd.DataFrame, Any]]]) -> tuple[pd.DataFrame, int]:
    pairs = [pair for result in results for pair in result]
    rows = pd.concat([r for r, _ in pairs if len(r)], ignore_index=True)
    return rows, sum(side.input for _, side in pairs)


@pytest.mark.spark
def test_a_helper_that_runs_first_reads_the_owners_pieces_and_the_owner_merges_them(
    setup: tuple[DirectConfig, pd.DataFrame], log_url: str
) -> None:
    """One core: task 1 runs before task 0 starts, so it claims all of task 0's pieces
    and hands them over; task 0 merges them (in piece order) and counts their input
    once. The emitted rows equal the oracle's."""
    cfg, events = setup
    groups = batch_groups(log_url)
    board = Board.create(Checkpoint.of(cfg.engine.checkpoint).handoff, 0)
    task = colocated_task(cfg, 0, 0, 0, groups, board)
    helper = task(1)
    owner = task(0)
    helped = helper[-1][1]
    assert helped.helped == sum(s.end - s.start for s in groups[0]) > 0
    assert sum(side.helped for _, side in owner) == 0  # nothing left to help with
    rows, counted = rows_and_input([helper, owner])
    assert counted == len(events)  # stolen pieces counted by their owner, once
    check(rows, events)


@pytest.mark.spark
def test_an_owner_computes_a_piece_itself_when_its_helper_is_lost(
    setup: tuple[DirectConfig, pd.DataFrame], log_url: str
) -> None:
    """A helper claimed a piece and died before handing it over: the owner waits
    ``wait_s``, computes the piece itself, and the result is still exact."""
    cfg, events = setup
    groups = batch_groups(log_url)
    board = Board.create(Checkpoint.of(cfg.engine.checkpoint).handoff, 0)
    board.wait_s = 0.3
    lost = split(groups[0][-1], cfg.piece_records)[-1]
    assert board.claim(lost, 1)  # the lost helper's claim, with no result ever
    task = colocated_task(cfg, 0, 0, 0, groups, board)
    rows, counted = rows_and_input([task(0), task(1)])
    assert counted == len(events)
    check(rows, events)


@pytest.mark.spark
def test_batches_with_small_pieces_through_spark_are_exact_and_leave_no_board(
    spark: Any, setup: tuple[DirectConfig, pd.DataFrame], log_url: str, tmp_path: Path
) -> None:
    """Two batches through Spark with 100-record pieces (both tasks claim and may help
    each other as they run): exact results, every record counted once, each batch's
    board removed."""
    cfg, events = setup
    assert lopsided(batch_groups(log_url))  # so the batches get a board
    batches = open_batches(cfg.engine.checkpoint)
    ends = riverbed.log.open(log_url).offsets("events")
    plans = [
        {str(p.partition): [0, p.end // 2] for p in ends},
        {str(p.partition): [p.end // 2, p.end] for p in ends},
    ]
    inputs = []
    for batch_id, slices in enumerate(plans):
        record = replace(
            next_record(batches, batch_id, cfg.engine.spec.watermark_ms),
            slices=slices,
            co_located=True,
        )
        batches.put(batch_id, record)
        done = run_planned(spark, cfg, batches, batch_id, replace(record, done=False))
        inputs.append(done.input)
        assert 0 <= done.helped <= done.input
    assert sum(inputs) == len(events)
    check(read_results(tmp_path / "out"), events)
    assert not list(Checkpoint.of(cfg.engine.checkpoint).handoff.iterdir())


@pytest.mark.spark
def test_a_retried_owner_takes_its_earlier_attempts_claims_back_without_waiting(
    setup: tuple[DirectConfig, pd.DataFrame], log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Task 0's first attempt claimed all its pieces and died; Spark runs it again on
    the same board. The retry computes its pieces at once (a wait for a hand-over that
    never comes would log "no result ... computing it here")."""
    cfg, events = setup
    groups = batch_groups(log_url)
    board = Board.create(Checkpoint.of(cfg.engine.checkpoint).handoff, 0)
    board.wait_s = 0.01
    for owned in groups[0]:
        for piece in split(owned, cfg.piece_records):
            assert board.claim(piece, 0)
    task = colocated_task(cfg, 0, 0, 0, groups, board)
    with caplog.at_level("WARNING", logger="riverbed.stream.steal"):
        retried = task(0)
    assert not [r for r in caplog.records if "no result" in r.getMessage()]
    rows, counted = rows_and_input([retried, task(1)])
    assert counted == len(events)
    check(rows, events)


def test_boards_go_where_every_task_reaches(tmp_path: Path) -> None:
    """A local checkpoint's handoff directory; with a bucket's checkpoint, the driver's
    machine when the tasks run there (local master), else nowhere."""
    cache = tmp_path / "home" / "state"
    ckpt = tmp_path / "ckpt" / "flags"
    assert handoff_dir(str(ckpt), cache, "flags", "spark://h1:7077") == Checkpoint(ckpt).handoff
    bucket = "s3://b/p/flags"
    on_this_machine = tmp_path / "home" / "handoff" / "flags"
    assert handoff_dir(bucket, cache, "flags", "local[2]") == on_this_machine
    assert handoff_dir(bucket, cache, "flags", "spark://h1:7077") is None


@pytest.mark.spark
@pytest.mark.s3
def test_a_bucket_checkpoint_steals_on_the_drivers_machine_and_stays_exact(
    spark: Any, s3_url: str, log_url: str, tmp_path: Path
) -> None:
    """Checkpoint, state and results in the bucket, tasks on this machine: lopsided
    batches get a board beside the local state cache (removed after each batch), and
    every record is counted once."""
    events = make_events(3000, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    local = tmp_path / "home" / "state"
    engine = replace(
        engine_config(tmp_path),
        checkpoint=f"{s3_url}/flags",
        output=f"{s3_url}/output/flags",
        state=StateConfig(local_dir=local, durable=f"{s3_url}/state"),
    )
    options = {"topic": "events", "log": log_url, "schema": SCHEMA, "driverBatchRecords": "0"}
    cfg = dataclasses.replace(prepare(engine, options), piece_records=100)
    assert cfg.co_located and lopsided(batch_groups(log_url))
    batches = open_batches(engine.checkpoint)
    ends = riverbed.log.open(log_url).offsets("events")
    record = replace(
        next_record(batches, 0, engine.spec.watermark_ms),
        slices={str(p.partition): [0, p.end] for p in ends},
        co_located=True,
    )
    batches.put(0, record)
    done = run_planned(spark, cfg, batches, 0, replace(record, done=False))
    assert done.input == len(events) and 0 <= done.helped <= done.input
    check(read_results(f"{s3_url}/output/flags"), events)
    boards = tmp_path / "home" / "handoff" / engine.spec.name
    assert boards.is_dir() and not list(boards.iterdir())  # made for the batch, removed
