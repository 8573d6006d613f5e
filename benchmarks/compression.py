"""What compressing riverbed's stored bytes saves, and what it costs per batch.

Runs the stream demo's aggregation (``riverbed demo --events N``, in a temporary home:
its state is Distinct sketches — dense bytes — over a few keys), then takes what it
stored and measures each kind of file both ways, on the same bytes; then the same for a
state of many keys with counts, sums and a few ids (``--keys``, the rescale benchmark's
state):

* **changelogs** (one per batch and state partition): msgpack as before (format 2)
  against msgpack + zstd (format 3) at level 3 (before) and level 1 (today's) — bytes,
  and CPU to encode;
* **state files** (RocksDB SSTs: what a snapshot uploads): every key and value of each
  partition's state written into a fresh database and compacted, with no compression,
  with Snappy (RocksDB's default, what riverbed used before), with LZ4 + zstd for the
  bottommost level (RocksDB's advice) and with zstd (today's) — bytes on disk, and
  seconds to write and compact;
* **result files** (Parquet, one per batch) — the demo's and a join's rows (Nexmark q9i's
  columns): Snappy and zstd with Parquet's dictionaries on every column (before) against
  zstd with them on text columns only (today's).

    .venv/bin/python benchmarks/compression.py [--events 200000]

Prints, per kind, the bytes and time of each way and the ratio against the way before.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from rocksdict import AccessType, DBCompressionType, Options, Rdict

from riverbed.parquetbytes import text_columns
from riverbed.state.changelog import ZSTD_LEVEL, Changelog


def _demo(home: Path, events: int) -> None:
    env = {**os.environ, "RIVERBED_HOME": str(home)}
    cmd = [sys.executable, "-m", "riverbed.cli.main", "demo", "--events", str(events)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)


def changelogs(root: Path) -> tuple[tuple[str, str], list[list[object]]]:
    """Each changelog's operations encoded as msgpack (format 2), and as msgpack + zstd
    at level 3 (before) and at riverbed's level now (``changelog.ZSTD_LEVEL``)."""
    files = sorted(root.rglob("*.rbcl"))
    plain_bytes = 0
    plain_s = 0.0
    levels = {3: [0, 0.0], ZSTD_LEVEL: [0, 0.0]}
    for f in files:
        log = Changelog.decode(f.read_bytes())
        rows = [list(op) for op in log.ops]
        t = time.perf_counter()
        packed = msgpack.packb(rows)
        plain_s += time.perf_counter() - t
        plain_bytes += len(packed) + 29
        for level, sums in levels.items():
            compressor = zstandard.ZstdCompressor(level=level)
            t = time.perf_counter()
            again = compressor.compress(msgpack.packb(log.ops))
            sums[1] += time.perf_counter() - t
            sums[0] += len(again) + 29
    n = max(1, len(files))
    head = ("changelogs", f"{len(files)} files")
    out: list[list[object]] = [
        ["msgpack (format 2, before)", plain_bytes, plain_bytes / n, plain_s / n * 1e3, 1.0]
    ]
    for level, (size, seconds) in levels.items():
        label = f"msgpack + zstd {level} " + ("(today)" if level == ZSTD_LEVEL else "(before)")
        out.append([label, size, size / n, seconds / n * 1e3, size / max(1, plain_bytes)])
    return head, out


def _sst_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.sst"))


def state_files(state: Path, scratch: Path) -> tuple[tuple[str, str], list[list[object]]]:
    parts = [p for p in sorted(state.rglob("CURRENT")) if (p.parent / "IDENTITY").exists()]
    items: list[tuple[bytes, bytes]] = []
    for current in parts:
        db = Rdict(str(current.parent), Options(raw_mode=True), access_type=AccessType.read_only())
        items += list(db.items())
        db.close()
    ways = {
        "none": (DBCompressionType.none(), DBCompressionType.none()),
        "snappy (RocksDB's default, before)": (
            DBCompressionType.snappy(),
            DBCompressionType.snappy(),
        ),
        "lz4 + zstd bottommost (RocksDB's advice)": (
            DBCompressionType.lz4(),
            DBCompressionType.zstd(),
        ),
        "zstd (today)": (DBCompressionType.zstd(), DBCompressionType.zstd()),
    }
    out: list[list[object]] = []
    base = None
    for name, (most, bottom) in ways.items():
        path = scratch / name.split()[0] / name.split()[-1].strip("()'")
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_compression_type(most)
        options.set_bottommost_compression_type(bottom)
        t = time.perf_counter()
        db = Rdict(str(path), options)
        for k, v in items:
            db[k] = v
        db.flush()
        db.compact_range(None, None)
        db.close()
        seconds = time.perf_counter() - t
        size = _sst_bytes(path)
        base = size if name.startswith("snappy") else base
        out.append([name, size, len(items), seconds * 1e3, size])
    for row in out:
        row[4] = float(row[1]) / float(base or 1)  # type: ignore[arg-type]
    return ("state files (SSTs)", f"{len(parts)} partitions, {len(items)} entries"), out


