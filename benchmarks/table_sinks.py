"""What committing a batch's results to a lakehouse table costs, beside the Parquet
result table every aggregation writes.

A stream of batches, each changing ``--rows`` (window, key) rows of a table that grows
to ``--batches`` x ``--rows`` / 2 rows (half of each batch's rows are new windows, half
update rows an earlier batch wrote — what an hourly aggregation's batches do). Each
sink gets the same batches, in a directory of this machine:

* the Parquet result table (``results.write_output``: one file a batch, readers take
  each (window, key)'s newest row) — the baseline;
* a Delta table (``DeltaSink.write``: one delta-rs MERGE by (window, key) a batch, the
  batch id in the same commit);
* an Iceberg table (``IcebergSink.write``: one pyiceberg transaction a batch, upserting
  by (window, key), on a SQLite catalog).

    .venv/bin/python benchmarks/table_sinks.py [--rows 2000] [--batches 30]

Every 100th batch also compacts each table, as a running aggregation's sink does
(``--batches 300`` shows the steady state past two compactions). Prints the median, the
last-five median and the slowest milliseconds per batch of each, and each table's cost
as a multiple of the Parquet result table's (below 1 would be cheaper).

Then the same for **chunks published as partitions** (a time-range job's ``tables=``,
a job's ``table=``: ``riverbed.tables``): ``--batches`` chunks of ``--rows`` rows, each
published as a time-range output publishes it (a Parquet file staged, then moved into
place — the baseline), and as one partition replaced whole in a Delta table and in an
Iceberg table (the chunk's version in the same commit); the last fifth of the chunks are
reruns of earlier ones (a partition replaced, not added).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from riverbed.stream import Aggregation, Count, Max, Sum, Tumbling
from riverbed.stream.lakehouse import DeltaSink, IcebergSink
from riverbed.stream.results import output_arrow_schema, write_output
from riverbed.tables import partition_table
from riverbed.timerange.output import TimeRangeOutput

SPEC = Aggregation(
    name="bench", key="flag", time="ts", window=Tumbling("1h"), watermark="2h",
    metrics={"events": Count(), "users": Max("user_id"), "total": Sum("amount")},
)  # fmt: skip
T0 = pd.Timestamp("2026-11-01", tz="UTC")


def batches(rows: int, count: int) -> list[pd.DataFrame]:
    """``count`` batches of ``rows`` result rows: half new windows, half updates."""
    rng = np.random.default_rng(7)
    keys = [f"flag-{i:04d}" for i in range(rows // 2)]
    out = []
    for b in range(count):
        hours = [b] * (rows // 2) + [b - 1] * (rows - rows // 2)
        start = [T0 + pd.Timedelta(hours=h) for h in hours]
        out.append(
            pd.DataFrame(
                {
                    "window_start": start,
                    "window_end": [s + pd.Timedelta(hours=1) for s in start],
                    "key": keys + keys[: rows - rows // 2],
                    "events": rng.integers(1, 1000, rows),
                    "users": rng.integers(1, 500, rows),
                    "total": rng.random(rows) * 100,
                    "batch_id": b,
                }
            )
        )
    return out


def maintained(sink: DeltaSink | IcebergSink, batch_id: int, committed: bool) -> None:
    """What a running aggregation's table sink does after a commit: every 100th batch
    compacts the table (riverbed.stream.doors), within the batch's time."""
    if committed and batch_id % 100 == 99:
        sink.compact()


def timed(write: Callable[[int, pd.DataFrame], object], frames: list[pd.DataFrame]) -> list[float]:
    ms = []
    for b, frame in enumerate(frames):
        began = time.perf_counter()
        write(b, frame)
        ms.append((time.perf_counter() - began) * 1000)
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="result rows a batch changes")
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    frames = batches(args.rows, args.batches)
    schema = output_arrow_schema(SPEC)
    with tempfile.TemporaryDirectory(prefix="rb-table-sinks-") as scratch:
        root = Path(scratch)
        delta = DeltaSink(root / "delta")
        iceberg = IcebergSink(f"sqlite:///{root / 'catalog.db'}", "bench.results")
        sinks: dict[str, Callable[[int, pd.DataFrame], object]] = {
            "parquet result table": lambda b, f: write_output(str(root / "out"), SPEC, b, f),
            "delta": lambda b, f: maintained(delta, b, delta.write("bench", b, f, schema)),
            "iceberg": lambda b, f: maintained(iceberg, b, iceberg.write("bench", b, f, schema)),
        }
        results = {name: timed(write, frames) for name, write in sinks.items()}
        rows = len(delta.read())
    print(
        f"{args.batches} batches of {args.rows:,} result rows (half new, half updated); "
        f"the tables end with {rows:,} rows"
    )
    report(results, "sink", "parquet result table", "x parquet")
    chunk_partitions(args.rows, args.batches)


def chunk_partitions(rows: int, count: int) -> None:
    """Each chunk's cost as a file publication, a Delta and an Iceberg partition."""
    import pyarrow as pa

    rng = np.random.default_rng(11)
    hour = 3_600_000_000
    starts = [h * hour for h in range(count - count // 5)] + [h * hour for h in range(count // 5)]
    tables = [
        pa.table(
            {
                "sensor": rng.integers(0, 500, rows),
                "ts": pa.array(
                    [pd.Timestamp(start, unit="us", tz="UTC")] * rows, pa.timestamp("us", "UTC")
                ),
                "value_mean": rng.random(rows),
            }
        )
        for start in starts
    ]
    with tempfile.TemporaryDirectory(prefix="rb-chunk-tables-") as scratch:
        root = Path(scratch)
        output = TimeRangeOutput(str(root / "out"))
        delta = partition_table(f"delta:{root / 'lake'}", "bench")
        iceberg = partition_table(f"iceberg:sqlite:///{root / 'catalog.db'}#bench.rows", "bench")
        from riverbed.timerange.plan import chunk_label

        def publish(i: int, table: pa.Table) -> None:
            output.stage(f"t{i}", "rows", table)
            output.publish(f"t{i}", starts[i])

        ways: dict[str, Callable[[int, pa.Table], object]] = {
            "file (stage + move)": publish,
            "delta partition": lambda i, t: delta.replace(chunk_label(starts[i]), t, i + 1),
            "iceberg partition": lambda i, t: iceberg.replace(chunk_label(starts[i]), t, i + 1),
        }
        results = {name: timed(way, tables) for name, way in ways.items()}
        held = delta.read().num_rows, iceberg.read().num_rows
    assert held[0] == held[1] == (count - count // 5) * rows, held
    print()
    print(
        f"{count} chunks of {rows:,} rows published (the last {count // 5} reruns); "
        f"the tables end with {held[0]:,} rows"
    )
    report(results, "chunk published as", "file (stage + move)", "x file")


def report(results: dict[str, list[float]], what: str, baseline: str, ratio: str) -> None:
    """Each way's median, last-five median and slowest ms (a maintenance step — a
    compaction, a snapshot expiry — is the slowest), and its median over the baseline's."""
    base = statistics.median(results[baseline])
    print(f"{what:<22} {'median ms':>10} {'last 5 ms':>10} {'max ms':>10} {ratio:>10}")
    for name, ms in results.items():
        median, tail = statistics.median(ms), statistics.median(ms[-5:])
        print(f"{name:<22} {median:>10.1f} {tail:>10.1f} {max(ms):>10.1f} {median / base:>10.1f}")


if __name__ == "__main__":
    main()
