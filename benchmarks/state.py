"""State store costs, each against a baseline measured in the same run.

    .venv/bin/python benchmarks/state.py [--keys 1000000] [--groups 10000]

1. Commit throughput of read-modify-write of distinct sketches per (window, key):
   each batch touches ``--groups`` keys; for every key it reads the stored HLL,
   merges a batch partial (20 new ids), writes it back; then commits (durable
   changelog + local WriteBatch). Baseline: the same gets and puts of the same bytes
   straight into a raw ``rocksdict`` database (no versioning, no changelog, no merge).
2. Restore of ``--keys`` keys (100-byte values) from durable storage into a fresh
   local directory (snapshot download + open + verify version). Baseline: a plain
   copy of the same snapshot files (``shutil.copyfile`` each).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from rocksdict import Options, Rdict

from riverbed.state import StateConfig, StateProvider
from riverbed.state.durable import MANIFEST
from riverbed.state.sketches import HLL


def bench_rmw(root: Path, groups: int, batches: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    keys = [f"2026-11-21T10|flag-{i:06d}".encode() for i in range(groups)]
    partials = [
        [HLL(12).update(rng.integers(0, 1 << 40, 20)).to_bytes() for _ in range(groups)]
        for _ in range(batches)
    ]
    provider = StateProvider(
        StateConfig(local_dir=root / "local", durable=root / "durable", snapshot_every=1_000)
    )
    start = time.perf_counter()
    for b in range(batches):
        store = provider.load("bench", 0)
        current = store.get_many(keys)
        for key, stored, partial in zip(keys, current, partials[b], strict=True):
            sketch = HLL.from_bytes(partial)
            if stored is not None:
                sketch.merge(HLL.from_bytes(stored))
            store.put(key, sketch.to_bytes())
        store.commit()
    riverbed_rate = groups * batches / (time.perf_counter() - start)

    start = time.perf_counter()
    for b in range(batches):
        for partial in partials[b]:
            HLL.from_bytes(partial).merge(HLL.from_bytes(partial)).to_bytes()
    merge_rate = groups * batches / (time.perf_counter() - start)

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    raw = Rdict(str(root / "raw"), options)
    start = time.perf_counter()
    for b in range(batches):
        current = raw.get(keys)
        for key, stored, partial in zip(keys, current, partials[b], strict=True):
            raw.put(key, stored if stored is not None and b % 2 else partial)
    raw_rate = groups * batches / (time.perf_counter() - start)
    raw.close()
    return riverbed_rate, raw_rate, merge_rate


def bench_restore(root: Path, n: int) -> tuple[float, float, int]:
    provider = StateProvider(
        StateConfig(local_dir=root / "local", durable=root / "durable", snapshot_every=1)
    )
    store = provider.load("big", 0)
    values = np.random.default_rng(1).integers(0, 256, (n, 100), dtype=np.uint8)
    for i in range(n):
        store.put(b"k%010d" % i, values[i].tobytes())
    value = values[n - 1].tobytes()
    store.commit()  # snapshot_every=1: uploads a snapshot of the 1M keys
    snapshot = next((root / "durable" / "big" / "0" / "snapshot").iterdir())
    manifest = json.loads((snapshot / MANIFEST).read_text())
    size = sum(manifest["files"].values())
    # where each of the snapshot's files is stored (content-named, shared by snapshots)
    stored = {rel: root / "durable" / key for rel, key in manifest["objects"].items()}

    shutil.rmtree(root / "local")
    start = time.perf_counter()
    restored = provider.load("big", 0)
    restore_s = time.perf_counter() - start
    assert restored.version == 1 and restored.get(b"k%010d" % (n - 1)) == value
    restored.abort()

    start = time.perf_counter()
    for rel, path in stored.items():  # the same files, copied one by one
        (root / "plain-copy" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, root / "plain-copy" / rel)
    copy_s = time.perf_counter() - start
    return size / restore_s / 1e6, size / copy_s / 1e6, size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rb, raw, merge = bench_rmw(Path(tmp) / "rmw", args.groups, args.batches)
        print(
            f"sketch read-modify-write + commit: riverbed {rb:,.0f} keys/s, raw rocksdict "
            f"get+put {raw:,.0f} keys/s -> {rb / raw:.2f}x  (HLL decode+merge+encode alone: "
            f"{merge:,.0f}/s)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        restore, copy, size = bench_restore(Path(tmp), args.keys)
        print(
            f"restore {args.keys:,} keys ({size / 1e6:.0f} MB snapshot): riverbed "
            f"{restore:,.0f} MB/s, plain file copy {copy:,.0f} MB/s  -> {restore / copy:.2f}x"
        )


if __name__ == "__main__":
    main()
