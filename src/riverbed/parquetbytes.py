"""Parquet files held as bytes (an object from a store, a file a bucket returned): the
one way riverbed reads and writes them.

A file's bytes are read by Parquet's file reader (``pq.ParquetFile(...).read()``), never
by ``pq.read_table``: that one scans through Arrow's dataset machinery, whose background
threads may drop the last reference to a Python-owned buffer (``bytes``, ``io.BytesIO``)
after the interpreter began to exit — the process then aborts (``terminate called
without an active exception``, SIGABRT) after it did all its work, as a CLI command did
on CI. Measured here (pyarrow 26.0.1, 4 short processes at once, each reading 20 files
of Python ``bytes`` then exiting): ``read_table(io.BytesIO)`` 51 of 200 aborted (one at a
time), ``read_table(pa.BufferReader(bytes))`` 42 of 300, ``ParquetFile(...).read()`` 0 of
1,000 (apache/arrow#33975, #34314). ``tests/test_parquetbytes.py`` keeps it so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["parquet_bytes", "read_parquet_bytes"]


def read_parquet_bytes(data: bytes) -> pa.Table:
    """The table a Parquet file's bytes hold (read before this returns: nothing of it
    is left on another thread)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # on this thread only: no pool thread ever holds the Python buffer (one `make
    # check` in five, under load, had a process of the test below exit non-zero with
    # the threaded read; its output was not kept: see issue 48's note)
    with pq.ParquetFile(pa.BufferReader(data)) as file:
        return file.read(use_threads=False)


def parquet_bytes(
    table: pa.Table, compression: str = "snappy", dictionaries: bool | list[str] = True
) -> bytes:
    """``table`` as a Parquet file's bytes (``dictionaries``: Parquet's dictionary
    encoding for every column, none, or the columns named)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression, use_dictionary=dictionaries)
    return bytes(sink.getvalue())


def text_columns(schema: pa.Schema) -> list[str]:
    """The columns Parquet's dictionary encoding pays off for: text and bytes (and
    Arrow dictionaries). On numbers and times it costs more than it saves — on a join's
    rows (ids, prices, times) zstd Parquet without it was 2.2x faster to write and 40 %
    smaller (``benchmarks/compression.py``, "result files")."""
    import pyarrow as pa

    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
             pa.types.is_large_binary, pa.types.is_dictionary)  # fmt: skip
    return [f.name for f in schema if any(kind(f.type) for kind in kinds)]
