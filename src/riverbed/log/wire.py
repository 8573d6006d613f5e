"""The log server's protocol: what crosses the wire between ``riverbed log serve`` and a
``flight://`` client, as plain data — no sockets here (the pure core of the log server;
:mod:`riverbed.log.server` and :mod:`riverbed.log.flight` are the thin I/O around it).

Records travel as Arrow record batches, one row per record::

    offset int64 (fetches only) | timestamp_ms int64 | key binary | value | headers binary

``value`` is the serde's bytes (``binary``) or, for a typed topic, a struct of the
topic's schema — the columns the file storage keeps, as they are. ``headers`` is a
msgpack map per record, null when a record has none.

Requests (Flight actions, tickets and put descriptors) are JSON objects. Errors carry
their kind in the Flight error's ``extra_info`` so the client raises the same exception
a local log would (:func:`error_info`, :func:`remote_error`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from riverbed.log.base import Damage, PartitionReport, TopicConfig, check_values
from riverbed.log.errors import (
    CorruptLogError,
    GroupError,
    LogError,
    OffsetOutOfRangeError,
    RecordRejectedError,
    SerdeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.records import Columns, RawRecord, as_struct

PROTOCOL = 1  # bumped when a request or a batch's shape changes
PROTOCOL_HEADER = "riverbed-log-protocol"
DEFAULT_PORT = 8815
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
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


def wire_schema(value_type: pa.DataType, with_offsets: bool) -> pa.Schema:
    fields = [pa.field("offset", pa.int64())] if with_offsets else []
    return pa.schema(
        [
            *fields,
            pa.field("timestamp_ms", pa.int64()),
            pa.field("key", pa.binary()),
            pa.field("value", value_type),
            pa.field("headers", pa.binary()),
        ]
    )


def value_type(config: TopicConfig) -> pa.DataType:
    """How a topic's values travel: serde bytes, or a typed topic's struct."""
    if config.schema is None:
        return pa.binary()
    from riverbed.log.schema import schema_of

    schema = schema_of(config.schema)
    assert schema is not None
    return pa.struct(list(schema))


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


def records_batch(
    records: Sequence[RawRecord], typed: pa.RecordBatch | None, offsets: Sequence[int] | None = None
) -> pa.RecordBatch:
    """Records as one wire batch; ``typed`` holds a typed topic's checked values."""
    values: pa.Array
    if typed is not None:
        if typed.num_rows != len(records):
            raise ValueError(f"{typed.num_rows} typed values for {len(records)} records")
        values = as_struct(typed)
    else:
        values = pa.array([r.value for r in records], pa.binary())
    columns = [
        pa.array([r.timestamp_ms for r in records], pa.int64()),
        pa.array([r.key for r in records], pa.binary()),
        values,
        _headers([r.headers for r in records]),
    ]
    schema = wire_schema(values.type, offsets is not None)
    if offsets is not None:
        columns.insert(0, pa.array(offsets, pa.int64()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def batch_records(batch: pa.RecordBatch) -> tuple[list[RawRecord], pa.RecordBatch | None]:
    """The inverse of :func:`records_batch`: records, and a typed topic's values as one
    record batch of its schema (whose records then carry ``None`` as their value)."""
    check_batch(batch, with_offsets=False)
    ts = batch.column("timestamp_ms").to_pylist()
    keys = batch.column("key").to_pylist()
    headers = _headers_of(batch)
    value_col = batch.column("value")
    typed: pa.RecordBatch | None = None
    if pa.types.is_struct(value_col.type):
        typed = pa.RecordBatch.from_struct_array(value_col)
        values: list[Any] = [None] * batch.num_rows
    else:
        values = value_col.to_pylist()
    records = [RawRecord(t, k, v, h) for t, k, v, h in zip(ts, keys, values, headers, strict=True)]
    return records, typed


def read_batch(rows: Sequence[tuple[int, RawRecord]], config: TopicConfig) -> pa.RecordBatch:
    """What a fetch of whole records (``Log.read``) sends: offsets, and headers too."""
    records = [r for _, r in rows]
    typed = check_values(config.name, config.schema, [r.value for r in records], "read")
    return records_batch(records, typed, [o for o, _ in rows])


def batch_rows(batch: pa.RecordBatch) -> list[tuple[int, RawRecord]]:
    """The inverse of :func:`read_batch`."""
    check_batch(batch, with_offsets=True)
    offsets = batch.column("offset").to_pylist()
    headers = _headers_of(batch)
    return [
        (o, RawRecord(t, k, v, h))
        for o, t, k, v, h in zip(
            offsets,
            batch.column("timestamp_ms").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            headers,
            strict=True,
        )
    ]


def columns_batch(columns: Columns) -> pa.RecordBatch:
    """What a columnar fetch (``read_columns``) sends; no headers (columnar readers
    never read them)."""
    n = len(columns)
    schema = wire_schema(columns.values.type, with_offsets=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(columns.offsets, pa.int64()),
            pa.array(columns.timestamps_ms, pa.int64()),
            columns.keys,
            columns.values,
            pa.nulls(n, pa.binary()),
        ],
        schema=schema,
    )


def batch_columns(start: int, batches: Sequence[pa.RecordBatch]) -> Columns:
    """The inverse of :func:`columns_batch`, over a fetch's batches."""
    for b in batches:
        check_batch(b, with_offsets=True)
    batches = [b for b in batches if b.num_rows]
    if not batches:
        empty = pa.array([], pa.binary())
        return Columns(start, np.zeros(0, np.int64), empty, empty)
    offsets = np.concatenate([_int64s(b.column("offset")) for b in batches])
    contiguous = bool(offsets[0] == start) and bool(
        np.array_equal(offsets, np.arange(start, start + len(offsets), dtype=np.int64))
    )
    keys = pa.concat_arrays([b.column("key") for b in batches])
    values = pa.concat_arrays([b.column("value") for b in batches])
    assert isinstance(keys, pa.BinaryArray)
    return Columns(
        start,
        np.concatenate([_int64s(b.column("timestamp_ms")) for b in batches]),
        keys,
        values,
        None if contiguous else offsets.astype(np.int64),
    )


def _int64s(column: pa.Array) -> np.ndarray:
    """An int64 column without nulls as a numpy view of its buffer (``to_numpy`` would
    import pandas, ~0.5 s, in every client process's first fetch)."""
    return np.frombuffer(column.buffers()[1], np.int64, len(column), column.offset * 8)


def check_batch(batch: pa.RecordBatch, with_offsets: bool) -> None:
    """Refuse a batch whose columns are not the wire's, naming what is wrong."""
    expected = ["offset"] if with_offsets else []
    expected += ["timestamp_ms", "key", "value", "headers"]
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
