"""riverbed's own trigger loop for the log-native path (stream/loop.py), on a real
Spark session: continuous triggers, stop, the write-ahead plan re-run after a crash, and
checkpoints written by the Spark-driven loop before it."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import riverbed.log
from riverbed.inspect.streams import _batch_row
from riverbed.spark.offsets import TriggerError
from riverbed.state import CorruptStateError
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.plan import ends_of
from riverbed.stream.sparklog import committed_ends
from tests.stream.conftest import make_events, write_events
from tests.stream.test_engine import SCHEMA
from tests.stream.test_lognative import check, spec

pytestmark = pytest.mark.spark


def options(url: str, max_records: int = 400) -> dict[str, Any]:
    return {"topic": "events", "log": url, "schema": SCHEMA, "maxRecordsPerBatch": max_records}


def run(spark: Any, url: str, root: Path, **kwargs: Any) -> Any:
    return start(
        spark,
        spec(3),
        options(url),
        checkpoint=root / "ckpt",
        output=root / "out",
        log_url=url,
        trigger=kwargs.pop("trigger", {"availableNow": True}),
        **kwargs,
    )


def test_a_continuous_query_picks_up_new_records_until_stopped(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    events = make_events(1200, hours=3)
    first, second = events.iloc[:700], events.iloc[700:]
    write_events(log_url, first, partitions=3, key_field="flag")
    began = datetime.now(UTC).replace(microsecond=0)  # the stamps are to the ms
    query = run(spark, log_url, tmp_path, trigger={"processingTime": "100 milliseconds"})
    try:
        query.processAllAvailable()
        check(read_results(tmp_path / "out"), first)
        assert query.isActive and query.exception() is None
        write_events(log_url, second, partitions=3, key_field="flag")
        query.processAllAvailable()
        check(read_results(tmp_path / "out"), events)
        assert query.awaitTermination(0.1) is False  # still running
    finally:
        query.stop()
    assert not query.isActive and query.exception() is None
    progress = query.recentProgress
    assert sum(p["numInputRows"] for p in progress) == 1200
    assert [p["batchId"] for p in progress] == list(range(len(progress)))
    assert query.lastProgress == progress[-1]
    # when each trigger began, as Spark writes it: in order, within the test
    starts = [datetime.fromisoformat(p["timestamp"]) for p in progress]
    assert starts == sorted(starts) and began <= starts[0] and starts[-1] <= datetime.now(UTC)
    assert all(p["timestamp"].endswith("Z") for p in progress)


def test_a_recorded_plan_is_run_as_recorded(spark: Any, log_url: str, tmp_path: Path) -> None:
    """A driver killed after writing batch 0's plan, before finishing it: the restart
    runs exactly the recorded slices as batch 0 (the state version it may already have
    committed), not a new plan over what the topic holds now."""
    events = make_events(900, hours=2)
    write_events(log_url, events, partitions=3, key_field="flag")
    ends = {p.partition: p.end for p in riverbed.log.open(log_url).offsets("events")}
    plan = {str(p): [0, e // 3] for p, e in ends.items()}
    batches = open_batches(str(tmp_path / "ckpt"))
    batches.put(0, BatchRecord(slices=plan, co_located=True))
    query = run(spark, log_url, tmp_path)
    query.awaitTermination(300)
    assert batches.get(0).input == sum(e // 3 for e in ends.values())
    assert batches.get(1).slices == {
        str(p): [e // 3, min(e, e // 3 + s)]
        for (p, e), s in zip(ends.items(), _shares(ends, plan), strict=True)
    }
    check(read_results(tmp_path / "out"), events)


def _shares(ends: dict[int, int], plan: dict[str, list[int]]) -> list[int]:
    """Batch 1's records per partition: 400 shared in proportion to what is left."""
    left = {p: e - plan[str(p)][1] for p, e in ends.items()}
    total = sum(left.values())
    shares = {p: n * 400 // total for p, n in left.items()}
    rest = 400 - sum(shares.values())
    for p in sorted(left, key=lambda q: left[q], reverse=True)[:rest]:
        shares[p] += 1
    return [shares[p] for p in ends]


def test_a_checkpoint_of_the_spark_driven_loop_carries_on(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """Batch records without slices (written when Spark's offset log held the plans):
    the loop reads where they ended from Spark's offset log and carries on, counting
    nothing twice."""
    events = make_events(1000, hours=3)
    first, second = events.iloc[:600], events.iloc[600:]
    write_events(log_url, first, partitions=3, key_field="flag")
    run(spark, log_url, tmp_path).awaitTermination(300)
    batches = open_batches(str(tmp_path / "ckpt"))
    spark_dir = tmp_path / "ckpt" / "spark"
    for directory in ("offsets", "commits"):
        (spark_dir / directory).mkdir(parents=True)
    plans = {}
    for b in batches.ids():  # rewrite as the Spark-driven loop left them
        record = batches.get(b)
        plans[b], record.slices = record.slices, None
        ends = {p: e for p, (_, e) in plans[b].items()}
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
        (spark_dir / "offsets" / str(b)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(ends)}")
        (spark_dir / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        legacy_record(tmp_path / "ckpt", b, record)
    old = batches.ids()
    # the console's ledger and `stream status` place these batches through Spark's log
    ckpt = tmp_path / "ckpt"
    assert {b: _batch_row(ckpt, b, batches.get(b))["offsets"] for b in old} == plans
    assert committed_ends(ckpt, [batches.get(old[-1])]) == ends_of(plans[old[-1]])
    write_events(log_url, second, partitions=3, key_field="flag")
    query = run(spark, log_url, tmp_path)
    query.awaitTermination(300)
    new = [b for b in batches.ids() if b not in old]
    assert new and sum(batches.get(b).input for b in new) == 400
    check(read_results(tmp_path / "out"), events)


def legacy_record(checkpoint: Path, batch_id: int, record: BatchRecord) -> None:
    """A batch record as directories held them before create-only records: one file
    per batch, rewritten when the batch was done (no commit object beside it)."""
    name = f"{batch_id:012d}.json"
    (checkpoint / "riverbed" / "commits" / name).unlink(missing_ok=True)
    (checkpoint / "riverbed" / "batches" / name).write_text(json.dumps(record.to_json()))


def test_a_spark_driven_batch_planned_but_not_done_gets_its_slices_once(
    tmp_path: Path,
) -> None:
    """The newest batch of a Spark-driven checkpoint, recorded without slices and not
    done: the loop completes its plan with the slices Spark's offset log held — the one
    record ever replaced; any other second plan is refused."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "riverbed" / "batches").mkdir(parents=True)
    legacy_record(ckpt, 3, BatchRecord(watermark_ms=7))
    batches = open_batches(str(ckpt))
    batches.put(3, BatchRecord(watermark_ms=7, slices={"0": [5, 9]}, co_located=True))
    assert batches.get(3).slices == {"0": [5, 9]}  # type: ignore[union-attr]
    with pytest.raises(CorruptStateError, match="another plan"):
        open_batches(str(ckpt)).put(3, BatchRecord(watermark_ms=7, slices={"0": [5, 8]}))


def test_a_spark_driven_checkpoint_whose_offset_log_is_gone_is_named(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    write_events(log_url, make_events(300, hours=1), partitions=3, key_field="flag")
    batches = open_batches(str(tmp_path / "ckpt"))
    batches.put(0, BatchRecord(done=True))
    query = run(spark, log_url, tmp_path)
    with pytest.raises(Exception, match="does not record which offsets it read") as failure:
        query.awaitTermination(300)
    assert "start on a new one" in str(failure.value)
    assert batches.ids() == [0]  # nothing planned over a past it cannot place


def test_stop_ends_the_loop_mid_run_and_the_restart_finishes_exactly(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """Stopped once its first plan is recorded (its Spark job cancelled if running):
    no error, and the next start finishes with every record counted once."""
    events = make_events(1500, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    query = run(spark, log_url, tmp_path)
    planned = open_batches(str(tmp_path / "ckpt"))
    deadline = time.monotonic() + 60
    while not planned.ids() and time.monotonic() < deadline:
        time.sleep(0.005)
    query.stop()
    assert not query.isActive and query.exception() is None
    assert query.awaitTermination(0) is True
    stopped_at = planned.ids()
    assert stopped_at and stopped_at[-1] < 3  # 1500 records take 4 batches of 400
    run(spark, log_url, tmp_path).awaitTermination(300)
    batches = open_batches(str(tmp_path / "ckpt"))
    assert all(batches.get(b).done for b in batches.ids())
    assert sum(batches.get(b).input for b in batches.ids()) == 1500
    check(read_results(tmp_path / "out"), events)


def test_a_bad_trigger_is_refused_before_anything_runs(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    write_events(log_url, make_events(10, hours=1), partitions=3, key_field="flag")
    with pytest.raises(TriggerError, match="processingTime 'often' is not an interval"):
        run(spark, log_url, tmp_path, trigger={"processingTime": "often"})
    assert not (tmp_path / "out").exists()
    assert pd.Series(open_batches(str(tmp_path / "ckpt")).ids()).empty


def test_a_no_data_batch_closes_the_windows_the_last_events_passed(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    """A final-mode aggregation run to the end of its input: the watermark the last
    batch's events set closes windows that no later event will — a batch without input
    runs (as Spark's engine runs a no-data batch) and writes them; a second run with
    nothing new runs no batch."""
    from dataclasses import replace

    from riverbed.windows import Tumbling
    from tests.stream.test_engine import oracle

    events = make_events(1200, hours=3)
    write_events(log_url, events, partitions=3, key_field="flag")
    final = replace(spec(3), watermark="10m", output="final")

    def run_final() -> None:
        query = start(spark, final, options(log_url), checkpoint=tmp_path / "ckpt",
                      output=tmp_path / "out", log_url=log_url,
                      trigger={"availableNow": True})  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None

    run_final()
    batches = open_batches(str(tmp_path / "ckpt"))
    ids = batches.ids()
    last = batches.get(ids[-1])
    newest_ms = int(events["ts"].max().value // 1_000_000)
    assert last.input == 0 and last.watermark_ms == newest_ms - 600_000
    assert sum(batches.get(b).input for b in ids) == 1200
    want = oracle(events, Tumbling("1h"))
    ends = want["window_start"] + pd.Timedelta("1h")
    closed = want[ends <= pd.Timestamp(last.watermark_ms, unit="ms", tz="UTC")]
    assert len(closed) and len(closed) < len(want)  # the last hour is still open
    got = read_results(tmp_path / "out")
    merged = got.merge(closed, on=["window_start", "key"], suffixes=("", "_oracle"))
    assert len(merged) == len(closed) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    run_final()  # nothing new, the watermark where it is: no batch
    assert open_batches(str(tmp_path / "ckpt")).ids() == ids
