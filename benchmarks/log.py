"""Event-log throughput for 100-byte records, against the raw disk in the same run.

    .venv/bin/python benchmarks/log.py [--records 300000]

Baseline: the same payload bytes written with plain buffered file writes (one
fsync at the end) and read back in 1 MB chunks — what the disk and page cache give
a process that does nothing else. riverbed rows:

* produce, per-record API (``send``: one append, one lock, one write per record);
* produce, batch API (``send_batch`` of 1,000), fsync never / fsync every batch;
* consume with ``Log.read`` (sequential scan) and with a consumer group (``poll``,
  memory control plane, commits every poll).

Then typed vs JSON topics, same events (``user_id long, flag string, ts timestamp``),
same run: produce with ``send_batch(1000)``, read back as dicts (``Log.read``), and
read as Arrow columns of the fields (what the Spark source hands Spark: a typed
topic's stored columns; a JSON topic's values parsed by ``pyarrow.json``, the fastest
JSON path riverbed has).

Then remote vs local, same run: a ``riverbed log serve`` in its own process over
loopback (``flight://``) against the same file paths opened directly — batch produce
(``send_batch(1000)``, fsync never) and columnar fetch (``read_columns``), with one and
with four client processes (each on its own partition; each makes one call first —
connected to the server, or its files found — and is timed from then on); and how soon
a consumer sees a record after its producer's acknowledgement (p50/p99 over
single-record sends), through the server (woken by the append) vs a consumer of the
local files (which polls). ``--only remote`` runs just that section.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import riverbed.log
from riverbed.control import connect
from riverbed.testing import log_server_process

RECORD = 100


def payloads(n: int) -> list[bytes]:
    base = os.urandom(RECORD * 64)
    return [base[(i % 64) * RECORD : (i % 64 + 1) * RECORD] for i in range(n)]


def raw_disk(root: Path, values: list[bytes]) -> tuple[float, float]:
    path = root / "raw.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for value in values:
            f.write(value)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    read_s = time.perf_counter() - start
    return len(values) / write_s, len(values) / read_s


def produce_per_record(root: Path, values: list[bytes]) -> float:
    log = riverbed.log.open(root / "per-record")
    log.create_topic("t", 1, serde="bytes", fsync="never")
    producer = log.producer("t")
    start = time.perf_counter()
    for value in values:
        producer.send(value)
    rate = len(values) / (time.perf_counter() - start)
    log.close()
    return rate


def produce_batches(root: Path, values: list[bytes], fsync: str) -> tuple[float, riverbed.log.Log]:
    log = riverbed.log.open(root / f"batch-{fsync}")
    log.create_topic("t", 1, serde="bytes", fsync=fsync)  # type: ignore[arg-type]
    producer = log.producer("t")
    start = time.perf_counter()
    for i in range(0, len(values), 1000):
        producer.send_batch(values[i : i + 1000])
    return len(values) / (time.perf_counter() - start), log


def consume_read(log: riverbed.log.Log, n: int, topic: str = "t") -> float:
    start = time.perf_counter()
    count, offset = 0, 0
    while True:
        records = log.read(topic, 0, offset, 5000)
        if not records:
            break
        count += len(records)
        offset = records[-1].offset + 1
    assert count == n
    return n / (time.perf_counter() - start)


def consume_columns(log: riverbed.log.Log, n: int) -> float:
    """The columnar read the Spark source and the stream engine use (Arrow arrays)."""
    start = time.perf_counter()
    count = 0
    for offset in range(0, n, 50_000):
        count += len(log.storage.read_columns("t", 0, offset, min(offset + 50_000, n)))
    assert count == n
    return n / (time.perf_counter() - start)


def consume_group(log: riverbed.log.Log, n: int) -> float:
    cp = connect("memory://")
    start = time.perf_counter()
    count = 0
    with log.consumer(cp, "bench", "t", session_ttl=10) as consumer:
        while count < n:
            count += len(consumer.poll(timeout=1.0, max_records=5000))
    return n / (time.perf_counter() - start)


TYPED = "user_id long, flag string, ts timestamp"


def events(n: int) -> list[dict[str, object]]:
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 11, 23, tzinfo=UTC)
    return [
        {
            "user_id": (i * 7919) % 500_000,
            "flag": f"f{i % 50:02d}",
            "ts": t0 + timedelta(milliseconds=i),
        }
        for i in range(n)
    ]


def typed_vs_json(root: Path, n: int) -> list[tuple[str, float, float]]:
    """(path, typed records/s, JSON records/s)."""
    import pyarrow as pa
    import pyarrow.json as pj

    from riverbed.spark.values import newline_joined

    dicts = events(n)
    as_json = [{**e, "ts": e["ts"].isoformat()} for e in dicts]  # type: ignore[attr-defined]
    fields = pa.schema(
        [("user_id", pa.int64()), ("flag", pa.string()), ("ts", pa.timestamp("us", "UTC"))]
    )
    out: dict[str, dict[str, float]] = {}
    for kind, values in (("typed", dicts), ("json", as_json)):
        log = riverbed.log.open(root / f"events-{kind}")
        log.create_topic("e", 1, fsync="never", schema=TYPED if kind == "typed" else None)
        producer = log.producer("e")
        start = time.perf_counter()
        for i in range(0, n, 1000):
            producer.send_batch(values[i : i + 1000])
        rates = {"produce send_batch(1000)": n / (time.perf_counter() - start)}
        rates["read Log.read (dicts)"] = consume_read(log, n, "e")
        start = time.perf_counter()
        count = 0
        for offset in range(0, n, 50_000):
            columns = log.storage.read_columns("e", 0, offset, min(offset + 50_000, n))
            if kind == "typed":
                table = pa.Table.from_struct_array(columns.values)
            else:
                table = pj.read_json(
                    pa.BufferReader(newline_joined(columns.values)),
                    parse_options=pj.ParseOptions(explicit_schema=fields),
                )
            count += table.num_rows
        assert count == n
        rates["read columns of the fields (Arrow)"] = n / (time.perf_counter() - start)
        out[kind] = rates
        log.close()
    return [(name, out["typed"][name], out["json"][name]) for name in out["typed"]]


def _client(kind: str, url: str, partition: int, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One client process: produce ``n`` records to its own topic, or fetch them."""
    log = riverbed.log.open(url)
    log.storage.offsets(f"t{partition}", 0)  # connected (a server) / files found (local)
    start = time.perf_counter()
    if kind == "produce":
        producer = log.producer(f"t{partition}")
        values = payloads(n)
        for i in range(0, n, 1000):
            producer.send_batch(values[i : i + 1000])
    else:
        count = 0
        for offset in range(0, n, 50_000):
            stop = min(offset + 50_000, n)
            count += len(log.storage.read_columns(f"t{partition}", 0, offset, stop))
        assert count == n, (count, n)
    out.put(time.perf_counter() - start)
    log.close()


