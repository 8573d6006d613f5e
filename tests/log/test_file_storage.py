"""File storage: torn tails, corruption, retention, many producer processes, SIGKILL."""

from __future__ import annotations

import logging
import os
import random
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riverbed.log
from riverbed.log import CorruptLogError, Log, OffsetOutOfRangeError
from riverbed.log.records import RawRecord, decode_batch, encode_batch, read_header

PROCS = Path(__file__).with_name("procs.py")


def segment_files(root: Path, topic: str, partition: int) -> list[Path]:
    return sorted((root / topic / str(partition)).glob("*.log"))


def test_torn_tail_is_reported_and_truncated_keeping_every_whole_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1)
    producer = log.producer("t")
    for i in range(5):
        producer.send_batch([{"i": i * 3 + j} for j in range(3)])
    log.close()
    segment = segment_files(tmp_path, "t", 0)[-1]
    whole = segment.stat().st_size
    with open(segment, "ab") as f:  # a crashed writer's half batch
        f.write(b"\x00\x00\x01\x00garbage-half-written")
    reopened = riverbed.log.open(tmp_path)
    assert [r.value["i"] for r in reopened.iter_records("t", 0)] == list(range(15))
    with caplog.at_level(logging.WARNING, logger="riverbed.log.file"):
        meta = reopened.producer("t").send({"i": 15})
    assert meta.offset == 15
    assert "unfinished batch" in caplog.text
    assert segment.stat().st_size > whole  # truncated back, then appended
    aside = segment.with_name(f"{segment.stem}.torn-{whole}")  # kept, not dropped
    assert aside.read_bytes() == b"\x00\x00\x01\x00garbage-half-written"
    assert [r.value["i"] for r in reopened.iter_records("t", 0)] == list(range(16))


def test_corruption_inside_a_closed_segment_is_an_error_not_silence(tmp_path: Path) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1, segment_bytes=1024)
    for i in range(40):
        log.producer("t").send({"i": i, "pad": "y" * 50})
    first = segment_files(tmp_path, "t", 0)[0]
    data = bytearray(first.read_bytes())
    data[40] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(
        CorruptLogError, match=f"bad batch at byte 0 of {first}; offsets 0..0 cannot be read"
    ) as caught:
        list(log.iter_records("t", 0))
    assert caught.value.damage.start == 0  # the first batch is the damaged one
    assert "riverbed topic skip t 0 0 1" in str(caught.value)


def test_retention_by_size_drops_whole_old_segments(tmp_path: Path) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1, segment_bytes=4096, retention_bytes=16_384)
    for i in range(300):
        log.producer("t").send({"i": i, "pad": "z" * 100})
    start, end = log.storage.offsets("t", 0)
    assert end == 300 and start > 0
    total = sum(p.stat().st_size for p in segment_files(tmp_path, "t", 0))
    assert total <= 16_384 + 4096
    with pytest.raises(OffsetOutOfRangeError, match="retention"):
        log.read("t", 0, 0)
    assert [r.offset for r in log.iter_records("t", 0, start)] == list(range(start, 300))


def test_retention_by_age(tmp_path: Path) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1, segment_bytes=2048, retention_ms=60_000)
    for i in range(100):
        log.producer("t").send({"i": i, "pad": "q" * 50})
    old = time.time() - 3600
    for segment in segment_files(tmp_path, "t", 0)[:-1]:
        os.utime(segment, (old, old))
    assert log.storage.enforce_retention("t") > 0
    assert len(segment_files(tmp_path, "t", 0)) == 1
    assert log.storage.offsets("t", 0)[1] == 100


@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
def test_every_fsync_policy_stores_the_same(tmp_path: Path, fsync: str) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1, fsync=fsync)  # type: ignore[arg-type]
    log.producer("t").send_batch(list(range(100)))
    assert [r.value for r in riverbed.log.open(tmp_path).iter_records("t", 0)] == list(range(100))
    with pytest.raises(ValueError, match="fsync"):
        log.create_topic("u", 1, fsync="sometimes")  # type: ignore[arg-type]


