"""The log server's protocol: what crosses the wire between ``riverbed log serve`` and a
``flight://`` client, as plain data — no sockets here (the pure core of the log server;
:mod:`riverbed.log.server` and :mod:`riverbed.log.flight` are the thin I/O around it).

A produce sends records as Arrow record batches, one row per record::

    timestamp_ms int64 | key binary | value | headers binary

``value`` is the serde's bytes (``binary``) or, for a typed topic, a struct of the
topic's schema. ``headers`` is a msgpack map per record, null when a record has none.
The server writes the columns' buffers into its batch format without a Python object
per record.

A fetch answers with the batches *as stored* (CRC checked by the server), one row
each::

    base_offset int64 | count int64 | body binary

and the client decodes them as a local reader would (:mod:`riverbed.log.records`:
format 2 = Arrow-shaped buffers, format 3 = a typed topic's Arrow IPC) — the way Kafka
brokers ship record batches: the server copies bytes, the readers decode. A fetch
``"as": "columns"`` (a columnar read: the Spark source, the stream engine) is decoded by
the server instead and sent as produce-shaped batches without headers, one per stored
batch with its base offset as the chunk's metadata (:func:`fetched_columns`), so the
client takes Arrow buffers as they arrive and decodes nothing.

Requests (Flight actions, tickets and put descriptors) are JSON objects. Errors carry
their kind in the Flight error's ``extra_info`` so the client raises the same exception
a local log would (:func:`error_info`, :func:`remote_error`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, cast

import msgpack
import numpy as np
import pyarrow as pa

from riverbed.log.base import Damage, PartitionReport
from riverbed.log.errors import (
    CorruptLogError,
    GroupError,
    LogError,
    LogValueError,
    OffsetOutOfRangeError,
    RecordRejectedError,
    SerdeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import ColumnBatch, RawRecord, StoredBatch, as_struct
from riverbed.log.schema import SchemaError

PROTOCOL = 3  # bumped when a request or a batch's shape changes
PROTOCOL_HEADER = "riverbed-log-protocol"
DEFAULT_PORT = 8815
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_FETCH_BYTES = 16 * 1024 * 1024  # a fetch's bound unless the client asks otherwise
SCHEMES = ("flight", "flight+tls")  # the log URLs of a log server


def url_host(host: str) -> str:
    """``host`` as it stands in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


class ProtocolError(LogError):
    """A request or a batch the other side cannot understand."""


class ProduceOutcomeUnknownError(LogError):
    """The connection to the log server broke after a batch was sent and before its
    acknowledgement came back: the batch may or may not have been appended. It is never
    retried silently (that could write it twice); read the partition's end to check."""


class BatchTooLargeError(LogError):
    """A produced batch over the log server's ``max_batch_bytes``."""


class ServerUnavailableError(LogError):
    """The log server could not be reached within the client's reconnect timeout."""


def wire_schema(value_type: pa.DataType) -> pa.Schema:
    """A produced batch's columns, for values of ``value_type``."""
    return pa.schema(
        [
            pa.field("timestamp_ms", pa.int64()),
            pa.field("key", pa.binary()),
            pa.field("value", value_type),
            pa.field("headers", pa.binary()),
        ]
    )


def _headers(rows: Sequence[Any]) -> pa.Array:
    return pa.array(
        [msgpack.packb(dict(h), use_bin_type=True) if h else None for h in rows], pa.binary()
    )


def _headers_of(batch: pa.RecordBatch) -> list[dict[str, bytes]]:
    """The inverse of :func:`_headers`, over a wire batch."""
    return [
        msgpack.unpackb(h, raw=False) if h is not None else {}
        for h in batch.column("headers").to_pylist()
    ]


def records_batch(records: Sequence[RawRecord], typed: pa.RecordBatch | None) -> pa.RecordBatch:
    """Records as one wire batch; ``typed`` holds a typed topic's checked values."""
    values: pa.Array
    if typed is not None:
        if typed.num_rows != len(records):
            raise LogValueError(f"{typed.num_rows} typed values for {len(records)} records")
        values = as_struct(typed)
    else:
        values = pa.array([r.value for r in records], pa.binary())
    return columns_batch(
        ColumnBatch(
            np.array([r.timestamp_ms for r in records], np.int64),
            pa.array([r.key for r in records], pa.binary()),
            values,
            cast(list[dict[str, bytes]], [r.headers for r in records]),  # read, not kept
        )
    )


def columns_batch(batch: ColumnBatch) -> pa.RecordBatch:
    """A batch of columns as one wire batch (what :func:`records_batch` makes of the
    same records), without a Python object per record when it has no headers."""
    headers = (
        _headers(batch.headers) if batch.headers is not None else pa.nulls(len(batch), pa.binary())
    )
    values = batch.values
    columns = [pa.array(batch.timestamps_ms, pa.int64()), batch.keys, values, headers]
    return pa.RecordBatch.from_arrays(columns, schema=wire_schema(values.type))


def batch_columns(batch: pa.RecordBatch) -> ColumnBatch:
    """The inverse of :func:`records_batch`, as columns (what the server appends: no
    Python object per record)."""
    check_batch(batch)
    for name in ("timestamp_ms", "value"):
        if batch.column(name).null_count:
            raise ProtocolError(f"a produced batch has records without a {name}")
    keys = batch.column("key")
    assert isinstance(keys, pa.BinaryArray)
    no_headers = batch.column("headers").null_count == batch.num_rows
    return ColumnBatch(
        _int64s(batch.column("timestamp_ms")),
        keys,
        batch.column("value"),
        None if no_headers else _headers_of(batch),
    )


