"""What moving an aggregation's state to another partition count costs (stream/rescale.py).

A state of fixed-window entries (8-byte window start + a text key, a msgpack partial of
~100 bytes: what a Count/Sum/Distinct aggregation keeps) is written into 3 partitions of
a directory's durable state; then it is moved to 5 partitions (``rescale.move``: every
old partition loaded and scanned, each entry routed, every new partition committed as
one version) — in the driver, one partition after another, and as Spark tasks on a
``local[2]`` session (one task per old partition reads and routes, one per new
partition writes: what ``stream run`` does). Beside them, on the same bytes: a raw copy
of the durable state directory (``shutil.copytree``: what any move must at least read
and write).

    .venv/bin/python benchmarks/rescale.py [--entries 400000] [--rounds 3]

Prints the state's size, the seconds per GB of each, and the move's cost relative to the
raw copy (above 1: the move is slower).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np

from riverbed.config import SparkConfig
from riverbed.spark import session
from riverbed.state import StateConfig, StateProvider
from riverbed.state.keys import window_key
from riverbed.stream.engine import state_partition_of
from riverbed.stream.rescale import Generation, move


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(root: Path, entries: int) -> StateConfig:
    import pandas as pd

    state = StateConfig(local_dir=root / "local", durable=root / "durable", snapshot_every=1)
    provider = StateProvider(state)
    rng = np.random.default_rng(0)
    keys = pd.Series([f"user-{i:09d}" for i in range(entries)])
    parts = state_partition_of(keys, 3)
    starts = rng.integers(0, 48, entries) * 3_600_000 + 1_767_225_600_000
    for p in range(3):
        store = provider.load("bench", p, None)
        for i in np.flatnonzero(parts == p):
            value = {"events": int(rng.integers(1, 1000)), "total": float(rng.random()) * 1e4,
                     "users": [int(x) for x in rng.integers(0, 1 << 30, 8)]}  # fmt: skip
            store.put(window_key(int(starts[i]), keys[i].encode()), msgpack.packb(value))
        store.commit(1)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = build(root, args.entries)
        nbytes = _size(root / "durable" / "bench")
        gb = nbytes / 1e9
        print(f"state: {args.entries:,} entries, {nbytes / 1e6:.1f} MB durable, 3 → 5 partitions")
        spark = session(SparkConfig(master="local[2]", app_name="rescale-bench"))
        moves, tasks, copies = [], [], []
        for r in range(args.rounds):
            for on, times in ((None, moves), (spark, tasks)):
                ckpt = root / f"ckpt-{r}-{len(times)}-{on is None}"
                ckpt.mkdir()
                # a fresh local cache each round: the move loads every old partition
                # from durable storage, as a driver on another machine would
                shutil.rmtree(root / "local", ignore_errors=True)
                started = time.perf_counter()
                move(ckpt, state, "bench", False, Generation(0, 3), 5, lambda: None,
                     say=lambda _: None, version=1, spark=on)  # fmt: skip
                times.append(time.perf_counter() - started)
                shutil.rmtree(root / "durable" / "bench.g1.5.v1")
            started = time.perf_counter()
            shutil.copytree(root / "durable" / "bench", root / f"copy-{r}")
            copies.append(time.perf_counter() - started)
            shutil.rmtree(root / f"copy-{r}")
        spark.stop()
        m, t = statistics.median(moves), statistics.median(tasks)
        c = statistics.median(copies)
        print(f"{'move (driver)':<22} {m:7.2f} s  {m / gb:8.1f} s/GB")
        print(f"{'move (Spark tasks)':<22} {t:7.2f} s  {t / gb:8.1f} s/GB")
        print(f"{'raw copy':<22} {c:7.2f} s  {c / gb:8.1f} s/GB")
        print(f"Spark tasks / driver: {t / m:.2f}x; Spark tasks / raw copy: {t / c:.1f}x")


if __name__ == "__main__":
    main()
