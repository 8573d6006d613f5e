"""Exactly once from a group's partitions to a topic (``riverbed.log.group.transform``):
members SIGKILLed after some of a batch's appends and before its commit, and from
outside at random moments, while another member takes their partitions — every input's
output is in the output topic once."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from riverbed.control import connect
from riverbed.log import Log
from riverbed.log.diskless import DisklessLogStorage
from riverbed.log.errors import LogValueError, RecordRejectedError
from riverbed.log.group import transform
from riverbed.storage import open_store

MEMBER = """
import os, signal, sys, threading
from riverbed.control import connect
from riverbed.log import Log
from riverbed.log.diskless import DisklessLogStorage
from riverbed.log.group import transform
from riverbed.storage import open_store

store, control, name, die_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cp = connect(control)
storage = DisklessLogStorage(open_store(store), cp, flush_ms=5)
appends = [0]
once = storage.append_once

def append_once(*args, **kwargs):  # the failpoint: SIGKILL after this many appends
    base = once(*args, **kwargs)
    appends[0] += 1
    if appends[0] == die_after:
        os.kill(os.getpid(), signal.SIGKILL)
    return base

storage.append_once = append_once
log = Log(storage)

def handler(record):  # deterministic: the same outputs for the same record
    i = record.value["i"]
    return [{"i": i, "part": n, "k": f"o{(i * 7 + n) % 11}"} for n in range(i % 3)]

with log.consumer(cp, "xf", "in", member_id=name, session_ttl=2) as consumer:
    transform(consumer, handler, "out", key_field="k", max_records=500)
