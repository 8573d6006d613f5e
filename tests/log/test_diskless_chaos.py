"""Issue 31's chaos scenario: three log servers of one diskless topic (6 partitions, in
the tests' S3 server, offsets in etcd), two producers and a consumer group of three.
Each server is SIGKILLed twice at random moments, its directory deleted, and started
again; the S3 server is stopped for 20 s once. At the end every acknowledged record is
where its producer was told, nothing is in the topic twice, and the group has consumed
everything exactly once by its committed offsets, each partition in order."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import riverbed.log
from riverbed.control import connect
from riverbed.log.group.consumer import describe_group
from tests.log.servers import Server

pytestmark = pytest.mark.slow

PARTITIONS = 6

PRODUCER = """
import os
import sys
import riverbed.log
log = riverbed.log.open(sys.argv[1])
producer = log.producer("chaos")
i = 0
while not os.path.exists(sys.argv[3]):  # until the chaos is over
    meta = producer.send({"w": sys.argv[2], "i": i}, key=f"{sys.argv[2]}-{i % 40}")
    print(meta.partition, meta.offset, i, flush=True)  # acknowledged
    i += 1
print("done", flush=True)
"""

CONSUMER = """
import sys
import riverbed.log
from riverbed.control import connect
log = riverbed.log.open(sys.argv[1])
out = open(sys.argv[4], "a")
def handle(record):
    out.write(f"{record.partition} {record.offset} {record.value['w']} {record.value['i']}\\n")
    out.flush()
with log.consumer(connect(sys.argv[2]), "chaos", "chaos", member_id=sys.argv[3],
                  session_ttl=10) as consumer:
    consumer.run(handle, max_records=50)
"""


def test_three_servers_killed_twice_each_and_s3_stopped_lose_and_duplicate_nothing(
    tmp_path: Path,
    s3_server: Any,
    s3_url: str,
    etcd_server: Any,
    subprocess_env: dict[str, str],
) -> None:
    control = etcd_server.url
    env = {**subprocess_env, "RIVERBED_CONTROL": control}
    admin = riverbed.log.open(s3_url, control=control)
    admin.create_topic("chaos", PARTITIONS)
    servers = [Server(tmp_path / f"server-{n}", s3_url, env) for n in range(3)]
    for server in servers:
        server.start()
    url = "flight://" + ",".join(f"127.0.0.1:{s.port}" for s in servers) + "?reconnect=120"
    scripts = tmp_path / "producer.py", tmp_path / "consumer.py"
    scripts[0].write_text(PRODUCER)
    scripts[1].write_text(CONSUMER)
    producers = {
        w: subprocess.Popen(
            [sys.executable, str(scripts[0]), url, w, str(tmp_path / "stop")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for w in ("a", "b")
    }  # fmt: skip
    consumers = [
        subprocess.Popen(
            [sys.executable, str(scripts[1]), url, control, f"c{n}", str(tmp_path / f"c{n}")],
            env=env, stderr=subprocess.DEVNULL,
        )
        for n in range(3)
    ]  # fmt: skip
    rng = random.Random(31)
    gateway_down = False
    try:
        # six kills (each server twice), one at a time, and the S3 server down for 20 s
        plan = [servers[n] for n in (0, 1, 2, 0, 1, 2)]
        rng.shuffle(plan)
        for k, server in enumerate(plan):
            time.sleep(rng.uniform(1.0, 4.0))
            server.kill()
            if k == 2:
                s3_server.stop_gateway()
                gateway_down = True
                time.sleep(20)
                s3_server.start_gateway()
                gateway_down = False
            time.sleep(rng.uniform(0.0, 1.0))
            server.start()
        # the producers ran through all of it
        assert all(proc.poll() is None for proc in producers.values())
        (tmp_path / "stop").touch()
        acked: dict[tuple[int, int], tuple[str, int]] = {}
        for w, proc in producers.items():
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-2000:]
            assert out.rstrip().endswith("done")
            for line in out.splitlines()[:-1]:
                p, o, i = line.split()
                acked[(int(p), int(o))] = (w, int(i))
        assert len(acked) > 50, f"only {len(acked)} records acknowledged"

        # the topic: every acknowledged record where its producer was told, nothing twice
        ends = [o.end for o in admin.offsets("chaos")]
        stored = {}
        for p in range(PARTITIONS):
            records = admin.read("chaos", p, 0, 100_000)
            assert [r.offset for r in records] == list(range(ends[p]))
            for r in records:
                stored[(p, r.offset)] = (r.value["w"], r.value["i"])
        assert stored == acked, "a record lost, moved, or written twice"

        # the group: committed offsets reach every end; each record consumed once
        plane = connect(control)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = describe_group(admin, plane, "chaos")
            if [s.committed for s in state.partitions] == ends:
                break
            time.sleep(0.5)
        assert [s.committed for s in state.partitions] == ends
        consumed: list[tuple[int, int]] = []
        for n in range(3):
            path = tmp_path / f"c{n}"
            lines = path.read_text().splitlines() if path.exists() else []
            mine = [tuple(int(x) for x in line.split()[:2]) for line in lines]
            for p in range(PARTITIONS):  # each partition in order, within a member
                offsets = [o for q, o in mine if q == p]
                assert offsets == sorted(offsets)
            consumed += mine
        assert sorted(consumed) == sorted(acked), "a record consumed twice or never"
    finally:
        for proc in [*producers.values(), *consumers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for server in servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()
        if gateway_down:
            s3_server.start_gateway()
        admin.close()
