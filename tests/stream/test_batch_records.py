"""A damaged batch record is a clear error naming the file and the recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.state import CorruptStateError
from riverbed.stream.records import BatchLog


def test_a_damaged_batch_record_names_the_file_and_the_recovery(tmp_path: Path) -> None:
    batches = BatchLog(str(tmp_path))
    batches.put(2, {"watermark_ms": 1000, "done": True})
    batches.put(3, {"watermark_ms": 2000, "done": True})
    path = batches.dir / f"{3:012d}.json"
    path.write_bytes(path.read_bytes()[:-5] + b"\x00garb")
    with pytest.raises(CorruptStateError) as caught:
        batches.get(3)
    message = str(caught.value)
    assert "the record of batch 3" in message and str(path) in message
    assert "If it is the newest batch record, delete the file" in message  # log-native
    (tmp_path / "spark" / "commits").mkdir(parents=True)  # a Spark streaming checkpoint
    with pytest.raises(CorruptStateError) as caught:
        batches.get(3)
    assert str(tmp_path / "spark" / "commits" / "3") in str(caught.value)
    with pytest.raises(CorruptStateError, match="batch 3"):
        batches.previous(4)
    assert batches.get(2) == {"watermark_ms": 1000, "done": True}  # the others still read
