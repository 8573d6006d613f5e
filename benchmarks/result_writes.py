"""What storing a batch's result file costs, on a local disk: the create-once write
(`results.store_batch`, `ObjectStore.write_once`) against encoding the same rows and a
plain `put` (the write before it), and the two re-run paths — the same bytes (dropped after
one comparison) and the same rows in another order (decoded and compared sorted).

    .venv/bin/python benchmarks/result_writes.py [BATCHES] [ROWS]

Prints ms per batch (median of 5 runs) for each path and its ratio to the plain put,
in directories under /work (the disk checkpoints are on).
"""

import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.stream import results
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.metrics import Count
from riverbed.windows import Tumbling

SPEC = Aggregation(name="t", key="k", time="ts", window=Tumbling("1h"), metrics={"n": Count()})


def table(batch_id: int, rows: int) -> pa.Table:
    start = pd.Timestamp("2026-11-21", tz="UTC")
    frame = pd.DataFrame(
        {
            "window_start": [start] * rows,
            "window_end": [start + pd.Timedelta(hours=1)] * rows,
            "key": [f"user-{i}" for i in range(rows)],
            "n": np.arange(rows, dtype=np.int64) + batch_id,
            "batch_id": np.full(rows, batch_id, dtype=np.int64),
        }
    )
    return pa.Table.from_pandas(frame, preserve_index=False).cast(results.output_arrow_schema(SPEC))


def timed(
    write: Callable[[str, int], object], batches: int, first: Callable[[str, int], object] | None
) -> float:
    with tempfile.TemporaryDirectory(dir="/work") as d:
        if first is not None:
            for i in range(batches):
                first(d, i)
        t0 = time.perf_counter()
        for i in range(batches):
            write(d, i)
        return (time.perf_counter() - t0) / batches * 1000


def main(batches: int = 300, rows: int = 500) -> None:
    tables = [table(i, rows) for i in range(batches)]
    shuffled = [t.take(np.arange(rows)[::-1]) for t in tables]

    def put(d: str, i: int) -> None:
        results.checkpoint_store(d).put(results.batch_key(i), results.encode_file(tables[i]))

    def store(d: str, i: int) -> None:
        assert results.store_batch(d, i, tables[i])

    def store_again(d: str, i: int) -> None:
        assert not results.store_batch(d, i, tables[i])

    def store_reordered(d: str, i: int) -> None:
        assert not results.store_batch(d, i, shuffled[i])

    paths = {
        "encode + put (the write before: replaces)": (put, None),
        "store_batch, a new batch (create once)": (store, None),
        "store_batch, a re-run with the same bytes": (store_again, store),
        "store_batch, a re-run with the rows in another order": (store_reordered, store),
    }
    base = None
    print(f"{batches} result files of {rows} rows, ms per batch (median of 5 runs):")
    for name, (write, first) in paths.items():
        ms = statistics.median(timed(write, batches, first) for _ in range(5))
        base = base or ms
        print(f"  {name:55s} {ms:6.2f} ms  {ms / base:5.2f}x put")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
