"""The log server: refusals that name the problem (and the server goes on), security,
consumers woken by appends, the CLI, TLS."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import riverbed.log
from riverbed.control import connect
from riverbed.log import Log, LogError, TopicNotFoundError
from riverbed.log import flight as flight_storage
from riverbed.log.errors import CorruptLogError, RecordRejectedError
from riverbed.log.file import FileLogStorage
from riverbed.log.flight import FlightLogStorage
from riverbed.log.records import RawRecord, read_header
from riverbed.log.server import LogServer
from riverbed.log.wire import (
    PROTOCOL,
    BatchTooLargeError,
    ProtocolError,
    ServerUnavailableError,
    encode,
)
from riverbed.log.wire import records_batch as wire_batch
from riverbed.testing import free_port
from riverbed.testing.logserver import RIVERBED


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[LogServer]:
    server = LogServer(FileLogStorage(tmp_path / "log"), token="s3cret", max_batch_bytes=20_000)
    yield server
    server.shutdown()


def test_each_bad_request_gets_one_clear_error_and_the_server_goes_on(
    guarded: LogServer,
) -> None:
    good = riverbed.log.open(f"{guarded.url}?token=s3cret")
    good.create_topic("clicks", 2, schema="user_id long, flag string")
    good.create_topic("raw", 1)

    def still_serving() -> None:
        before = good.offsets("raw")[0].end
        good.producer("raw").send({"ok": True})
        assert good.offsets("raw")[0].end == before + 1

    wrong = riverbed.log.open(f"{guarded.url}?token=guess&reconnect=1")
    with pytest.raises(LogError, match="wrong or missing token"):
        wrong.topics()
    still_serving()

    with pytest.raises(TopicNotFoundError, match="riverbed topic create nope"):
        good.producer("nope")
    with pytest.raises(TopicNotFoundError):
        good.read("nope", 0)
    still_serving()

    with pytest.raises(RecordRejectedError) as rejected:
        good.producer("clicks").send_batch([{"user_id": 1, "flag": "a"}, {"user_id": "x"}])
    assert (rejected.value.index, rejected.value.field) == (1, "user_id")
    # a batch whose columns are not the topic's schema (a client with a stale view)
    records = [RawRecord(0, None, b'{"user_id": 1}', {})]
    with pytest.raises(ProtocolError, match=r"typed .*user_id long.*out of date"):
        good.storage.append("clicks", 0, records, pa.record_batch({"other": [1]}))
    still_serving()

    big = [{"pad": "x" * 1000} for _ in range(100)]
    with pytest.raises(BatchTooLargeError, match="over this server's limit of 20,000 bytes"):
        good.producer("raw").send_batch(big)
    still_serving()

    with pytest.raises(ValueError, match=r"partitions 0..1, not 7"):
        good.producer("clicks").send({"user_id": 1}, partition=7)

    # a client of another protocol version
    client = flight.connect(f"grpc+tcp://127.0.0.1:{guarded.port}")
    options = flight.FlightCallOptions(
        headers=[(b"authorization", b"Bearer s3cret"), (b"riverbed-log-protocol", b"99")]
    )
    with pytest.raises(flight.FlightServerError, match=f"speaks riverbed log protocol {PROTOCOL}"):
        list(client.do_action(flight.Action("list_topics", encode({})), options))
    # garbage where a request belongs
    options = flight.FlightCallOptions(
        headers=[
            (b"authorization", b"Bearer s3cret"),
            (b"riverbed-log-protocol", str(PROTOCOL).encode()),
        ]
    )
    with pytest.raises(flight.FlightServerError, match="not JSON"):
        list(client.do_action(flight.Action("list_topics", b"\xff"), options))
    with pytest.raises(flight.FlightServerError, match="unknown action"):
        list(client.do_action(flight.Action("drop_everything", encode({})), options))
    client.close()
    still_serving()
    assert good.offsets("raw")[0].end == 5 and sum(o.end for o in good.offsets("clicks")) == 0
    good.close()


def test_binding_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    storage = FileLogStorage(tmp_path / "log")
    with pytest.raises(LogError, match=r"without a token.*--token"):
        LogServer(storage, "0.0.0.0")
    server = LogServer(storage, "0.0.0.0", token="t")  # with one, it serves
    try:
        log = riverbed.log.open(f"flight://127.0.0.1:{server.port}?token=t")
        assert log.topics() == []
        log.close()
    finally:
        server.shutdown()


def test_a_taken_port_and_a_missing_server_are_named(log_server: LogServer) -> None:
    with pytest.raises(LogError, match=r"Address already in use.*another --port"):
        LogServer(log_server.storage, port=log_server.port)
    lost = riverbed.log.open(f"flight://127.0.0.1:{free_port()}?reconnect=0.5")
    with pytest.raises(ServerUnavailableError, match=r"cannot be reached.*riverbed log serve"):
        lost.topics()


def test_waiting_readers_are_woken_by_an_append(log_server: LogServer, tmp_path: Path) -> None:
    log = riverbed.log.open(log_server.url)
    log.create_topic("t", 2)
    woke: list[bool] = []
    waiter = threading.Thread(
        target=lambda: woke.append(log.storage.wait({("t", 0): 0, ("t", 1): 0}, 20))
    )
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # nothing to read: it waits
    log.producer("t").send({"a": 1}, partition=1)
    waiter.join(10)
    assert woke == [True]
    # a read at the end of a partition may wait for the next append (a long poll)
    remote = log.storage
    assert isinstance(remote, FlightLogStorage)
    read: list[tuple[int, RawRecord]] = []
    log.create_topic("u", 1)
    reader = threading.Thread(target=lambda: read.extend(remote.read("u", 0, 0, 10, wait=20)))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive()
    log.producer("u").send({"a": 0})
    reader.join(10)
    assert [offset for offset, _ in read] == [0]
    # a consumer's poll returns on the append, long before its timeout
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    with log.consumer(cp, "g", "t", start_from="earliest") as consumer:
        assert [r.value for r in consumer.poll(timeout=5)] == [{"a": 1}]
        threading.Timer(0.5, lambda: log.producer("t").send({"a": 2}, partition=0)).start()
        started = time.monotonic()
        got = consumer.poll(timeout=15)
        assert [r.value for r in got] == [{"a": 2}]
        assert time.monotonic() - started < 10, "poll slept through the append"
    cp.close()
    log.close()


def test_riverbed_log_serve_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "RIVERBED_HOME": str(tmp_path / "home"), "RIVERBED_LOG_TOKEN": "tok"}
    server = subprocess.Popen(
        [RIVERBED, "log", "serve", "--log", f"file://{tmp_path / 'log'}", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert "token required" in line, line
        url = line.split(" at ")[1].split()[0]
        run = {"env": env, "capture_output": True, "text": True, "timeout": 60}
        created = subprocess.run(
            [RIVERBED, "topic", "create", "clicks", "--partitions", "2", "--log", url], **run
        )
        assert created.returncode == 0, created.stderr
        produced = subprocess.run(
            [RIVERBED, "produce", "clicks", "--log", url], input='{"a": 1}\n{"a": 2}\n', **run
        )
        assert produced.returncode == 0, produced.stderr
        # the records are in the served directory, where a local reader sees them
        local = riverbed.log.open(tmp_path / "log")
        assert sorted(r.value["a"] for p in range(2) for r in local.iter_records("clicks", p)) == [
            1,
            2,
        ]
        local.close()
        refused = subprocess.run(
            [RIVERBED, "topic", "list", "--log", url],
            **{**run, "env": {**env, "RIVERBED_LOG_TOKEN": "nope"}},
        )
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: ") and "wrong or missing token" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_tls_with_a_private_ca(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    server = LogServer(FileLogStorage(tmp_path / "log"), tls=(cert.read_bytes(), key.read_bytes()))
    try:
        assert server.url.startswith("flight+tls://")
        log: Log = riverbed.log.open(f"{server.url}?ca={cert}")
        log.create_topic("t", 1)
        log.producer("t").send({"secret": 1})
        assert [r.value for r in log.read("t", 0)] == [{"secret": 1}]
        log.close()
        # a plain-text client does not get through
        plain = riverbed.log.open(f"flight://127.0.0.1:{server.port}?reconnect=0.5")
        with pytest.raises(LogError):
            plain.topics()
    finally:
        server.shutdown()


def test_a_raw_batch_of_the_wrong_shape_is_refused(log_server: LogServer) -> None:
    log = riverbed.log.open(log_server.url)
    log.create_topic("t", 1)
    client = flight.connect(f"grpc+tcp://127.0.0.1:{log_server.port}")
    options = flight.FlightCallOptions(headers=[(b"riverbed-log-protocol", str(PROTOCOL).encode())])
    descriptor = flight.FlightDescriptor.for_command(
        encode({"op": "append", "topic": "t", "partition": 0})
    )
    batch = pa.record_batch({"whatever": [1, 2]})
    writer, _ = client.do_put(descriptor, batch.schema, options)
    with pytest.raises(flight.FlightServerError, match=r"untyped.*out of date"):
        writer.write_batch(batch)
        writer.done_writing()
        writer.close()
    records = [RawRecord(1, None, b"1", {})]
    writer, acks = client.do_put(descriptor, wire_batch(records, None).schema, options)
    writer.write_batch(wire_batch(records, None))
    writer.done_writing()
    assert acks.read() is not None
    writer.close()
    assert log.offsets("t")[0].end == 1
    client.close()
    log.close()


def test_a_columnar_read_whose_fetch_breaks_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that breaks before a columnar fetch brings anything (a server gone
    away under the client) is tried again: the read returns every record, not a short
    one."""
    storage = FileLogStorage(tmp_path / "served")
    server = LogServer(storage)
    try:
        local = Log(storage)
        local.create_topic("t", 1, serde="bytes")
        local.producer("t").send_batch([b"%03d" % i for i in range(300)])
        remote = FlightLogStorage(server.url)
        replies = remote._replies
        broken: list[int] = []

        def breaks_first(*args: Any) -> Any:
            if not broken:
                broken.append(args[2])
                raise flight_storage._Broken
            return replies(*args)

        monkeypatch.setattr(remote, "_replies", breaks_first)
        columns = remote.read_columns("t", 0, 0, 300)
        assert broken == [0]
        assert columns.values.to_pylist() == [b"%03d" % i for i in range(300)]
        remote.close()
    finally:
        server.shutdown()
        storage.close()


