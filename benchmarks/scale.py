"""Streaming at scale: events produced while the aggregation runs, one driver restart,
memory and state per quarter, and the result against DuckDB's exact answer.

    .venv/bin/python benchmarks/scale.py                      # 20M events (a few minutes)
    .venv/bin/python benchmarks/scale.py --events 200000000 --users 60000000   # the full run

Events: ``--events`` over 7 days of event time, flags Zipf-skewed over 50, users uniform
over ``--users`` (60M users give ~58M distinct in 200M events), produced in ``--chunks``
time-ordered chunks into a 4-partition typed topic keyed by flag — as Arrow tables, the
producer's columnar path — by this process **while** ``riverbed stream run`` (a separate
driver process, ``local[2]``, ``--max-records-per-batch``) aggregates exact distinct users
and a count per flag per hour. Closed windows stay in state (``keep_closed`` 30 days), so
state grows with the run. When half the events are committed the driver is SIGKILLed
(its whole process group: JVM and Python workers) and started again.

Per quarter of the events (by committed input) it prints: events/s, the RSS of the
driver's process tree (JVM + Python) and of its largest Python worker, the local state's
size on disk, and batch duration p50/p99. At the end: every window and key of the result
table against DuckDB's exact answer over the same events (each chunk is also written as
Parquet), and the committed input against the events produced (exactly once through the
restart).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import riverbed.log
from riverbed.state.provider import STAGING
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results

SCHEMA = "user_id long, flag string, ts timestamp"
T0_US = 1_795_132_800_000_000  # 2026-11-20T00:00Z
DAY_US = 86_400_000_000
FLAGS = np.array([f"f{i:02d}" for i in range(50)])
SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

aggregation = Aggregation(
    name="scale", key="flag", time="ts", window=Tumbling("1h"), watermark="6h",
    keep_closed="30d", metrics={"users": Distinct("user_id"), "events": Count()},
    state_partitions=4,
)
source = {"topic": "clicks", "schema": "user_id long, flag string, ts timestamp"}
"""


def chunk(c: int, chunks: int, events: int, users: int, days: int) -> pa.Table:
    """Chunk ``c``: its share of the events, in time order over its slice of the days."""
    rng = np.random.default_rng(1000 + c)
    n = events // chunks + (1 if c < events % chunks else 0)
    span = days * DAY_US // chunks
    ts = np.sort(rng.integers(T0_US + c * span, T0_US + (c + 1) * span, n))
    flags = (rng.zipf(1.3, n) - 1) % len(FLAGS)
    return pa.table(
        {
            "user_id": pa.array(rng.integers(0, users, n), pa.int64()),
            "flag": pa.array(FLAGS[flags]),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
        }
    )


def produce(args: argparse.Namespace, url: str, parquet: Path, done: threading.Event) -> None:
    """Every chunk into the topic (100k-row sends) and into a Parquet file."""
    log = riverbed.log.open(url)
    producer = log.producer("clicks")
    try:
        for c in range(args.chunks):
            table = chunk(c, args.chunks, args.events, args.users, args.days)
            pq.write_table(table, parquet / f"part-{c:04d}.parquet")
            for start in range(0, len(table), 100_000):
                producer.send_batch(table.slice(start, 100_000), key_field="flag")
    finally:
        log.close()
        done.set()


# -- the driver's process tree -----------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss(root: int) -> tuple[float, float]:
    """RSS of ``root`` and all its descendants, and of the largest Python process among
    them other than ``root`` (a Spark Python worker), in MB."""
    tree, stack, total, worker = _children(), [root], 0.0, 0.0
    while stack:
        pid = stack.pop()
        rss = _rss_mb(pid)
        total += rss
        if pid != root:
            try:
                if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    worker = max(worker, rss)
            except OSError:
                pass
        stack.extend(tree.get(pid, []))
    return total, worker


def du_mb(path: Path) -> float:
    """The local state's bytes in MB: every file of its databases once (a hard link is one
    file, as ``du`` counts), without ``STAGING`` (``.snapshots/``) — a snapshot being uploaded is a
    RocksDB checkpoint there, hard links to the database's own files (counted twice by a
    plain sum), or to files compaction has since replaced (bytes on disk that are no
    longer state). Files and folders that vanish meanwhile are skipped."""
    total, seen = 0, set()
    for folder, dirs, files in os.walk(path):  # os.walk skips what it cannot list
        if Path(folder) == path:
            dirs[:] = [d for d in dirs if d != STAGING]
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total / 1e6


