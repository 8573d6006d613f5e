"""Damaged topics: a bad batch is an error naming the file, the byte and the offsets —
never silence — unless it is an unfinished tail; a recorded skip reads past exactly the
damaged offsets; indexes are checked and rebuilt; nothing else is lost."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import riverbed.log
from riverbed.log import CorruptLogError
from riverbed.log.records import read_header
from tests.cli import run_cli


def frames(segment: Path) -> list[tuple[int, int, int, int]]:
    """(byte, size, first offset, count) of every batch of a healthy segment."""
    data = segment.read_bytes()
    out, pos = [], 0
    while (header := read_header(data, pos)) is not None:
        out.append((pos, header.size, header.base_offset, header.count))
        pos += header.size
    assert pos == len(data)
    return out


def build(root: Path, sizes: list[int], segment_bytes: int = 64 * 1024 * 1024) -> list[int]:
    """A one-partition topic "t" of batches of ``sizes`` records; returns the values."""
    log = riverbed.log.open(root)
    log.create_topic("t", 1, segment_bytes=segment_bytes)
    producer = log.producer("t")
    values, n = [], 0
    for size in sizes:
        batch = [{"i": n + k, "pad": "p" * (n % 7)} for k in range(size)]
        producer.send_batch(batch)
        values += [v["i"] for v in batch]
        n += size
    log.close()
    return values


def read_all(root: Path, start: int = 0) -> list[tuple[int, int]]:
    log = riverbed.log.open(root)
    try:
        return [(r.offset, r.value["i"]) for r in log.iter_records("t", 0, start)]
    finally:
        log.close()


def flip(path: Path, positions: list[int]) -> None:
    data = bytearray(path.read_bytes())
    for p in positions:
        data[p] ^= 0x5A
    path.write_bytes(bytes(data))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=2, max_size=12),
    data=st.data(),
)
def test_a_damaged_batch_is_named_and_a_skip_reads_past_exactly_it(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("log")
    values = build(root, sizes)
    segment = root / "t" / "0" / f"{0:020d}.log"
    batches = frames(segment)
    k = data.draw(st.integers(0, len(batches) - 2), label="damaged batch")  # not the tail
    pos, size, base, count = batches[k]
    hits = data.draw(
        st.lists(st.integers(pos, pos + size - 1), min_size=1, max_size=20, unique=True)
    )
    flip(segment, hits)

    with pytest.raises(CorruptLogError) as caught:
        read_all(root)
    damage = caught.value.damage
    assert (damage.position, damage.start, damage.end) == (pos, base, base + count)
    assert f"byte {pos} of {segment}" in str(caught.value)
    assert f"riverbed topic skip t 0 {base} {base + count}" in str(caught.value)
    # what lies after the damage still reads, from any offset past it
    after = [(o, v) for o, v in enumerate(values) if o >= base + count]
    assert read_all(root, base + count) == after
    # describe's offsets and the writer are unaffected: appends keep their offsets
    log = riverbed.log.open(root)
    assert log.storage.offsets("t", 0) == (0, len(values))
    assert log.producer("t").send({"i": len(values), "pad": ""}).offset == len(values)
    report = log.storage.verify("t")[0]
    assert [(d.start, d.end) for d in report.damage] == [(base, base + count)]
    assert not report.ok

    log.storage.skip("t", 0, base, base + count, "flipped bytes (test)")
    expected = [
        (o, v) for o, v in enumerate([*values, len(values)]) if not base <= o < base + count
    ]
    assert read_all(root) == expected
    columns = log.storage.read_columns("t", 0, 0, len(values) + 1)
    assert columns.offsets.tolist() == [o for o, _ in expected]
    report = log.storage.verify("t")[0]
    assert report.ok and [(d.start, d.end) for d in report.skipped] == [(base, base + count)]
    log.close()


def test_a_skip_that_does_not_cover_the_damage_reads_nothing_past_it(tmp_path: Path) -> None:
    build(tmp_path, [10, 10, 10])
    segment = tmp_path / "t" / "0" / f"{0:020d}.log"
    pos, _, _, _ = frames(segment)[1]
    flip(segment, [pos + 30])
    log = riverbed.log.open(tmp_path)
    log.storage.skip("t", 0, 12, 20, "too short")  # the damage is 10..19
    log.storage.skip("t", 0, 25, 28, "healthy records: no effect")
    with pytest.raises(CorruptLogError, match=r"offsets 10\.\.19 cannot be read"):
        read_all(tmp_path)
    assert [o for o, _ in read_all(tmp_path, 20)] == list(range(20, 30))  # 25..27 still read
    config = json.loads((tmp_path / "t" / "topic.json").read_text())
    assert [s["reason"] for s in config["skipped"]] == ["too short", "healthy records: no effect"]
    with pytest.raises(ValueError, match="start < end"):
        log.storage.skip("t", 0, 5, 5, "")
    with pytest.raises(ValueError, match=r"partitions 0\.\.0"):
        log.storage.skip("t", 3, 0, 5, "")


def test_damage_in_a_closed_segment_and_a_missing_tail_of_one(tmp_path: Path) -> None:
    values = build(tmp_path, [5] * 40, segment_bytes=1024)
    segments = sorted((tmp_path / "t" / "0").glob("*.log"))
    assert len(segments) >= 3
    # the last batch of a closed segment: nothing readable after it *in the file*, but
    # the next segment shows the partition went on — damage, not a torn tail
    pos, _, base, count = frames(segments[0])[-1]
    flip(segments[0], [pos + 20])
    with pytest.raises(CorruptLogError, match=f"offsets {base}..{base + count - 1}"):
        read_all(tmp_path)
    # a closed segment cut short (bytes missing at its end): the same
    pos2, _, base2, count2 = frames(segments[1])[-1]
    with open(segments[1], "r+b") as f:
        f.truncate(pos2)
    with pytest.raises(CorruptLogError, match=f"offsets {base2}..{base2 + count2 - 1}"):
        read_all(tmp_path, base + count)
    assert [v for _, v in read_all(tmp_path, base2 + count2)] == values[base2 + count2 :]
    log = riverbed.log.open(tmp_path)
    first = int(segments[1].stem)  # the records before the cut still read
    got = log.read("t", 0, first, max_records=base2 - first)
    assert [r.value["i"] for r in got] == values[first:base2]
    log.close()


def test_an_append_cut_short_is_cut_off_and_kept_aside(tmp_path: Path) -> None:
    # a writer killed mid-append leaves a prefix of its frame: fewer bytes than it claims
    segment = tmp_path / "t" / "0" / f"{0:020d}.log"
    build(tmp_path, [200] * 4)
    pos, size, base, _ = frames(segment)[-1]
    os.truncate(segment, pos + size // 2)
    assert [o for o, _ in read_all(tmp_path)] == list(range(base))
    log = riverbed.log.open(tmp_path)
    assert log.storage.offsets("t", 0) == (0, base)
    assert log.producer("t").send({"i": -1, "pad": ""}).offset == base  # cut off, kept aside
    assert list(segment.parent.glob("*.torn-*"))
    log.close()


def test_a_damaged_last_batch_that_is_all_there_is_damage_not_an_unfinished_append(
    tmp_path: Path,
) -> None:
    # all the bytes the frame claims are there, but its CRC fails: no crash does that
    segment = tmp_path / "t" / "0" / f"{0:020d}.log"
    build(tmp_path, [200] * 4)
    pos, _, base, _ = frames(segment)[-1]
    flip(segment, [pos + 25])
    log = riverbed.log.open(tmp_path)
    with pytest.raises(CorruptLogError, match="nothing readable follows") as caught:
        log.storage.offsets("t", 0)
    assert caught.value.damage.start == base and caught.value.damage.position == pos
    with pytest.raises(CorruptLogError, match=f"bad batch at byte {pos}"):
        read_all(tmp_path)
    with pytest.raises(CorruptLogError):  # appends stop: the next offset is not known
        log.producer("t").send({"i": -1, "pad": ""})
    assert not list(segment.parent.glob("*.torn-*"))  # nothing moved, nothing lost
    log.close()


def test_a_damaged_tail_past_the_index_needs_a_skip_then_appends_resume_after_it(
    tmp_path: Path,
) -> None:
    build(tmp_path, [200] * 6)
    segment = tmp_path / "t" / "0" / f"{0:020d}.log"
    batches = frames(segment)
    pos, _, base, _ = batches[-2]
    data = segment.read_bytes()
    flip(segment, [pos + 25, len(data) - 5])  # the last two batches: nothing valid after
    log = riverbed.log.open(tmp_path)
    with pytest.raises(CorruptLogError, match="nothing readable follows") as caught:
        log.storage.offsets("t", 0)
    upper = caught.value.damage.upper
    assert upper >= 1200
    with pytest.raises(CorruptLogError):
        log.producer("t").send({"i": 0, "pad": ""})  # appends refuse to reuse offsets
    log.storage.skip("t", 0, base, upper, "tail lost")
    assert log.storage.offsets("t", 0) == (0, upper)
    assert log.producer("t").send({"i": 7, "pad": ""}).offset == upper
    assert [o for o, _ in read_all(tmp_path)] == [*range(base), upper]
    log.close()


def test_a_corrupt_index_entry_is_named_and_rebuilt(tmp_path: Path) -> None:
    values = build(tmp_path, [200] * 6)
    index = tmp_path / "t" / "0" / f"{0:020d}.index"
    raw = bytearray(index.read_bytes())
    assert len(raw) >= 32
    struct.pack_into(">Q", raw, 16 + 8, struct.unpack_from(">Q", raw, 24)[0] + 7)  # byte + 7
    index.write_bytes(bytes(raw))
    offset = struct.unpack_from(">Q", raw, 16)[0]
    with pytest.raises(CorruptLogError, match=rf"{index}: its entry for offset {offset}"):
        read_all(tmp_path, offset)
    assert read_all(tmp_path) == list(enumerate(values))  # reads from 0 need no entry
    log = riverbed.log.open(tmp_path)
    assert log.storage.offsets("t", 0) == (0, len(values))
    assert not log.storage.verify("t")[0].ok
    log.storage.verify("t", rebuild_indexes=True)
    assert log.storage.verify("t")[0].ok
    assert read_all(tmp_path, offset) == list(enumerate(values))[offset:]
    log.close()


def test_topic_verify_and_skip_from_the_cli(tmp_path: Path) -> None:
    build(tmp_path, [10, 10, 10])
    segment = tmp_path / "t" / "0" / f"{0:020d}.log"
    pos, _, _, _ = frames(segment)[1]
    flip(segment, [pos + 30])

    env = {
        **os.environ,
        "RIVERBED_LOG": f"file://{tmp_path}",
        "RIVERBED_HOME": str(tmp_path / "home"),
        "RIVERBED_CONTROL": "",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=env)

    verify = cli("topic", "verify", "t")
    assert verify.returncode == 1, verify.stderr
    assert "offsets 10..19 cannot be read" in verify.stdout
    assert "riverbed topic skip t 0 10 20" in verify.stdout
    consume = cli("consume", "t", "--group", "g", "--from-beginning", "--timeout", "3")
    assert consume.returncode != 0
    assert "Traceback" not in consume.stderr
    assert "offsets 10..19 cannot be read" in consume.stderr
    describe = cli("topic", "describe", "t")
    assert describe.returncode == 1 and "damaged" in describe.stdout + describe.stderr
    skip = cli("topic", "skip", "t", "0", "10", "20", "--reason", "disk error on 2026-11-23")
    assert skip.returncode == 0, skip.stderr
    assert cli("topic", "verify", "t").returncode == 0
    describe = cli("topic", "describe", "t")
    assert describe.returncode == 0 and "disk error on 2026-11-23" in describe.stdout
    consume = cli("consume", "t", "--group", "g", "--from-beginning", "--timeout", "3")
    assert consume.returncode == 0, consume.stderr
    assert len(consume.stdout.splitlines()) == 20