@pytest.mark.parametrize("served", ["file", "memory"])
def test_a_fetch_is_bounded_by_bytes_and_ships_the_stored_batches(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch answers with whole stored batches up to ``max_bytes`` (at least one, so a
    reader always moves on); reads of any size are fetches in turn, equal to the local
    read — also from a storage that keeps no encoded batches (memory)."""
    storage = (
        FileLogStorage(tmp_path / "served")
        if served == "file"
        else riverbed.log.open("memory://").storage
    )
    server = LogServer(storage)
    try:
        local = Log(storage)
        local.create_topic("t", 1, serde="bytes")
        producer = local.producer("t")
        for i in range(20):  # 20 batches of 50 records of ~100 bytes
            producer.send_batch([b"%04d" % (i * 50 + j) + b"x" * 96 for j in range(50)])
        remote = FlightLogStorage(server.url)
        one = remote.fetch("t", 0, 0, 1000, max_bytes=1)
        some = remote.fetch("t", 0, 120, 1000, max_bytes=12_000)
        assert sum(len(b.body) for b in some) <= 12_000
        if served == "file":  # the batches as produced
            assert [(b.base_offset, b.count) for b in one] == [(0, 50)]
            assert [b.base_offset for b in some] == [100, 150]  # ~5.2 kB a batch
        else:  # encoded as read, as many records as fit
            assert [(b.base_offset, b.count) for b in one] == [(0, 1)]
            assert some[0].base_offset == 120 and 100 <= sum(b.count for b in some) < 120
        assert remote.fetch("t", 0, 1000, 2000) == []  # at the end: nothing, no error
        tiny = FlightLogStorage(server.url)
        monkeypatch.setattr(flight_storage, "DEFAULT_FETCH_BYTES", 6_000)
        fetches: list[int] = []
        replies = tiny._replies

        def counted(*args: Any) -> Any:
            fetches.append(args[2])  # where it starts
            return replies(*args)

        monkeypatch.setattr(tiny, "_replies", counted)
        columns = tiny.read_columns("t", 0, 25, 975)
        assert len(fetches) >= 19 and fetches == sorted(fetches)  # ~one batch a fetch
        expected = storage.read_columns("t", 0, 25, 975)
        assert columns.values.to_pylist() == expected.values.to_pylist()
        assert columns.offsets.tolist() == list(range(25, 975))
        rows = tiny.read("t", 0, 990, 100)
        assert [o for o, _ in rows] == list(range(990, 1000))
        assert rows[0][1].value == b"0990" + b"x" * 96
        remote.close()
        tiny.close()
    finally:
        server.shutdown()
        storage.close()


def test_damage_met_mid_stream_is_the_same_error_and_a_skip_reads_past_it(
    tmp_path: Path,
) -> None:
    """A fetch is streamed in chunks; a damaged batch past the first chunk still reaches
    the client as CorruptLogError naming the damage, and after ``skip`` the server reads
    past exactly it."""
    storage = FileLogStorage(tmp_path / "served")
    local = Log(storage)
    local.create_topic("t", 1, serde="bytes")
    producer = local.producer("t")
    for i in range(40):  # 40 batches of ~50 kB: a fetch of all of them takes 2+ chunks
        producer.send_batch([b"%05d" % (i * 10 + j) + b"v" * 5000 for j in range(10)])
    segment = tmp_path / "served" / "t" / "0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    pos, base = 0, 0
    for _ in range(30):  # to the 31st batch
        header = read_header(bytes(data), pos)
        assert header is not None
        pos, base = pos + header.size, header.next_offset
    data[pos + 100] ^= 0x5A
    segment.write_bytes(bytes(data))
    server = LogServer(storage)
    try:
        remote = riverbed.log.open(server.url)
        with pytest.raises(CorruptLogError) as caught:
            remote.storage.read_columns("t", 0, 0, 400)
        assert (caught.value.damage.start, caught.value.damage.end) == (base, base + 10)
        remote.storage.skip("t", 0, base, base + 10, "flipped (test)")
        columns = remote.storage.read_columns("t", 0, 0, 400)
        assert columns.offsets.tolist() == [o for o in range(400) if not base <= o < base + 10]
        assert columns.values[-1].as_py() == b"00399" + b"v" * 5000
        remote.close()
    finally:
        server.shutdown()
        storage.close()