def results(tables: list[pa.Table], what: str) -> tuple[tuple[str, str], list[list[object]]]:
    """Each table written as a result file three ways: Snappy (before), zstd with
    Parquet's dictionaries on every column (before), zstd with them on text only
    (today's: ``riverbed.stream.results.encode_file``)."""
    out: list[list[object]] = []
    sizes: dict[str, int] = {}
    ways = {
        "snappy (before)": lambda t: {"compression": "snappy"},
        "zstd, dictionaries everywhere (before)": lambda t: {"compression": "zstd"},
        "zstd, dictionaries for text (today)": lambda t: {
            "compression": "zstd", "use_dictionary": text_columns(t.schema)
        },
    }  # fmt: skip
    for label, options in ways.items():
        total, seconds = 0, 0.0
        for table in tables:
            buffer = io.BytesIO()
            t = time.perf_counter()
            pq.write_table(table, buffer, **options(table))
            seconds += time.perf_counter() - t
            total += buffer.tell()
        sizes[label] = total
        n = max(1, len(tables))
        out.append(
            [label, total, total / n, seconds / n * 1e3, total / max(1, sizes["snappy (before)"])]
        )
    return ("result files (Parquet): " + what, f"{len(tables)} files"), out


def join_rows(batches: int = 10, rows: int = 91_000) -> list[pa.Table]:
    """A join's result files as Nexmark's q9i writes them (each auction with its bids:
    ids, a category, prices, times, a channel), ``rows`` a batch."""
    rng = np.random.default_rng(7)
    tables = []
    for b in range(batches):
        auction = np.sort(rng.integers(1000 + b * 6000, 7000 + b * 6000, rows))
        us = pa.timestamp("us", tz="UTC")
        tables.append(pa.table({
            "id": auction,
            "category": rng.integers(10, 15, rows),
            "ts": pa.array((auction * 16 + rng.integers(0, 5, rows)) * 1000, us),
            "expires": pa.array((auction * 16 + 20_000) * 1000, us),
            "right_ts": pa.array(np.sort(rng.integers(0, 10**9, rows)) * 1000, us),
            "price": rng.integers(100, 10**7, rows),
            "bidder": rng.integers(1000, 21_000, rows),
            "channel": rng.choice(["apple", "google", "facebook", "baidu"], rows),
            "batch_id": np.full(rows, b),
        }))  # fmt: skip
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="rb-compression-"))
    try:
        _demo(home, args.events)
        print(f"the stream demo's aggregation over {args.events:,} events, then its stored files:")
        demo = home / "demo"  # where `riverbed demo` keeps its stream
        reports = [
            changelogs(demo / "checkpoints" / "state"),
            state_files(demo / "state", home / "scratch"),
            results(
                [pq.read_table(f) for f in sorted((demo / "output").rglob("*.parquet"))],
                "the demo's aggregation",
            ),
            results(join_rows(), "a join's rows (q9i-like)"),
        ]
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from rescale import build  # a sibling benchmark's state

        build(home / "keys", args.keys)
        reports += [
            (("many keys: " + head[0], head[1]), rows)
            for head, rows in (
                changelogs(home / "keys" / "durable"),
                state_files(home / "keys" / "local", home / "scratch-keys"),
            )
        ]
        for (kind, what), rows in reports:
            print(f"\n{kind} — {what}")
            per = "entries" if "state files" in kind else "bytes/file"
            unit = "ms (all)" if "state files" in kind else "ms/file"
            print(f"  {'way':40} {'bytes':>12} {per:>12} {unit:>10} {'vs before':>10}")
            for name, total, each, ms, ratio in rows:
                print(f"  {name:40} {total:>12,} {each:>12,.0f} {ms:>10.2f} {ratio:>9.2f}x")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
