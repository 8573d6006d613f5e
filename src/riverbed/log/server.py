"""``riverbed log serve``: a log directory served over Arrow Flight, so producers,
consumers and Spark executors on other machines reach its topics (``flight://``).

One server owns one storage (usually ``file://``; local processes may keep writing the
same directory, the server sees their appends within ~50 ms). What it offers, in
:mod:`riverbed.log.wire`'s shapes:

- ``do_put`` with ``{"op": "append", "topic", "partition"}``: each record batch sent is
  appended as one batch (with the topic's fsync policy) and acknowledged with its base
  offset; a refused batch (bad schema, too large, unknown topic) is answered with an
  error naming it, and the server goes on serving.
- ``do_get`` with ``{"op": "read" | "columns", ...}``: whole records (``Log.read``) or
  columns (``read_columns``, what the Spark source and the stream path read); a read at
  the end may wait (``wait_ms``) for the next append instead of the client polling.
- actions: ``hello`` (protocol version), topics (create, config, list, grow), offsets,
  verify, skip, retention, and ``wait`` — block until one of several partitions has a
  record past a position (consumers wake on an append, they do not poll).

Security: loopback by default; any other address needs a token (``Authorization:
Bearer …`` on every call); TLS when given a certificate and key.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from riverbed.log.base import LogStorage, TopicConfig
from riverbed.log.errors import LogError
from riverbed.log.wire import (
    DEFAULT_MAX_BATCH_BYTES,
    PROTOCOL,
    PROTOCOL_HEADER,
    BatchTooLargeError,
    ProtocolError,
    batch_records,
    columns_batch,
    config_dict,
    decode,
    encode,
    error_info,
    read_batch,
    report_dict,
    value_type,
)

log = logging.getLogger(__name__)

MAX_WAIT_MS = 30_000
_ROWS_PER_MESSAGE = 65_536
_POLL_S = 0.05  # how often a waiting call re-reads offsets (appends by other processes)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
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
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            hint = (
                "is another server using the port? pick another --port (0: any free one)"
                if exc.errno == errno.EADDRINUSE
                else f"is {host} an address of this machine? (0.0.0.0: every address)"
            )
            raise LogError(
                f"cannot serve the log on {host}:{port}: {exc.strerror or exc}; {hint}"
            ) from None


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
            exc = ProtocolError(
                f"this log server speaks riverbed log protocol {PROTOCOL}, the client "
                f"{spoken}; use the same riverbed version on both sides"
            )
            raise flight.FlightServerError(str(exc), extra_info=error_info(exc))
        return None


def _refuse(exc: BaseException) -> flight.FlightServerError:
    return flight.FlightServerError(str(exc), extra_info=error_info(exc))


@dataclass
class _Ends:
    """What the server knows of a partition's end, and when it last looked."""

    end: int
    seen: float