def _clients(kind: str, url: str, clients: int, n: int) -> float:
    """Records/s of ``clients`` processes together (each ``n // clients`` records)."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    each = n // clients
    procs = [ctx.Process(target=_client, args=(kind, url, p, each, out)) for p in range(clients)]
    for proc in procs:
        proc.start()
    elapsed = max(out.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    return each * clients / elapsed


def _visible_after_ack(url: str, sends: int) -> list[float]:
    """Seconds from a send's acknowledgement to a group consumer returning the record."""
    log = riverbed.log.open(url)
    log.create_topic("lat", 1)
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    cp = connect("memory://")
    with log.consumer(cp, "lat", "lat") as consumer:
        consumer.poll(timeout=0.5)  # joined, owns the partition

        def consume() -> None:
            while len(seen) < sends:
                for record in consumer.poll(timeout=1.0):
                    seen[record.value["i"]] = time.perf_counter()

        reader = threading.Thread(target=consume)
        reader.start()
        producer = log.producer("lat")
        for i in range(sends):
            producer.send({"i": i})
            acked[i] = time.perf_counter()
            time.sleep(0.01)
        reader.join(60)
    log.close()
    return sorted(max(0.0, seen[i] - acked[i]) for i in range(sends))


def remote_vs_local(root: Path, n: int, sends: int) -> tuple[list[tuple[str, float, float]], Any]:
    """(path, remote records/s, local records/s), and the visibility latencies."""
    local_url = f"file://{root / 'served'}"
    served = riverbed.log.open(local_url)
    for i in range(4):  # a topic per client: clients do not share a partition's lock
        served.create_topic(f"t{i}", 1, serde="bytes", fsync="never")
    served.close()
    with log_server_process(local_url) as remote_url:
        # warm the server up (its first fetch costs ~0.5-1 s of one-off start-up)
        _clients("produce", remote_url, 1, 2000)
        _clients("fetch", remote_url, 1, 2000)
        rows = []
        for clients in (1, 4):
            remote = _clients("produce", remote_url, clients, n)
            local = _clients("produce", local_url, clients, n)
            rows.append((f"produce send_batch(1000), {clients} client(s)", remote, local))
            rows.append(
                (
                    f"fetch read_columns, {clients} client(s)",
                    _clients("fetch", remote_url, clients, n),
                    _clients("fetch", local_url, clients, n),
                )
            )
        latency = {
            "remote (woken by the append)": _visible_after_ack(remote_url, sends),
            "local files (consumer polls)": _visible_after_ack(f"file://{root / 'lat'}", sends),
        }
    return rows, latency


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--per-record", type=int, default=30_000)
    parser.add_argument("--events", type=int, default=200_000, help="for typed vs JSON")
    parser.add_argument("--remote", type=int, default=2_000_000, help="for remote vs local")
    parser.add_argument("--sends", type=int, default=300, help="for visibility latency")
    parser.add_argument(
        "--only", choices=["remote"], help="run only this section (the log server's)"
    )
    args = parser.parse_args()
    if args.only == "remote":
        with tempfile.TemporaryDirectory() as tmp:
            print_remote(args, *remote_vs_local(Path(tmp), args.remote, args.sends))
        return
    values = payloads(args.records)
    mb = RECORD / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw_w, raw_r = raw_disk(root, values)
        rows = [
            ("raw buffered write (baseline)", raw_w, raw_w),
            ("raw sequential read (baseline)", raw_r, raw_r),
        ]
        rows.append(
            (
                "produce send() per record",
                produce_per_record(root, values[: args.per_record]),
                raw_w,
            )
        )
        rate, log_never = produce_batches(root, values, "never")
        rows.append(("produce send_batch(1000), fsync never", rate, raw_w))
        rate, log_batch = produce_batches(root, values, "batch")
        rows.append(("produce send_batch(1000), fsync batch", rate, raw_w))
        rows.append(("consume Log.read", consume_read(log_never, args.records), raw_r))
        rows.append(
            ("consume storage.read_columns", consume_columns(log_never, args.records), raw_r)
        )
        rows.append(("consume group poll()", consume_group(log_never, args.records), raw_r))
        log_never.close()
        log_batch.close()
        typed = typed_vs_json(root, args.events)
        remote_rows, latency = remote_vs_local(root, args.remote, args.sends)
    print(f"{'path':40} {'records/s':>12} {'MB/s':>8} {'vs baseline':>12}")
    for name, rate, base in rows:
        print(f"{name:40} {rate:12,.0f} {rate * mb:8.1f} {rate / base:11.3f}x")
    print(f"\n{args.events:,} events ({TYPED}), typed vs JSON topic")
    print(f"{'path':40} {'typed rec/s':>12} {'JSON rec/s':>12} {'typed/JSON':>11}")
    for name, t_rate, j_rate in typed:
        print(f"{name:40} {t_rate:12,.0f} {j_rate:12,.0f} {t_rate / j_rate:10.2f}x")
    print_remote(args, remote_rows, latency)


def print_remote(args: argparse.Namespace, remote_rows: list[Any], latency: dict[str, Any]) -> None:
    print(f"\n{args.remote:,} records of {RECORD} bytes, log server over loopback vs local files")
    print(f"{'path':40} {'remote rec/s':>12} {'local rec/s':>12} {'remote/local':>13}")
    for name, r_rate, l_rate in remote_rows:
        print(f"{name:40} {r_rate:12,.0f} {l_rate:12,.0f} {r_rate / l_rate:12.2f}x")
    print(f"\nrecord visible to a consumer after its acknowledgement ({args.sends} sends)")
    for name, waits in latency.items():
        p50, p99 = waits[len(waits) // 2], waits[int(len(waits) * 0.99)]
        print(f"{name:40} p50 {p50 * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
