"""The log server SIGKILLed under load and started again: producers and a reader in other
processes carry on by themselves; no acknowledged record is lost, none is written twice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import riverbed.log
from riverbed.testing import free_port, log_server_process

pytestmark = pytest.mark.slow
PROCS = Path(__file__).with_name("procs.py")


def test_server_killed_under_load_loses_and_duplicates_nothing(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    path, port = tmp_path / "log", free_port()
    riverbed.log.open(path).create_topic("events", 3)
    acked: list[tuple[str, int, int, int, int]] = []  # writer, partition, base, count, seq
    unknown: list[tuple[str, int, int]] = []  # writer, count, first seq
    lock = threading.Lock()

    strange: list[str] = []  # stdout lines that are not acknowledgements

    def collect(writer: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.endswith("\n"):  # cut off by the SIGKILL that ends the producer
                break
            if len(line.split()) != 4:
                strange.append(line)
                continue
            p, base, count, seq = line.split()
            with lock:
                if p == "?":
                    unknown.append((writer, int(count), int(seq)))
                else:
                    acked.append((writer, int(p), int(base), int(count), int(seq)))

    def acks() -> int:
        with lock:
            return len(acked)

    def fewest() -> int:
        """Acknowledgements of the producer that has had the fewest."""
        with lock:
            return min(sum(1 for a in acked if a[0] == w) for w in ("w0", "w1"))

    servers = log_server_process(path, port)
    url = servers.__enter__()
    tailed: dict[int, list[tuple[str, int]]] = {p: [] for p in range(3)}
    tail_errors: list[BaseException] = []
    stop = threading.Event()

    def tail() -> None:
        """A reader through the server, across its death: wait, read, repeat."""
        remote = riverbed.log.open(f"{url}?reconnect=60")
        positions = dict.fromkeys(range(3), 0)
        try:
            while not stop.is_set():
                remote.storage.wait({("events", p): o for p, o in positions.items()}, 0.5)
                for p in range(3):
                    for record in remote.read("events", p, positions[p], 500):
                        tailed[p].append((record.value["w"], record.value["seq"]))
                        positions[p] = record.offset + 1
        except BaseException as exc:
            tail_errors.append(exc)

    tailer = threading.Thread(target=tail)
    tailer.start()
    producers = [
        subprocess.Popen(
            [sys.executable, str(PROCS), f"{url}?reconnect=60", f"w{i}", "50"],
            stdout=subprocess.PIPE,
            text=True,
            env=subprocess_env,
        )
        for i in range(2)
    ]
    readers = [threading.Thread(target=collect, args=(f"w{i}", p)) for i, p in enumerate(producers)]
    for t in readers:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while fewest() < 20 and time.monotonic() < deadline:  # both, on a busy machine too
            time.sleep(0.05)
        assert fewest() >= 20, "the producers never got going"
        servers.__exit__(None, None, None)  # SIGKILL, mid-stream
        before = acks()
        with lock:
            at_kill = {w: max(s for x, _, _, _, s in acked if x == w) for w in ("w0", "w1")}
        time.sleep(1.0)
        assert acks() <= before + 2, "acknowledgements while the server was down"
        servers = log_server_process(path, port)
        servers.__enter__()

        def resumed() -> bool:
            """Each producer acknowledged past where it was at the kill (one may sit in
            its reconnect back-off, up to 1 s, while the other has already sent 40)."""
            with lock:
                return all(
                    any(w == x and s > at_kill[x] for w, _, _, _, s in acked) for x in at_kill
                )

        deadline = time.monotonic() + 60
        while (acks() < before + 40 or not resumed()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert acks() >= before + 40, "the producers did not resume after the restart"
    finally:
        for proc in producers:
            proc.kill()
            proc.wait()
        for t in readers:
            t.join(10)
        time.sleep(1.0)  # let the tailer catch up before the server goes
        stop.set()
        tailer.join(30)
        servers.__exit__(None, None, None)

    log = riverbed.log.open(path)
    stored: dict[tuple[str, int], tuple[int, int]] = {}  # (writer, seq) -> (partition, offset)
    for p in range(3):
        for record in log.iter_records("events", p):
            key = (record.value["w"], record.value["seq"])
            assert key not in stored, f"{key} written twice: {stored[key]} and {p}@{record.offset}"
            stored[key] = (p, record.offset)
    for writer, p, base, count, seq in acked:  # every acknowledged record, where it was acked
        for i in range(count):
            assert stored.get((writer, seq + i)) == (p, base + i), f"lost {writer} #{seq + i}"
    acked_keys = {(w, s + i) for w, _, _, n, s in acked for i in range(n)}
    maybe = {(w, s + i) for w, n, s in unknown for i in range(n)}
    last = {w: max(s + n for x, _, _, n, s in acked if x == w) for w in ("w0", "w1")}
    in_flight = {k for k in stored if k[1] >= last[k[0]]}  # sent as the producers were killed
    assert set(stored) - in_flight <= acked_keys | maybe, "records nobody sent"
    assert all(len({s for w, s in in_flight if w == x}) <= 50 for x in last)  # one batch each
    for writer, last in at_kill.items():  # each producer resumed by itself
        assert any(w == writer and s > last for w, _, _, _, s in acked), f"{writer} stopped"
    assert strange == [], strange  # a producer's stdout carries acknowledgements only
    # the reader tailed through the restart: each partition in order, nothing twice
    assert not tail_errors, tail_errors
    for p in range(3):
        expected = [key for key, (q, _) in sorted(stored.items(), key=lambda kv: kv[1]) if q == p]
        assert tailed[p] == expected[: len(tailed[p])]
    assert sum(len(t) for t in tailed.values()) >= len(acked_keys) // 2
