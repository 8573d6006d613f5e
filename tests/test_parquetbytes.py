"""Parquet bytes are read through an Arrow buffer (riverbed.parquetbytes): a process
that read Parquet through a Python file object may abort at exit (SIGABRT, after all
its work: apache/arrow#33975) — a CLI command failing with its output printed."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from riverbed.parquetbytes import parquet_bytes, read_parquet_bytes

ROOT = Path(__file__).resolve().parents[1]
READERS = {"read_table", "read_parquet", "read_pandas", "ParquetDataset", "dataset"}

# what a short process does: read Parquet bytes (riverbed query reads the result table
# so), then exit at once
SHORT = """
import pyarrow as pa
from riverbed.parquetbytes import parquet_bytes, read_parquet_bytes
data = parquet_bytes(pa.table({"a": list(range(2000)), "b": ["x"] * 2000}), "zstd")
for _ in range(20):
    table = read_parquet_bytes(data)
print(table.num_rows)
"""


def test_a_table_round_trips_through_bytes() -> None:
    table = pa.table({"k": ["a", None, "c"], "n": [1, 2, None], "x": [0.5, None, 2.0]})
    for codec in ("snappy", "zstd"):
        data = parquet_bytes(table, codec)
        assert data[:4] == b"PAR1"
        assert read_parquet_bytes(data).equals(table)


def test_short_processes_reading_parquet_bytes_exit_cleanly() -> None:
    # through read_table, 42 of 300 such processes (4 at once) aborted at exit here: 40
    # all exiting 0 has a chance of ~0.2% if the reader regressed
    def one(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", SHORT], capture_output=True, text=True, timeout=120
        )

    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(one, range(40)))
    failed = [(r.returncode, r.stderr[-300:]) for r in runs if r.returncode != 0]
    assert failed == []
    assert all(r.stdout.strip() == "2000" for r in runs)


def test_nothing_reads_parquet_through_a_python_file_object() -> None:
    found = []
    for path in [*ROOT.glob("src/riverbed/**/*.py"), *ROOT.glob("tests/**/*.py"),
                 *ROOT.glob("benchmarks/**/*.py")]:  # fmt: skip
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name not in READERS or not node.args:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Call) and any(
                m in ast.unparse(arg.func) for m in ("BytesIO", "BufferReader", "py_buffer")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"read Parquet bytes with riverbed.parquetbytes: {found}"
