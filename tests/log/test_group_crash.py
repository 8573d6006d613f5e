"""Three consumer processes, one SIGKILLed mid-stream: survivors take over, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import riverbed.log
from riverbed.control import EventType, connect
from riverbed.testing import log_server_process
from tests.control.conftest import backend_url

pytestmark = pytest.mark.slow
PROCS = Path(__file__).with_name("procs.py")
N, PARTITIONS, KEYS = 3000, 6, 30


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("etcd+server", marks=pytest.mark.etcd),
    ]
)
def route(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(control plane URL, where members reach the log): the log directory, or — for
    "etcd+server" — only a log server's URL (members never see the directory)."""
    control = backend_url(request.param.split("+")[0], tmp_path, request)
    if not request.param.endswith("+server"):
        yield control, str(tmp_path / "log")
        return
    with log_server_process(tmp_path / "log") as url:
        yield control, url


def processed(outs: list[Path]) -> list[tuple[int, int, str, int, int]]:
    """(partition, offset, key, seq, time_ns) of every processed record."""
    rows = []
    for out in outs:
        if out.exists():
            for line in out.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5:  # a line cut by SIGKILL is ignored
                    p, o, k, s, t = parts
                    rows.append((int(p), int(o), k, int(s), int(t)))
    return rows


def test_killed_consumer_is_replaced_and_every_record_processed(
    tmp_path: Path, route: tuple[str, str], subprocess_env: dict[str, str]
) -> None:
    control_url, where = route
    log = riverbed.log.open(tmp_path / "log")
    log.create_topic("events", PARTITIONS)
    seq: dict[str, int] = {}
    values = []
    for i in range(N):
        k = f"key{i % KEYS}"
        seq[k] = seq.get(k, -1) + 1
        values.append({"k": k, "seq": seq[k]})
    log.producer("events").send_batch(values, key_field="k")

    # watch committed offsets: they must never go backwards
    group = f"workers{uuid.uuid4().hex[:8]}"  # the etcd server is shared by the run
    group_prefix = f"riverbed/loggroup/{group}/offset/"
    cp = connect(control_url)
    commits: dict[str, list[int]] = {}
    stop = threading.Event()

    def watch_commits() -> None:
        with cp.watch(group_prefix, prefix=True) as watch:
            while not stop.is_set():
                event = watch.get(timeout=0.2)
                if event is not None and event.type is EventType.PUT:
                    commits.setdefault(event.kv.key.decode(), []).append(
                        json.loads(event.kv.value)["offset"]
                    )

    watcher = threading.Thread(target=watch_commits)
    watcher.start()
    outs = [tmp_path / f"out{i}.txt" for i in range(3)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(PROCS),
                "consume",
                where,
                control_url,
                f"c{i}",
                str(outs[i]),
                group,
            ],
            env=subprocess_env,
        )
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(processed(outs)) < N // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the victim: the member that processed the most so far (on a loaded machine one
        # may not even be up yet while the others process the third awaited here)
        counts = [len(processed([out])) for out in outs]
        victim = counts.index(max(counts))
        assert counts[victim] > 0, "no member processed anything"
        procs[victim].kill()
        procs[victim].wait()
        # what was left when the kill landed: a partition the victim had already finished
        # has nothing for a survivor to take over (on a fast machine it may finish one)
        at_kill = {(p, o) for p, o, *_ in processed(outs)}
        left = {
            p
            for p in range(PARTITIONS)
            if any((p, o) not in at_kill for o in range(log.storage.offsets("events", p)[1]))
        }
        assert left, "the kill landed after every record was processed"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = {(p, o) for p, o, *_ in processed(outs)}
            if len(done) == N:
                break
            time.sleep(0.1)
        rows = processed(outs)
        done = {(p, o) for p, o, *_ in rows}
        assert len(done) == N, f"only {len(done)} of {N} records were processed"
        # survivors took over the victim's partitions: every partition with records left
        # at the kill was processed on by a survivor
        after_kill = processed([out for i, out in enumerate(outs) if i != victim])
        assert left <= {p for p, *_ in after_kill}
        # per key, records are first processed in the order they were produced,
        # across members and across the takeover
        first_seen: dict[str, list[int]] = {}
        seen: set[tuple[int, int]] = set()
        for p, o, k, s, _ in sorted(rows, key=lambda row: row[4]):
            if (p, o) not in seen:
                seen.add((p, o))
                first_seen.setdefault(k, []).append(s)
        assert len(first_seen) == KEYS
        for key, key_seqs in first_seen.items():
            assert key_seqs == sorted(key_seqs), f"{key} processed out of order"
    finally:
        stop.set()
        watcher.join()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        cp.close()
    assert commits, "no commits observed"
    for key, offsets in commits.items():
        assert offsets == sorted(offsets), f"committed offset went backwards on {key}"
