"""``riverbed log serve``: a log directory served over Arrow Flight, so producers,
consumers and Spark executors on other machines reach its topics (``flight://``).

One server owns one storage (usually ``file://``; local processes may keep writing the
same directory, the server sees their appends within ~50 ms). What it offers, in
:mod:`riverbed.log.wire`'s shapes:

- ``do_put`` with ``{"op": "append", "topic", "partition"}``: each record batch sent is
  appended as one batch (with the topic's fsync policy) and acknowledged with its base
  offset; a refused batch (bad schema, too large, unknown topic) is answered with an
  error naming it, and the server goes on serving.
- ``do_get`` with ``{"op": "fetch", "topic", "partition", "start", "end", "max_bytes"}``:
  the stored batches holding [start, end), as they are on disk (CRC checked), up to
  ``max_bytes`` (at least one batch); the client decodes them. A fetch at the end may
  wait (``wait_ms``) for the next append instead of the client polling.
- actions: ``hello`` (protocol version), topics (create, config, list, grow), offsets
  (and the first offset at or after a time),
  verify, skip, retention, and ``wait`` — block until one of several partitions has a
  record past a position (consumers wake on an append, they do not poll).

Security: loopback by default; any other address needs a token (``Authorization:
Bearer …`` on every call); TLS when given a certificate and key.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from riverbed.control.errors import UnavailableError
from riverbed.log.base import LogStorage, TopicConfig, values_mismatch
from riverbed.log.errors import LogError
from riverbed.log.records import StoredBatch
from riverbed.log.wire import (
    DEFAULT_FETCH_BYTES,
    DEFAULT_MAX_BATCH_BYTES,
    PROTOCOL,
    PROTOCOL_HEADER,
    STORED_SCHEMA,
    BatchTooLargeError,
    ProtocolError,
    batch_columns,
    decode,
    encode,
    error_info,
    fetched_columns,
    report_dict,
    stored_batch,
    url_host,
    wire_schema,
)
from riverbed.net import is_loopback, port_problem
from riverbed.storage.errors import StorageUnavailableError

log = logging.getLogger(__name__)

MAX_WAIT_MS = 30_000
MAX_FETCH_BYTES = 256 * 1024 * 1024  # what one fetch may ask for
_CHUNK_BYTES = 1 << 20  # a fetch is streamed in record batches of about this size
_M_TRIM_THRESHOLD, _M_TOP_PAD = -1, -2  # glibc's mallopt parameters
_POLL_S = 0.05  # how often a waiting call re-reads offsets (appends by other processes)


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory instead of handing it back at once: a
    fetch allocates and frees megabytes, and returning them to the kernel each time
    costs a page fault per 4 KiB on the next one (~5 ms of system time per 5 MB fetch,
    measured). For the server process only — a daemon that owns its heap; whether it
    took (False off glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_TRIM_THRESHOLD, 512 << 20)) and bool(
            libc.mallopt(_M_TOP_PAD, 64 << 20)
        )
    except (OSError, AttributeError):
        return False


def check_bind(host: str, token: str | None) -> None:
    """A non-loopback address without a token would hand the log to anyone who can
    reach the machine: refuse it."""
    if not is_loopback(host) and not token:
        raise LogError(
            f"refusing to serve the log on {host} without a token: anyone who reaches this "
            "machine could read and write every topic. Pass --token (or set "
            "RIVERBED_LOG_TOKEN), or bind 127.0.0.1"
        )


def _check_free(host: str, port: int) -> None:
    """Name a taken port or a foreign address before gRPC does (it only says "Server did
    not start properly", on stderr)."""
    problem = port_problem(host, port)
    if problem:
        raise LogError(f"cannot serve the log on {host}:{port}: {problem}")


def _refuse(exc: BaseException) -> flight.FlightServerError:
    """``exc`` as the Flight error a client turns back into the same exception."""
    return flight.FlightServerError(str(exc), extra_info=error_info(exc))


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """A request's bad input, as one error the client can name (the server goes on)."""
    try:
        yield
    except flight.FlightError:
        raise
    except (
        LogError,
        ValueError,
        KeyError,
        TypeError,
        UnavailableError,
        StorageUnavailableError,
    ) as exc:
        if _cut_off(exc):
            # this server cannot reach the control plane or the bucket (cut off from
            # them?): another server of the client's list may — unavailable is what
            # moves it on (a retried append is recognised by its producer id and
            # sequence; a client without them is told the outcome is unknown)
            raise flight.FlightUnavailableError(f"this log server is cut off: {exc}") from None
        raise _refuse(exc) from None


def _cut_off(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised because of, the control plane or the bucket out
    of this server's reach (a diskless flush's failed commit says why in its cause)."""
    while exc is not None:
        if isinstance(exc, (UnavailableError, StorageUnavailableError)):
            return True
        exc = exc.__cause__
    return False


def _chunk(stored: Iterator[StoredBatch]) -> tuple[pa.RecordBatch | None, bool]:
    """The next ~``_CHUNK_BYTES`` of a fetch's batches as one record batch (None: none
    left), and whether that was the last of them."""
    batches: list[StoredBatch] = []
    size = 0
    last = True
    for batch in stored:
        batches.append(batch)
        size += len(batch.body)
        if size >= _CHUNK_BYTES:
            last = False
            break
    return (stored_batch(batches) if batches else None), last


def _chunks(first: pa.RecordBatch, stored: Iterator[StoredBatch]) -> Iterator[pa.RecordBatch]:
    """A fetch streamed in chunks: the client decodes one while the next is read and
    sent."""
    chunk: pa.RecordBatch | None = first
    with _refusals():  # damage met mid-stream reaches the client as the same error
        while chunk is not None:
            yield chunk
            chunk, _ = _chunk(stored)


def _column_stream(stored: Iterator[StoredBatch]) -> flight.FlightDataStream:
    """A fetch "as columns": each stored batch decoded here and sent as a wire batch with
    its base offset as the chunk's metadata (:func:`~riverbed.log.wire.fetched_columns`).
    The first is read and decoded before streaming starts, so a bad offset or a damaged
    batch is refused as a plain fetch's is; a typed topic whose schema changes mid-fetch
    ends the stream there (the client fetches on from where it got to)."""
    first = next(stored, None)
    if first is None:
        return flight.RecordBatchStream(pa.Table.from_batches([], wire_schema(pa.binary())))
    batch, base = fetched_columns(first)
    schema = batch.schema

    def chunks() -> Iterator[tuple[pa.RecordBatch, pa.Buffer]]:
        with _refusals():  # damage met mid-stream reaches the client as the same error
            yield batch, pa.py_buffer(base)
            for more in stored:
                decoded, at = fetched_columns(more)
                if decoded.schema != schema:
                    return
                yield decoded, pa.py_buffer(at)

    return flight.GeneratorStream(schema, chunks())


class _Gate(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Every call: the client speaks this protocol, and carries the token if one is set."""

    def __init__(self, token: str | None) -> None:
        self._expected = f"Bearer {token}".encode() if token else None

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
        if self._expected is not None:
            given = (headers.get("authorization") or [""])[0].encode()
            if not hmac.compare_digest(given, self._expected):
                raise flight.FlightUnauthenticatedError(
                    "the log server refused the call: wrong or missing token; pass the "
                    "server's token (RIVERBED_LOG_TOKEN or ?token= in the flight:// URL)"
                )
        spoken = (headers.get(PROTOCOL_HEADER) or ["none"])[0]
        if spoken != str(PROTOCOL):
            raise _refuse(
                ProtocolError(
                    f"this log server speaks riverbed log protocol {PROTOCOL}, the client "
                    f"{spoken}; use the same riverbed version on both sides"
                )
            )
        return None