"""


def expected(inputs: int) -> list[tuple[int, int]]:
    return sorted((i, n) for i in range(inputs) for n in range(i % 3))


def outputs(log: Log) -> list[tuple[int, int]]:
    return sorted(
        (r.value["i"], r.value["part"]) for p in range(3) for r in log.read("out", p, 0, 10**6)
    )


@pytest.mark.slow
def test_members_killed_mid_batch_write_every_output_once(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store, control = f"file://{tmp_path / 'bucket'}", f"sqlite:///{tmp_path / 'control.db'}"
    cp = connect(control)
    log = Log(DisklessLogStorage(open_store(store), cp, flush_ms=5))
    log.create_topic("in", 4)
    log.create_topic("out", 3)

    produced = [0]

    def produce(n: int) -> None:
        lo = produced[0]
        log.producer("in").send_batch(
            [{"i": i, "k": f"k{i % 13}"} for i in range(lo, lo + n)], key_field="k"
        )
        produced[0] = lo + n

    produce(600)
    # input keeps arriving until the last kill has landed (however fast this machine is):
    # a batch replayed after a kill must be the batch that was planned, not whatever is
    # there by then (a longer one)
    kills_landed = threading.Event()

    def trickle() -> None:
        while not kills_landed.is_set():
            produce(10)
            time.sleep(0.03)

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    rng = random.Random(5)

    def member(name: str, die_after: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, str(script), store, control, name, str(die_after)],
            env=subprocess_env,
            stderr=subprocess.DEVNULL,
        )

    steady = member("steady", 0)  # never kills itself: takes over what the others drop
    kills = 0
    try:
        # each short-lived member SIGKILLs itself after a few appends — between one output
        # partition's append and the next, or before the batch's commit
        for k in range(6):
            victim = member(f"victim-{k}", rng.randint(1, 12))
            assert victim.wait(timeout=180) == -signal.SIGKILL  # input keeps coming: it will
            kills += 1
        # and the steady member, from outside, while it works
        time.sleep(rng.uniform(0.2, 1.0))
        steady.send_signal(signal.SIGKILL)
        steady.wait()
        kills += 1
        steady = member("steady-2", 0)
        kills_landed.set()
        feeder.join()
        want = expected(produced[0])
        deadline = time.monotonic() + 120
        while len(outputs(log)) < len(want):
            assert time.monotonic() < deadline, f"{len(outputs(log))} of {len(want)}"
            time.sleep(0.5)
        time.sleep(3)  # anything written twice would show now (the member keeps running)
    finally:
        steady.send_signal(signal.SIGKILL)
        steady.wait()
    got = outputs(log)
    assert kills == 7 and produced[0] > 600
    assert got == want  # every output once: none lost, none twice
    log.close()
    cp.close()


def test_a_log_that_cannot_recognise_a_retried_append_is_refused(tmp_path: Path) -> None:
    import riverbed.log

    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    log = riverbed.log.open(f"file://{tmp_path / 'log'}")
    log.create_topic("in", 1)
    log.create_topic("out", 1)
    stop = threading.Event()
    with log.consumer(cp, "xf", "in") as consumer, pytest.raises(LogValueError) as refused:
        transform(consumer, lambda r: [r.value], "out", stop=stop)
    assert "recognises a retried append" in str(refused.value)
    cp.close()


def test_through_a_log_server_of_diskless_topics_a_replayed_append_is_written_once(
    tmp_path: Path,
) -> None:
    """What a transform's replay does, through ``flight://``: the same (producer,
    sequence) appended twice — from two clients — is written once; another sequence is
    new. A server of a file log cannot recognise a replay and says so."""
    from riverbed.log.flight import FlightLogStorage
    from riverbed.log.records import ColumnBatch, RawRecord
    from riverbed.log.server import LogServer

    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    storage = DisklessLogStorage(open_store(f"file://{tmp_path / 'bucket'}"), cp, flush_ms=5)
    server = LogServer(storage)
    try:
        Log(storage).create_topic("out", 1)
        batch = ColumnBatch.from_rows(
            [RawRecord(1_700_000_000_000, b"k", f'{{"n": {n}}}'.encode()) for n in range(3)]
        )
        one, two = FlightLogStorage(server.url), FlightLogStorage(server.url)
        assert one.idempotent
        first = one.append_once("out", 0, batch, "xf-test", 40)
        assert two.append_once("out", 0, batch, "xf-test", 40) == first  # a replay
        assert two.append_once("out", 0, batch, "xf-test", 65) == first + 3  # a new batch
        assert storage.offsets("out", 0) == (0, 6)
        one.close()
        two.close()
    finally:
        server.shutdown()
        storage.close()
        cp.close()
    from riverbed.log.file import FileLogStorage

    files = LogServer(FileLogStorage(tmp_path / "served"))
    try:
        Log(files.storage).create_topic("out", 1)
        client = FlightLogStorage(files.url)
        assert not client.idempotent
        with pytest.raises(LogValueError, match="cannot recognise a retried batch"):
            client.append_once("out", 0, batch, "xf-test", 40)
        client.close()
    finally:
        files.shutdown()
        files.storage.close()


def test_a_typed_output_topic_gets_checked_columns_once_through_a_replayed_batch(
    tmp_path: Path,
) -> None:
    """Outputs to a typed topic go as its columns; a member that died after one of a
    batch's appends leaves the plan, and the batch replayed by the next one writes only
    what was missing. A value that does not fit the schema stops the transform before
    anything of its batch is written."""
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    storage = DisklessLogStorage(open_store(f"file://{tmp_path / 'bucket'}"), cp, flush_ms=5)
    log = Log(storage)
    log.create_topic("in", 1)
    log.create_topic("out", 2, schema="i long, part long, k string")
    log.producer("in").send_batch([{"i": i} for i in range(40)])

    def handler(record: object) -> list[dict[str, object]]:
        i = record.value["i"]  # type: ignore[attr-defined]
        return [{"i": i, "part": n, "k": f"o{(i * 7 + n) % 11}"} for n in range(i % 3)]

    once, appends = storage.append_once, [0]

    def dies_after_the_first(*args: object, **kwargs: object) -> int:
        if appends[0] == 1:
            raise RuntimeError("the member dies here")
        appends[0] += 1
        return once(*args, **kwargs)  # type: ignore[arg-type]

    storage.append_once = dies_after_the_first  # type: ignore[method-assign]
    with log.consumer(cp, "xf", "in", session_ttl=2) as consumer, pytest.raises(RuntimeError):
        transform(consumer, handler, "out", key_field="k", max_records=100)
    first = sorted((r.value["i"], r.value["part"]) for p in range(2) for r in log.read("out", p))
    assert 0 < len(first) < len(expected(40))  # one of the two partitions' appends landed
    storage.append_once = once  # type: ignore[method-assign]
    stop = threading.Event()
    with log.consumer(cp, "xf", "in", session_ttl=2) as consumer:
        worker = threading.Thread(
            target=transform,
            args=(consumer, handler, "out"),
            kwargs={"key_field": "k", "stop": stop},
        )
        worker.start()
        deadline = time.monotonic() + 30
        while len([r for p in range(2) for r in log.read("out", p)]) < len(expected(40)):
            assert time.monotonic() < deadline
            time.sleep(0.05)  # the transform's thread's progress: nothing to wait on
        time.sleep(1)  # anything written twice would show now (the transform still runs)
        stop.set()
        worker.join()
    records = [r for p in range(2) for r in log.read("out", p)]
    assert sorted((r.value["i"], r.value["part"]) for r in records) == expected(40)
    assert all(isinstance(r.value["i"], int) and r.value["k"].startswith("o") for r in records)

    log.producer("in").send_batch([{"i": 41}])  # its output does not fit: part is no long
    with (
        log.consumer(cp, "xf", "in", session_ttl=2) as consumer,
        pytest.raises(RecordRejectedError, match="field 'part' is 'x'"),
    ):
        transform(consumer, lambda r: [{"i": 1, "part": "x", "k": "o"}], "out")
    assert len([r for p in range(2) for r in log.read("out", p)]) == len(expected(40))
    log.close()
    cp.close()
