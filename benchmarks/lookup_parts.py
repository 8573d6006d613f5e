"""What holding a big lookup table in parts saves a task: memory, and at what cost.

A table of ``--keys`` rows (an integer key, a text owner, a double budget) is
snapshotted into a checkpoint twice, whole and in ``--parts`` parts
(``riverbed.stream.lookupparts``), as a stream's driver does. Then, for each, a fresh
process — as a Spark task's worker is — joins ``--batches`` batches of ``--rows``
events with it, the way a task does (``riverbed.stream.lookups.tables`` + ``join``):

* **co-located**: the events' keys all of one state partition of 4 (a task reading one
  partition of a topic keyed by the join key);
* **any keys**: keys from the whole table (a topic keyed otherwise).

Prints each process's peak resident memory (``VmHWM``), what the joins added to it, and
the time per batch, the whole snapshot (what every task held before parts) as the
baseline.

    .venv/bin/python benchmarks/lookup_parts.py [--keys 3000000] [--parts 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

WORKER = """
import json, sys, time
import numpy as np, pyarrow as pa
from riverbed.stream import Lookup
from riverbed.stream.lookups import join, tables
from riverbed.stream.rescale import partition_of
checkpoint, snapshot, keys, rows, batches, colocated = sys.argv[1:7]
keys, rows, batches = int(keys), int(rows), int(batches)
rng = np.random.default_rng(1)
pool = rng.integers(0, keys, 200_000)
if colocated == "1":
    pool = np.array([k for k in pool.tolist() if partition_of(str(k).encode(), 4) == 1])
def hwm():  # this process's peak resident memory, MiB (not what it was forked from)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
base = hwm()
lookup = Lookup("t.parquet", on="id")
began = time.perf_counter()
for b in range(batches):
    (table,) = tables(checkpoint, [snapshot])
    events = pa.table({"id": pa.array(rng.choice(pool, rows), pa.int64())})
    joined, found = join(events, lookup, table)
    assert bool(found.to_numpy(zero_copy_only=False).all())
seconds = time.perf_counter() - began
print(json.dumps({"ms": seconds / batches * 1000, "peak_mb": hwm(), "base_mb": base}))
"""


def table_of(keys: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": pa.array(np.arange(keys), pa.int64()),
            "owner": pa.array([f"owner-{i % 9973:05d}" for i in range(keys)]),
            "budget": pa.array(rng.random(keys)),
        }
    )


def run(checkpoint: str, snapshot: str, args: argparse.Namespace, colocated: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, checkpoint, snapshot, str(args.keys), str(args.rows),
         str(args.batches), "1" if colocated else "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--rows", type=int, default=50_000, help="events per batch")
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    import pyarrow.parquet as pq

    from riverbed.stream import Lookup
    from riverbed.stream.layout import LOOKUPS, checkpoint_store
    from riverbed.stream.lookups import plan_snapshots

    root = Path(tempfile.mkdtemp(prefix="rb-lookup-parts-"))
    checkpoint = str(root / "checkpoint")
    table = table_of(args.keys)
    path = root / "table.parquet"
    pq.write_table(table, path)
    store = checkpoint_store(checkpoint)
    began = time.perf_counter()
    (whole,) = plan_snapshots([Lookup(str(path), on="id", parts=1)], None, store, now_ms=0)
    whole_s = time.perf_counter() - began
    began = time.perf_counter()
    (parted,) = plan_snapshots(
        [Lookup(str(path), on="id", parts=args.parts)], None, store, now_ms=0
    )
    parted_s = time.perf_counter() - began
    del table
    print(
        f"a table of {args.keys:,} keys ({path.stat().st_size / 2**20:.0f} MiB of Parquet); "
        f"snapshotted whole in {whole_s:.1f} s, in {args.parts} parts in {parted_s:.1f} s "
        f"({LOOKUPS}{parted.id}/)"
    )
    print(f"{args.batches} batches of {args.rows:,} events, a fresh process each way:")
    print(f"{'events':>12} {'held':>10} {'peak MiB':>9} {'added MiB':>10} {'ms/batch':>9} "
          f"{'added vs whole':>15}")  # fmt: skip
    for colocated in (True, False):
        base = run(checkpoint, whole.id, args, colocated)
        part = run(checkpoint, parted.id, args, colocated)
        label = "co-located" if colocated else "any keys"
        for held, got in (("whole", base), (f"{args.parts} parts", part)):
            grew = got["peak_mb"] - got["base_mb"]
            ratio = grew / max(1e-9, base["peak_mb"] - base["base_mb"])
            print(
                f"{label:>12} {held:>10} {got['peak_mb']:>9.0f} {grew:>10.0f} "
                f"{got['ms']:>9.1f} {ratio:>14.2f}x"
            )
    print("(peak: with riverbed's imports; added: above the peak before the first join)")


if __name__ == "__main__":
    main()