class LogServer(flight.FlightServerBase):  # type: ignore[misc]
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
        scheme = "grpc+tls" if tls else "grpc+tcp"
        bind = f"[{host}]" if ":" in host else host
        try:
            super().__init__(
                f"{scheme}://{bind}:{port}",
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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    # -- appends ------------------------------------------------------------------------
    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        try:
            request = decode(descriptor.command, "a put's descriptor")
            if request.get("op") != "append":
                raise ProtocolError(f"unknown put {request.get('op')!r}")
            topic, partition = str(request["topic"]), int(request["partition"])
            config = self.storage.topic_config(topic)
            expected = value_type(config)
            for chunk in reader:
                batch = chunk.data
                self._check_put(config, expected, batch)
                records, typed = batch_records(batch)
                base = self.storage.append(topic, partition, records, typed)
                self._appended(topic, partition, base + len(records))
                writer.write(pa.py_buffer(encode({"base": base, "count": len(records)})))
        except flight.FlightError:
            raise
        except (LogError, ValueError, KeyError, TypeError) as exc:
            raise _refuse(exc) from None

    def _check_put(self, config: TopicConfig, expected: pa.DataType, batch: pa.RecordBatch) -> None:
        if batch.nbytes > self.max_batch_bytes:
            raise BatchTooLargeError(
                f"a batch of {batch.nbytes:,} bytes for topic '{config.name}' is over this "
                f"server's limit of {self.max_batch_bytes:,} bytes; send smaller batches "
                "(or start the server with a larger --max-batch-bytes)"
            )
        got = batch.schema.field("value").type if "value" in batch.schema.names else None
        if got != expected:
            what = f"typed ({config.schema})" if config.schema else "untyped (serde bytes)"
            raise ProtocolError(
                f"topic '{config.name}' is {what}, but this batch's values are {got}; the "
                "client's view of the topic is out of date: open the log again"
            )

    def _appended(self, topic: str, partition: int, end: int) -> None:
        with self._cond:
            known = self._ends.get((topic, partition))
            if known is None or known.end < end:
                self._ends[(topic, partition)] = _Ends(end, time.monotonic())
            self._cond.notify_all()

    # -- reads --------------------------------------------------------------------------
    def do_get(self, context: Any, ticket: Any) -> flight.RecordBatchStream:
        try:
            request = decode(ticket.ticket, "a ticket")
            op = request.get("op")
            topic, partition = str(request["topic"]), int(request["partition"])
            config = self.storage.topic_config(topic)
            if op == "read":
                offset, max_records = int(request["offset"]), int(request["max_records"])
                wait_ms = min(int(request.get("wait_ms", 0)), MAX_WAIT_MS)
                if wait_ms > 0:
                    self.wait({(topic, partition): offset}, wait_ms / 1000)
                rows = self.storage.read(topic, partition, offset, max_records)
                batch = read_batch(rows, config)
            elif op == "columns":
                start, end = int(request["start"]), int(request["end"])
                batch = columns_batch(self.storage.read_columns(topic, partition, start, end))
            else:
                raise ProtocolError(f"unknown ticket {op!r}")
        except flight.FlightError:
            raise
        except (LogError, ValueError, KeyError, TypeError) as exc:
            raise _refuse(exc) from None
        if batch.num_rows == 0:
            return flight.RecordBatchStream(pa.Table.from_batches([], batch.schema))
        pieces = [
            batch.slice(i, _ROWS_PER_MESSAGE) for i in range(0, batch.num_rows, _ROWS_PER_MESSAGE)
        ]
        return flight.RecordBatchStream(pa.Table.from_batches(pieces, batch.schema))

    # -- waiting ------------------------------------------------------------------------
    def _end(self, topic: str, partition: int, fresh: bool) -> int:
        key = (topic, partition)
        known = self._ends.get(key)
        now = time.monotonic()
        if known is None or fresh or now - known.seen >= _POLL_S:
            end = self.storage.offsets(topic, partition)[1]
            known = _Ends(max(end, known.end if known else 0), now)
            self._ends[key] = known
        return known.end

    def wait(self, positions: dict[tuple[str, int], int], timeout: float) -> list[tuple[str, int]]:
        """The partitions of ``positions`` that hold a record at or past their position,
        waiting up to ``timeout`` seconds for one to (woken by this server's appends;
        appends by other processes are seen within ``_POLL_S``)."""
        deadline = time.monotonic() + timeout
        fresh = True
        with self._cond:
            while True:
                ready = [tp for tp, o in positions.items() if self._end(*tp, fresh=fresh) > o]
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return ready
                fresh = not self._cond.wait(min(left, _POLL_S))

    # -- everything else ----------------------------------------------------------------
    def do_action(self, context: Any, action: Any) -> Iterator[flight.Result]:
        try:
            request = decode(action.body.to_pybytes(), f"action {action.type!r}")
            result = self._act(action.type, request)
        except flight.FlightError:
            raise
        except (LogError, ValueError, KeyError, TypeError) as exc:
            raise _refuse(exc) from None
        return iter([flight.Result(pa.py_buffer(encode({"result": result})))])

    def _act(self, kind: str, r: dict[str, Any]) -> Any:
        s = self.storage
        if kind == "hello":
            return {"protocol": PROTOCOL, "storage": s.url, "max_batch_bytes": self.max_batch_bytes}
        if kind == "create_topic":
            config = TopicConfig.from_dict(r["config"])
            s.create_topic(config)
            return config_dict(config)
        if kind == "topic_config":
            return config_dict(s.topic_config(str(r["topic"])))
        if kind == "list_topics":
            return s.list_topics()
        if kind == "set_partitions":
            return config_dict(s.set_partitions(str(r["topic"]), int(r["partitions"])))
        if kind == "offsets":
            topic = str(r["topic"])
            return [list(s.offsets(topic, int(p))) for p in r["partitions"]]
        if kind == "verify":
            reports = s.verify(str(r["topic"]), bool(r.get("rebuild_indexes", False)))
            return [report_dict(x) for x in reports]
        if kind == "skip":
            config = s.skip(
                str(r["topic"]), int(r["partition"]), int(r["start"]), int(r["end"]), r["reason"]
            )
            return config_dict(config)
        if kind == "enforce_retention":
            return s.enforce_retention(str(r["topic"]))
        if kind == "wait":
            positions = {(str(t), int(p)): int(o) for t, p, o in r["positions"]}
            timeout = min(float(r.get("timeout_ms", 0)), MAX_WAIT_MS) / 1000
            return [list(tp) for tp in self.wait(positions, timeout)]
        raise ProtocolError(f"unknown action {kind!r}")

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("hello", "protocol version and storage"),
            ("wait", "block until one of several partitions has a record past a position"),
        ]


def serve(
    storage: LogStorage,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    tls: tuple[bytes, bytes] | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> LogServer:
    """Start serving ``storage`` in background threads; ``server.shutdown()`` stops."""
    return LogServer(storage, host, port, token=token, tls=tls, max_batch_bytes=max_batch_bytes)
