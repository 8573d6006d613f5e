"""What a batch's records cost the loop on a local disk: per batch, the plan, the same
plan again with its counts (the log-native path puts it after its tasks), a read back
and the commit — the record I/O of every micro-batch, alone.

    .venv/bin/python benchmarks/batch_records.py LABEL

Prints ms per batch for 5 runs of 300 batches, in a directory under /work (the disk
checkpoints are on). Run it from two checkouts (A/B) to compare record layouts.
"""

import sys
import tempfile
import time

from riverbed.stream.batchlog import BatchRecord, open_batches


def run(n: int = 300) -> float:
    with tempfile.TemporaryDirectory(dir="/work") as d:
        b = open_batches(d)
        t0 = time.perf_counter()
        for i in range(n):
            prev = b.previous(i)
            rec = BatchRecord(watermark_ms=i, slices={"0": [i, i + 1]}, co_located=True)
            b.put(i, rec)
            rec.late = 0
            b.put(i, rec)  # the same plan with counts (log-native, a no-op write)
            got = b.get(i)
            assert got is not None and (i == 0 or prev is not None)
            done = BatchRecord(
                watermark_ms=i,
                slices={"0": [i, i + 1]},
                co_located=True,
                done=True,
                input=5,
                totals={"batches": i},
            )
            b.put(i, done)
        return (time.perf_counter() - t0) / n * 1000


if __name__ == "__main__":
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    runs = ", ".join(f"{run():.2f}" for _ in range(5))
    print(f"{label}: ms per batch (plan, plan again, read, commit): {runs}")
