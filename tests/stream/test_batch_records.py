"""The batch record's one shape, through JSON, from every version of riverbed (a
damaged one: tests/stream/test_checkpoint_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.stream.batchlog import BatchRecord, open_batches

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
PAIR = st.lists(st.integers(0, 2**40), min_size=2, max_size=2)
COUNTS = ["input", "late", "batches"]
records = st.builds(
    BatchRecord,
    watermark_ms=st.integers(0, 2**53),
    previous_watermark_ms=st.integers(0, 2**53),
    max_event_ms=st.integers(0, 2**53),
    slices=st.none()
    | st.dictionaries(
        st.integers(0, 63).map(str), st.lists(st.integers(0, 2**40), min_size=2, max_size=2)
    ),
    co_located=st.none() | st.booleans(),
    input=st.none() | st.integers(0, 2**40),
    late=st.none() | st.integers(0, 2**40),
    malformed=st.none() | st.integers(0, 2**40),
    helped=st.none() | st.integers(0, 2**40),
    side_outputs_written=st.booleans(),
    ms=st.dictionaries(st.sampled_from(["offsets", "state_job", "outputs"]), st.integers(0, 10**6)),
    term=st.none() | st.integers(1, 10**6),
    done=st.booleans(),
    totals=st.none()
    | st.dictionaries(st.sampled_from(["input", "late", "batches"]), st.integers(0, 10**9)),
    extra=st.dictionaries(
        st.text(min_size=1, max_size=8).map(lambda k: "x_" + k), json_values, max_size=3
    ),
)


@settings(max_examples=300)
@given(records)
def test_a_record_reads_back_as_it_was_written(record: BatchRecord) -> None:
    """The file's JSON is the record's one shape: whatever a record holds (keys of a
    newer riverbed included) reads back equal, through real JSON text."""
    assert BatchRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_records_of_older_versions_read_with_defaults(tmp_path: Path) -> None:
    """A record file as riverbed wrote it before the typed record: plain keys, some
    missing; it reads, and rewriting it keeps every key it had (and fills in the
    watermarks' defaults)."""
    old = {"watermark_ms": 5, "max_event_ms": 9, "done": True, "input": 3, "outputs": 1}
    path = tmp_path / "riverbed" / "batches" / f"{0:012d}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    batches = open_batches(str(tmp_path))
    record = batches.get(0)
    assert record is not None and record.done and record.counted("late") == 0
    assert record.previous_watermark_ms == 0 and record.extra == {"outputs": 1}
    batches.put(0, record)  # recorded again (as its commit): every key it had kept
    commit = tmp_path / "riverbed" / "commits" / f"{0:012d}.json"
    assert json.loads(commit.read_text()) == old | {"previous_watermark_ms": 0}
    assert json.loads(path.read_text()) == old  # the old file is never rewritten
