"""Arrow tables held as bytes — an IPC stream, schema and batches — the one way riverbed
writes a table as an object and reads it back (a join's buffered events, a lookup
table's snapshot and its parts, a typed log record batch's values). Its bytes are
Arrow's IPC stream format: the same table gives the same bytes (a snapshot's name is
their hash)."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["ipc_bytes", "read_ipc_bytes"]


def ipc_bytes(table: pa.Table | pa.RecordBatch) -> bytes:
    """``table`` (or one record batch) as an Arrow IPC stream's bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return bytes(sink.getvalue())


def read_ipc_bytes(data: bytes) -> pa.Table:
    """The table an Arrow IPC stream's bytes hold."""
    with pa.ipc.open_stream(pa.BufferReader(data)) as reader:
        return reader.read_all()