def run_producers(
    path: Path, env: dict[str, str], names: list[str], seconds: float, batch: int
) -> list[list[tuple[int, int, int, int]]]:
    """Run producer processes until each appends, then ``seconds`` more, then SIGKILL
    them; their acked batches."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROCS), str(path), name, str(batch)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in names
    ]
    acked: list[list[tuple[int, int, int, int]]] = [[] for _ in procs]

    def read(i: int) -> None:
        out = procs[i].stdout
        assert out is not None
        for line in out:
            fields = line.split()
            if len(fields) != 4 or not line.endswith("\n"):
                continue  # a line cut by SIGKILL: that batch was not acknowledged
            p, base, count, seq = map(int, fields)
            acked[i].append((p, base, count, seq))

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(names))]
    for t in readers:
        t.start()
    # the kill comes ``seconds`` after every producer is appending (start-up varies)
    deadline = time.monotonic() + 60
    while not all(acked) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(seconds)
    for p in procs:
        p.kill()
        p.wait()
    for t in readers:
        t.join()
    return acked


def check_log(path: Path, names: list[str], acked: list[list[tuple[int, int, int, int]]]) -> None:
    log = riverbed.log.open(path)
    stored: dict[int, list[dict[str, object]]] = {}
    for p in range(log.topic("events").partitions):
        records = list(log.iter_records("events", p))
        assert [r.offset for r in records] == list(range(len(records))), "offset gap"
        stored[p] = [r.value for r in records]
    seen: dict[tuple[int, int], dict[str, object]] = {}
    for p, values in stored.items():
        for offset, value in enumerate(values):
            seen[(p, offset)] = value
    for i, batches in enumerate(acked):
        for p, base, count, seq in batches:
            for k in range(count):
                value = seen.get((p, base + k))
                assert value is not None, f"acknowledged record {names[i]}#{seq + k} lost"
                assert (value["w"], value["seq"]) == (names[i], seq + k)
    # per writer, sequence numbers are in order and unique (a batch is all or nothing)
    for name in names:
        seqs = [v["seq"] for vs in stored.values() for v in vs if v["w"] == name]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
        assert len(seqs) % 50 == 0, "a partial batch is visible"


@pytest.mark.slow
def test_producer_processes_killed_mid_batch_lose_nothing_acknowledged(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("events", 2, segment_bytes=256 * 1024)
    log.close()
    rng = random.Random(11)
    all_acked: list[list[tuple[int, int, int, int]]] = []
    for round_no in range(5):
        names = [f"r{round_no}w{i}" for i in range(3)]
        acked = run_producers(tmp_path, subprocess_env, names, rng.uniform(0.15, 0.5), 50)
        assert all(acked), "a producer acknowledged nothing"
        all_acked.extend(acked)
        check_log(tmp_path, names, acked)
    total = sum(count for batches in all_acked for _, _, count, _ in batches)
    stored = sum(o.end for o in riverbed.log.open(tmp_path).offsets("events"))
    assert stored >= total


def test_corrupt_topic_file_is_named(file_log: Log, tmp_path: Path) -> None:
    file_log.create_topic("t", 1)
    (tmp_path / "log" / "t" / "topic.json").write_text("{not json")
    with pytest.raises(CorruptLogError, match=r"topic\.json"):
        riverbed.log.open(tmp_path / "log").topic("t")


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**62),
            st.none() | st.binary(max_size=12),
            st.binary(max_size=40),
            st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=2),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_batch_format_round_trips_rows_and_columns(rows: list[Any]) -> None:
    """Format 2 (columnar) keeps every field: missing keys, empty values, headers."""
    records = [RawRecord(ts, key, value, headers) for ts, key, value, headers in rows]
    frame = encode_batch(7, records)
    header = read_header(frame, 0)
    assert header is not None and (header.base_offset, header.count) == (7, len(records))
    batch = decode_batch(frame, 0, header)
    assert batch.rows() == records
    assert batch.keys.to_pylist() == [r.key for r in records]
    assert batch.timestamps_ms.tolist() == [r.timestamp_ms for r in records]


def test_format_1_batches_are_still_read() -> None:
    import msgpack

    rows = [[5, b"k", b"v1", {}], [6, None, b"v2", {"h": b"x"}]]
    payload = struct.pack(">QI", 0, 2) + msgpack.packb(rows, use_bin_type=True)
    frame = struct.pack(">II", len(payload) + 4, zlib.crc32(payload)) + payload
    header = read_header(frame, 0)
    assert header is not None
    assert decode_batch(frame, 0, header).rows() == [
        RawRecord(5, b"k", b"v1", {}),
        RawRecord(6, None, b"v2", {"h": b"x"}),
    ]


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=30), max_size=4),
    partitions=st.integers(1, 4),
    partitioner=st.sampled_from(["key-hash", "round-robin"]),
)
def test_a_list_of_bytes_goes_as_columns_and_stores_what_the_row_path_stores(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[bytes]],
    partitions: int,
    partitioner: str,
) -> None:
    """``send_batch`` of ``bytes`` values on a bytes topic of a file log takes the
    columnar path (no Python object per record); partition, offset, key and value of
    every record are what the row path (the same values one by one) gives."""
    log = riverbed.log.open(tmp_path_factory.mktemp("log"))
    for name in ("columns", "rows"):
        log.create_topic(name, partitions, serde="bytes", partitioner=partitioner)
    columns, rows = log.producer("columns"), log.producer("rows")
    for values in batches:  # (asked of another producer: taking the path places records)
        assert log.producer("columns")._bytes_columns(values) is not None
        got = columns.send_batch(values)
        want = [rows.send(v) for v in values]
        assert [(m.partition, m.offset) for m in got] == [(m.partition, m.offset) for m in want]
    for p in range(partitions):
        a, b = log.read("columns", p, 0, 1000), log.read("rows", p, 0, 1000)
        assert [(r.key, r.value, r.offset) for r in a] == [(r.key, r.value, r.offset) for r in b]
    # what the columns cannot take goes the row path: a str is encoded, not refused
    assert log.producer("columns")._bytes_columns([b"a", "b"]) is None
    sent = columns.send_batch([b"a", "b"])
    stored = [log.read("columns", m.partition, m.offset, 1)[0].value for m in sent]
    assert stored == [b"a", b"b"]


def test_a_waiting_reader_is_woken_by_another_processs_append(tmp_path: Path) -> None:
    """A file log's wait() returns when a record arrives from another process (the
    kernel says: inotify), not at its timeout; with nothing appended it times out."""
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 2, serde="bytes")
    storage = log.storage
    assert storage.waits  # Linux: inotify is there
    began = time.monotonic()
    assert storage.wait({("t", 0): 0, ("t", 1): 0}, 0.3) is False
    assert time.monotonic() - began >= 0.29
    code = (
        "import time, riverbed.log; time.sleep(0.5); "
        f"riverbed.log.open({str(tmp_path)!r}).producer('t').send(b'x', partition=1)"
    )
    writer = subprocess.Popen([sys.executable, "-c", code])
    try:
        began = time.monotonic()
        assert storage.wait({("t", 0): 0, ("t", 1): 0}, 60) is True
        waited = time.monotonic() - began
    finally:
        writer.wait(60)
    assert waited < 30, f"woken after {waited:.1f} s: by the timeout, not the append"
    assert storage.offsets("t", 1) == (0, 1)
    # a position already behind the end is answered at once
    assert storage.wait({("t", 1): 0}, 60) is True
