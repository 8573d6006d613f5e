"""Where a remote fetch's CPU goes, against a bare Arrow Flight transport, same run.

    .venv/bin/python benchmarks/log_transport.py [--records 200000] [--calls 40]

One topic of 100-byte records (``benchmarks/log.py``'s payloads), read 50,000 records a
call, one call at a time, three ways:

* **local** — ``read_columns`` on the log files (the baseline of ``benchmarks/log.py``);
* **riverbed server** — ``read_columns`` through ``riverbed log serve`` over loopback:
  the client's CPU and the server process's CPU per call;
* **bare Flight** — a pyarrow Flight server with nothing of riverbed in it, returning
  a pre-built table of the same number of bytes (no file reads, no checks): the floor
  of the transport alone, client and server.

Prints CPU milliseconds per call and the bound they put on the remote/local throughput
ratio when clients and server share all cores (local CPU / remote CPU per call).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

import riverbed.log
from log import payloads  # benchmarks/log.py, beside this script

PER_CALL = 50_000
CHUNK_BYTES = 1 << 20  # what the riverbed server streams a fetch in


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(call: Callable[[], Any], calls: int, server: int | None) -> tuple[float, float]:
    """CPU ms per call of this process and of ``server`` (after two warm-up calls)."""
    call()
    call()
    s0 = cpu_of(server) if server else 0.0
    c0 = time.process_time()
    for _ in range(calls):
        call()
    s1 = cpu_of(server) if server else 0.0
    return (time.process_time() - c0) * 1000 / calls, (s1 - s0) * 1000 / calls


class Bare(flight.FlightServerBase):  # type: ignore[misc]
    """Returns the same pre-built table on every DoGet."""

    def __init__(self, location: str, size: int) -> None:
        super().__init__(location)
        data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
        batches = []
        for start in range(0, size, CHUNK_BYTES):
            piece = data[start : start + CHUNK_BYTES]
            offsets = pa.py_buffer(np.array([0, len(piece)], np.int32))
            body = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(piece)])
            batches.append(pa.RecordBatch.from_arrays([body], ["body"]))
        self.table = pa.Table.from_batches(batches)

    def do_get(self, context: Any, ticket: Any) -> flight.RecordBatchStream:
        return flight.RecordBatchStream(self.table)


def serve_bare(size: int) -> None:
    server = Bare("grpc+tcp://127.0.0.1:0", size)
    print(server.port, flush=True)
    server.serve()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        serve_bare(args.bare_server)
        return
    root = Path(tempfile.mkdtemp())
    url = f"file://{root / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("t", 1, serde="bytes", fsync="never")
    producer = log.producer("t")
    values = payloads(args.records)
    for i in range(0, len(values), 1000):
        producer.send_batch(values[i : i + 1000])
    size = log.storage.size("t", 0) * PER_CALL // args.records  # bytes of one call
    log.close()
    starts = list(range(0, args.records - PER_CALL + 1, PER_CALL))

    def reader(u: str) -> Callable[[], Any]:
        opened = riverbed.log.open(u)
        at = iter(range(10**9))

        def call() -> Any:
            start = starts[next(at) % len(starts)]
            return opened.storage.read_columns("t", 0, start, start + PER_CALL)

        return call

    rows: list[tuple[str, float, float]] = []
    local_ms, _ = measure(reader(url), args.calls, None)
    rows.append(("local read_columns", local_ms, 0.0))
    exe = str(Path(sys.executable).with_name("riverbed"))
    cmd = [exe, "log", "serve", "--port", "0", "--log", url]
    served = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert served.stdout is not None
        remote = served.stdout.readline().split(" at ")[1].split()[0]
        rows.append(("riverbed server", *measure(reader(remote), args.calls, served.pid)))
    finally:
        served.terminate()
        served.wait()
    bare_cmd = [sys.executable, __file__, "--bare-server", str(size)]
    bare = subprocess.Popen(bare_cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout is not None
        client = flight.connect(f"grpc+tcp://127.0.0.1:{int(bare.stdout.readline())}")
        ticket = flight.Ticket(b"get")
        rows.append(
            (
                "bare Flight",
                *measure(lambda: client.do_get(ticket).read_all(), args.calls, bare.pid),
            )
        )
    finally:
        bare.kill()
        bare.wait()
    print(f"\n{PER_CALL:,} records ({size / 1e6:.1f} MB) a call, CPU ms per call")
    print(f"{'path':22} {'client':>8} {'server':>8} {'total':>8} {'local / total':>14}")
    for name, client_ms, server_ms in rows:
        total = client_ms + server_ms
        print(f"{name:22} {client_ms:8.2f} {server_ms:8.2f} {total:8.2f} {local_ms / total:13.2f}x")
    # a remote client decodes what a local reader decodes; say the rest of the local
    # read is free remotely, and the server and transport cost only the bare floor
    floor = rows[2][1] + rows[2][2]
    print(
        "\nbound on remote/local with every core busy, were riverbed's remote path only "
        f"the local read plus the bare transport: {local_ms / (local_ms + floor):.2f}x"
    )


if __name__ == "__main__":
    main()