@dataclass
class _Ends:
    """What the server knows of a partition's end, and when it last looked."""

    end: int
    seen: float


class LogServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves ``storage`` from background threads as soon as it is made;
    ``shutdown()`` stops it."""

    def __init__(
        self,
        storage: LogStorage,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        tls: tuple[bytes, bytes] | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        check_bind(host, token)
        _check_free(host, port)
        # pyarrow imports pandas on its first pa.array (~0.5-1 s): pay that before serving,
        # not inside the first client's fetch or append
        pa.array([0], pa.int64())
        scheme = "grpc+tls" if tls else "grpc+tcp"
        try:
            super().__init__(
                f"{scheme}://{url_host(host)}:{port}",
                middleware={"gate": _Gate(token)},
                tls_certificates=[tls] if tls else None,
            )
        except pa.ArrowException as exc:
            raise LogError(f"cannot serve the log on {host}:{port}: {exc}") from None
        self.storage = storage
        self.host = host
        self.tls = tls is not None
        self.max_batch_bytes = max_batch_bytes
        self._cond = threading.Condition()
        self._ends: dict[tuple[str, int], _Ends] = {}

    @property
    def url(self) -> str:
        scheme = "flight+tls" if self.tls else "flight"
        return f"{scheme}://{url_host(self.host)}:{self.port}"

    # -- appends ------------------------------------------------------------------------
    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        with _refusals():
            request = decode(descriptor.command, "a put's descriptor")
            if request.get("op") != "append":
                raise ProtocolError(f"unknown put {request.get('op')!r}")
            topic, partition = str(request["topic"]), int(request["partition"])
            config = self.storage.topic_config(topic)
            for chunk in reader:
                batch = chunk.data
                self._check_put(config, batch)
                columns = batch_columns(batch)
                if request.get("producer") is not None and self.storage.idempotent:
                    # a client's retry of this sequence, here or on another server,
                    # gets the offsets of the first append instead of a second copy
                    producer, sequence = str(request["producer"]), int(request["sequence"])
                    base = self.storage.append_once(topic, partition, columns, producer, sequence)
                    request["sequence"] = sequence + 1  # a stream's next batch
                else:
                    base = self.storage.append_columns(topic, partition, columns)
                self._appended(topic, partition, base + batch.num_rows)
                writer.write(pa.py_buffer(encode({"base": base, "count": batch.num_rows})))

    def _check_put(self, config: TopicConfig, batch: pa.RecordBatch) -> None:
        if batch.nbytes > self.max_batch_bytes:
            raise BatchTooLargeError(
                f"a batch of {batch.nbytes:,} bytes for topic '{config.name}' is over this "
                f"server's limit of {self.max_batch_bytes:,} bytes; send smaller batches "
                "(or start the server with a larger --max-batch-bytes)"
            )
        got = batch.schema.field("value").type if "value" in batch.schema.names else None
        problem = values_mismatch(config, got)
        if problem:
            raise ProtocolError(problem)

    def _appended(self, topic: str, partition: int, end: int) -> None:
        with self._cond:
            known = self._ends.get((topic, partition))
            if known is None or known.end < end:
                self._ends[(topic, partition)] = _Ends(end, time.monotonic())
            self._cond.notify_all()

    # -- reads --------------------------------------------------------------------------
    def do_get(self, context: Any, ticket: Any) -> flight.FlightDataStream:
        with _refusals():
            request = decode(ticket.ticket, "a ticket")
            if request.get("op") != "fetch":
                raise ProtocolError(f"unknown ticket {request.get('op')!r}")
            topic, partition = str(request["topic"]), int(request["partition"])
            start, end = int(request["start"]), int(request["end"])
            max_bytes = min(int(request.get("max_bytes", DEFAULT_FETCH_BYTES)), MAX_FETCH_BYTES)
            wait_ms = min(int(request.get("wait_ms", 0)), MAX_WAIT_MS)
            self.storage.topic_config(topic)  # names an unknown topic
            if wait_ms > 0:
                self.wait({(topic, partition): start}, wait_ms / 1000)
            stored = self.storage.read_stored(topic, partition, start, end, max(1, max_bytes))
            if request.get("as") == "columns":
                return _column_stream(stored)
            first, last = _chunk(stored)  # a bad offset is refused here, before streaming
        if first is None or last:  # all of it (most tailing reads): sent at once
            return flight.RecordBatchStream(
                pa.Table.from_batches([] if first is None else [first], STORED_SCHEMA)
            )
        return flight.GeneratorStream(STORED_SCHEMA, _chunks(first, stored))

    # -- waiting ------------------------------------------------------------------------
    def _refresh(self, positions: dict[tuple[str, int], int], force: bool) -> None:
        """Re-read from the storage the ends this server has not seen lately (appends by
        other processes), outside the lock appends notify through."""
        now = time.monotonic()
        for tp in positions:
            known = self._ends.get(tp)
            if force or known is None or now - known.seen >= _POLL_S:
                end = self.storage.offsets(*tp)[1]
                with self._cond:
                    known = self._ends.get(tp)
                    self._ends[tp] = _Ends(max(end, known.end if known else 0), now)

    def wait(self, positions: dict[tuple[str, int], int], timeout: float) -> list[tuple[str, int]]:
        """The partitions of ``positions`` that hold a record at or past their position,
        waiting up to ``timeout`` seconds for one to (woken by this server's appends;
        appends by other processes are seen within ``_POLL_S``)."""
        deadline = time.monotonic() + timeout
        force = True
        while True:
            self._refresh(positions, force)
            with self._cond:
                ready = [tp for tp, o in positions.items() if self._ends[tp].end > o]
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return ready
                force = not self._cond.wait(min(left, _POLL_S))

    # -- everything else ----------------------------------------------------------------
    def do_action(self, context: Any, action: Any) -> Iterator[flight.Result]:
        with _refusals():
            request = decode(action.body.to_pybytes(), f"action {action.type!r}")
            result = self._act(action.type, request)
        return iter([flight.Result(pa.py_buffer(encode({"result": result})))])

    def _act(self, kind: str, r: dict[str, Any]) -> Any:
        s = self.storage
        if kind == "hello":
            return {
                "protocol": PROTOCOL,
                "storage": s.url,
                "max_batch_bytes": self.max_batch_bytes,
                "idempotent": s.idempotent,
            }
        if kind == "create_topic":
            config = TopicConfig.from_dict(r["config"])
            s.create_topic(config)
            return config.to_dict()
        if kind == "topic_config":
            return s.topic_config(str(r["topic"])).to_dict()
        if kind == "list_topics":
            return s.list_topics()
        if kind == "set_partitions":
            return s.set_partitions(str(r["topic"]), int(r["partitions"])).to_dict()
        if kind == "offsets":
            topic = str(r["topic"])
            return [list(s.offsets(topic, int(p))) for p in r["partitions"]]
        if kind == "offset_for_time":
            topic, partition = str(r["topic"]), int(r["partition"])
            return s.offset_for_time(topic, partition, int(r["timestamp_ms"]))
        if kind == "size":
            return s.size(str(r["topic"]), int(r["partition"]))
        if kind == "verify":
            reports = s.verify(str(r["topic"]), bool(r.get("rebuild_indexes", False)))
            return [report_dict(x) for x in reports]
        if kind == "skip":
            config = s.skip(
                str(r["topic"]), int(r["partition"]), int(r["start"]), int(r["end"]), r["reason"]
            )
            return config.to_dict()
        if kind == "enforce_retention":
            return s.enforce_retention(str(r["topic"]))
        if kind == "object_stats":
            return s.object_stats()
        if kind == "wait":
            positions = {(str(t), int(p)): int(o) for t, p, o in r["positions"]}
            timeout = min(float(r.get("timeout_ms", 0)), MAX_WAIT_MS) / 1000
            return [list(tp) for tp in self.wait(positions, timeout)]
        raise ProtocolError(f"unknown action {kind!r}")

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("hello", "protocol version and storage"),
            ("wait", "block until one of several partitions has a record past a position"),
            ("size", "bytes one partition takes in the server's storage"),
        ]