# -- the run -----------------------------------------------------------------------------


def start_driver(spec: Path, env: dict[str, str], per_batch: int, log: Path) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
         "--max-records-per-batch", str(per_batch), "--ttl", "4"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),
        start_new_session=True,
    )  # fmt: skip


class Ledger:
    """What the driver has committed: the running input total (the newest committed
    record's ``totals``) and every committed batch's input and duration, collected as
    they appear (retention deletes records older than 100 versions)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.batches: dict[int, tuple[int, float]] = {}  # batch → (input, duration ms)
        self.total = 0

    def poll(self) -> int:
        if not self.checkpoint.exists():
            return 0
        records = open_batches(self.checkpoint)
        for b in records.ids():
            if b in self.batches:
                continue
            r = records.get(b)
            if r is None or not r.done:
                continue
            self.batches[b] = (r.input or 0, float(sum((r.ms or {}).values())))
            self.total = max(self.total, int((r.totals or {}).get("input", 0)))
        return self.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000_000)
    parser.add_argument("--users", type=int, default=6_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--per-batch", type=int, default=1_000_000)
    parser.add_argument(
        "--state-memory-mb",
        type=int,
        help="RIVERBED_STATE_MEMORY_MB: RocksDB's memory per process (default: its own)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rb-scale-"))
    home, parquet = root / "home", root / "parquet"
    parquet.mkdir()
    url = f"file://{root / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("clicks", 4, schema=SCHEMA)
    log.close()
    spec = root / "scale.py"
    spec.write_text(SPEC)
    env = {
        **os.environ,
        "RIVERBED_HOME": str(home),
        "RIVERBED_LOG": url,
        "RIVERBED_CONTROL": f"sqlite:///{root / 'control.db'}",
        "RIVERBED_SPARK_MASTER": "local[2]",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RIVERBED_CHECKPOINTS", None)
    env.pop("RIVERBED_STATE_MEMORY_MB", None)
    if args.state_memory_mb:
        env["RIVERBED_STATE_MEMORY_MB"] = str(args.state_memory_mb)
    checkpoint = home / "checkpoints" / "scale"
    print(
        f"{args.events:,} events over {args.days} days, users uniform over {args.users:,}, "
        f"{args.chunks} chunks; batches of {args.per_batch:,}; state memory per process: "
        f"{f'{args.state_memory_mb} MiB' if args.state_memory_mb else 'RocksDB defaults'}; "
        f"working in {root}",
        flush=True,
    )
    produced = threading.Event()
    producer = threading.Thread(target=produce, args=(args, url, parquet, produced), daemon=True)
    began = time.monotonic()
    producer.start()
    driver = start_driver(spec, env, args.per_batch, root / "driver.log")
    ledger = Ledger(checkpoint)
    samples: list[tuple[float, int, float, float, float]] = []  # t, input, rss, worker, state
    restarted_at: float | None = None
    first_after: float | None = None
    try:
        while True:
            time.sleep(0.5)
            total = ledger.poll()
            rss, worker = tree_rss(driver.pid)
            samples.append((time.monotonic() - began, total, rss, worker, du_mb(home / "state")))
            if restarted_at is None and total >= args.events // 2:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
                restarted_at, at_input = time.monotonic(), total
                print(f"SIGKILLed the driver at {total:,} committed events; starting it again")
                driver = start_driver(spec, env, args.per_batch, root / "driver.log")
            if restarted_at is not None and first_after is None and total > at_input:
                first_after = time.monotonic() - restarted_at
            if produced.is_set() and total >= args.events:
                break
            if driver.poll() is not None:
                tail = (root / "driver.log").read_text()[-2000:]
                raise SystemExit(f"the driver exited ({driver.returncode}):\n{tail}")
            if time.monotonic() - began > 6 * 3600:
                raise SystemExit("not done within 6 hours")
        elapsed = time.monotonic() - began
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGTERM)
            try:
                driver.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, signal.SIGKILL)
    ledger.poll()
    report(args, ledger, samples, elapsed, first_after)
    verify(args, home, parquet, ledger)
    if args.keep:
        print(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


def report(
    args: argparse.Namespace,
    ledger: Ledger,
    samples: list[tuple[float, int, float, float, float]],
    elapsed: float,
    first_after: float | None,
) -> None:
    batches = [(b, n, ms) for b, (n, ms) in sorted(ledger.batches.items())]
    print(
        f"\n{'quarter':>8} {'events/s':>10} {'RSS MB':>8} {'worker MB':>10} {'state MB':>9} "
        f"{'batch p50 ms':>13} {'p99 ms':>8} {'batches':>8}"
    )
    rows = []
    for q in range(4):
        lo, hi = args.events * q // 4, args.events * (q + 1) // 4
        mine = [s for s in samples if lo <= s[1] < hi or (q == 3 and s[1] >= hi)]
        if len(mine) < 2:
            print(f"{q + 1:>8} (too few samples)")
            continue
        # from the first sample at or past the quarter's start to the first past its end
        t_lo = next((t for t, n, *_ in samples if n >= lo), samples[-1][0])
        t_hi = next((t for t, n, *_ in samples if n >= hi), samples[-1][0])
        rate = (hi - lo) / (t_hi - t_lo) if t_hi > t_lo else float("nan")
        cum, durations = 0, []
        for _, n, ms in batches:
            cum += n
            if lo < cum <= hi or (q == 3 and cum > hi):
                durations.append(ms)
        p50 = float(np.percentile(durations, 50)) if durations else float("nan")
        p99 = float(np.percentile(durations, 99)) if durations else float("nan")
        rss = max(s[2] for s in mine)
        worker = max(s[3] for s in mine)
        state = mine[-1][4]
        rows.append((rate, rss, state))
        print(
            f"{q + 1:>8} {rate:>10,.0f} {rss:>8,.0f} {worker:>10,.0f} {state:>9,.0f} "
            f"{p50:>13,.0f} {p99:>8,.0f} {len(durations):>8}"
        )
    print(
        f"whole run: {elapsed:.0f} s, {args.events / elapsed:,.0f} events/s (production included)"
    )
    if first_after is not None:
        print(f"restart: the new driver's first commit {first_after:.1f} s after the SIGKILL")
    if len(rows) == 4:
        print(
            f"last / second quarter: RSS {rows[3][1] / rows[1][1]:.2f}x (goal <= 1.2x), "
            f"throughput {rows[3][0] / rows[1][0]:.2f}x (goal >= 0.8x); state from the second "
            f"quarter's start to the end {rows[3][2] / max(rows[0][2], 1e-9):.2f}x (goal >= 3x)"
        )


def verify(args: argparse.Namespace, home: Path, parquet: Path, ledger: Ledger) -> None:
    import duckdb

    counted = sum(n for n, _ in ledger.batches.values())
    print(
        f"committed input: {ledger.total:,} of {args.events:,} produced (the batches seen: "
        f"{counted:,} in {len(ledger.batches)})",
        end="; ",
    )
    t = time.perf_counter()
    want = duckdb.sql(
        f"""SELECT flag AS key, epoch_ms(time_bucket(INTERVAL 1 HOUR, ts)) AS w,
                   COUNT(DISTINCT user_id) AS users, COUNT(*) AS events
            FROM read_parquet('{parquet}/*.parquet') GROUP BY ALL"""
    ).df()
    duck_s = time.perf_counter() - t
    got = read_results(home / "output" / "scale")
    starts = pd.to_datetime(got["window_start"], utc=True)
    got = got.assign(w=(starts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1))
    merged = want.merge(got, on=["w", "key"], how="outer", suffixes=("_duckdb", ""))
    same = (
        len(merged) == len(want) == len(got)
        and (merged["users"] == merged["users_duckdb"]).all()
        and (merged["events"] == merged["events_duckdb"]).all()
    )
    distinct = duckdb.sql(f"SELECT COUNT(DISTINCT user_id) FROM read_parquet('{parquet}/*')")
    print(f"{int(distinct.fetchall()[0][0]):,} distinct users")
    print(
        f"results vs DuckDB's exact answer ({len(want):,} windows x keys; DuckDB took "
        f"{duck_s:.1f} s): {'IDENTICAL' if same else 'DIFFERENT'}"
    )
    if not same:
        bad = merged[(merged["users"] != merged["users_duckdb"]) | merged.isna().any(axis=1)]
        print(bad.head(10).to_string())


if __name__ == "__main__":
    main()