STORED_SCHEMA = pa.schema(
    [
        pa.field("base_offset", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("body", pa.binary()),
    ]
)


def stored_batch(batches: Sequence[StoredBatch]) -> pa.RecordBatch:
    """What a fetch sends: the stored batches as they are (one row each)."""
    ends = np.zeros(len(batches) + 1, np.int32)
    np.cumsum([len(b.body) for b in batches], out=ends[1:])
    bodies = pa.Array.from_buffers(
        pa.binary(),
        len(batches),
        [None, pa.py_buffer(ends), pa.py_buffer(b"".join(b.body for b in batches))],
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b.base_offset for b in batches], pa.int64()),
            pa.array([b.count for b in batches], pa.int64()),
            bodies,
        ],
        schema=STORED_SCHEMA,
    )


def batch_stored(batch: pa.RecordBatch) -> list[StoredBatch]:
    """The inverse of :func:`stored_batch`; the bodies are views of the batch's buffer."""
    if batch.schema != STORED_SCHEMA:
        raise ProtocolError(
            f"a fetch must have the columns {STORED_SCHEMA.names}, not {batch.schema.names}; "
            "is the client the same riverbed version as the server?"
        )
    n = batch.num_rows
    bodies = batch.column("body")
    ends = np.frombuffer(bodies.buffers()[1], "<i4", n + 1, bodies.offset * 4).tolist()
    data = memoryview(bodies.buffers()[2]) if n else memoryview(b"")
    return [
        StoredBatch(base, count, data[ends[i] : ends[i + 1]])
        for i, (base, count) in enumerate(
            zip(
                _int64s(batch.column("base_offset")).tolist(),
                _int64s(batch.column("count")).tolist(),
                strict=True,
            )
        )
    ]


def fetched_columns(stored: StoredBatch) -> tuple[pa.RecordBatch, bytes]:
    """What a fetch "as columns" sends for a stored batch: its records as a wire batch
    (headers left out: a columnar read has none) and its base offset as the metadata."""
    batch = stored.decode()
    plain = ColumnBatch(batch.timestamps_ms, batch.keys, batch.values, None)
    return columns_batch(plain), str(stored.base_offset).encode()


def columns_fetched(batch: pa.RecordBatch, metadata: Any) -> tuple[int, ColumnBatch]:
    """The inverse of :func:`fetched_columns`: (base offset, the records' columns), the
    columns views of the received buffers."""
    if metadata is None:
        raise ProtocolError("a columnar fetch's batch came without its base offset")
    return int(metadata.to_pybytes() if hasattr(metadata, "to_pybytes") else metadata), (
        batch_columns(batch)
    )


def _int64s(column: pa.Array) -> np.ndarray:
    """An int64 column without nulls as a numpy view of its buffer (``to_numpy`` would
    import pandas, ~0.5 s, in every client process's first fetch)."""
    return np.frombuffer(column.buffers()[1], np.int64, len(column), column.offset * 8)


def check_batch(batch: pa.RecordBatch) -> None:
    """Refuse a produced batch whose columns are not the wire's, naming what is wrong."""
    expected = ["timestamp_ms", "key", "value", "headers"]
    if batch.schema.names != expected:
        raise ProtocolError(
            f"a record batch must have the columns {expected}, not {batch.schema.names}; "
            "is the client the same riverbed version as the server?"
        )


# -- requests ------------------------------------------------------------------------------
def encode(request: dict[str, Any]) -> bytes:
    return json.dumps(request, separators=(",", ":")).encode()


def decode(data: bytes, what: str) -> dict[str, Any]:
    try:
        request = json.loads(data)
    except ValueError:
        raise ProtocolError(f"{what} is not JSON") from None
    if not isinstance(request, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    return request


def report_dict(report: PartitionReport) -> dict[str, Any]:
    return asdict(report)


def report_of(data: dict[str, Any]) -> PartitionReport:
    return PartitionReport(
        **{
            **data,
            "damage": tuple(Damage(**d) for d in data["damage"]),
            "skipped": tuple(Damage(**d) for d in data["skipped"]),
            "index_problems": tuple(data["index_problems"]),
        }
    )


# -- errors --------------------------------------------------------------------------------
_KINDS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        LogError,
        TopicExistsError,
        CorruptLogError,
        SerdeError,
        OffsetOutOfRangeError,
        GroupError,
        ProtocolError,
        BatchTooLargeError,
        LogValueError,
        SchemaError,
        ValueError,
    )
}


def error_info(exc: BaseException) -> bytes:
    """What the client needs to raise ``exc`` again on its side."""
    info: dict[str, Any] = {"kind": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, TopicNotFoundError):
        info["topic"] = exc.topic
    elif isinstance(exc, RecordRejectedError):
        info.update(index=exc.index, field=exc.field, reason=exc.reason)
    elif isinstance(exc, CorruptLogError) and isinstance(exc.damage, Damage):
        info["damage"] = asdict(exc.damage)
    return encode(info)


def remote_error(data: bytes | None, fallback: str) -> Exception:
    """The exception :func:`error_info` described (a :class:`LogError` naming the server
    when it is not one the client knows)."""
    try:
        info = decode(data or b"", "error")
        kind, message = info["kind"], info["message"]
    except (ProtocolError, KeyError):
        return LogError(fallback)
    if kind == "TopicNotFoundError":
        return TopicNotFoundError(info.get("topic", "?"))
    if kind == "RecordRejectedError":
        return RecordRejectedError(
            message, index=info["index"], field=info["field"], reason=info["reason"]
        )
    cls = _KINDS.get(kind)
    if cls is None:
        return LogError(f"the log server failed: {kind}: {message}")
    exc = cls(message)
    if isinstance(exc, CorruptLogError) and "damage" in info:
        exc.damage = Damage(**info["damage"])
    return exc
