"""``flight://host:port``: the log of a ``riverbed log serve`` on another machine, behind
the same :class:`~riverbed.log.LogStorage` interface as ``file://`` and ``memory://`` —
so producers, readers, consumer groups (coordinated by the control plane as ever) and the
Spark source work unchanged.

URL options: ``flight+tls://`` for TLS (``?ca=/path/ca.pem`` to trust a private CA);
``?token=…`` (or ``RIVERBED_LOG_TOKEN``); ``?reconnect=30`` seconds to keep retrying a
server that is down (default 30). Servers of diskless topics (``riverbed log serve
--store s3://…``) are interchangeable: ``flight://host1:8815,host2:8815,host3:8815``
names several, and a call that cannot reach one goes to the next.

Failures: reads and metadata calls are retried until a server is back (they change
nothing). An append carries this client's producer id and a sequence number; servers of
diskless topics recognise a retried one (:meth:`~riverbed.log.LogStorage.append_once`),
so an append whose connection broke after the batch was sent is retried — on the next
server of the list — and written once. Other servers cannot, so there an append is
retried only when the server could not be reached at all; when the connection breaks
after the batch was sent, the append raises
:class:`~riverbed.log.wire.ProduceOutcomeUnknownError` — it is never retried into a
duplicate.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from riverbed.config import inherited
from riverbed.log.base import (
    LogStorage,
    PartitionReport,
    TopicConfig,
    check_column_values,
    typed_values,
)
from riverbed.log.errors import LogError, LogValueError
from riverbed.log.records import (
    ColumnBatch,
    Columns,
    RawRecord,
    StoredBatch,
    columns_from,
    rows_from,
)
from riverbed.log.wire import (
    DEFAULT_FETCH_BYTES,
    DEFAULT_PORT,
    PROTOCOL,
    PROTOCOL_HEADER,
    SCHEMES,
    ProduceOutcomeUnknownError,
    ServerUnavailableError,
    batch_stored,
    columns_batch,
    columns_fetched,
    decode,
    encode,
    records_batch,
    remote_error,
    report_of,
    url_host,
)

T = TypeVar("T")
_CONFIG_TTL_S = 1.0  # how long a topic's configuration is trusted before asking again
# With a list of servers, a server that stops answering (its host lost, cut off) must be
# noticed mid-call to move on to the next: gRPC keepalive pings after 5 s without
# traffic, and a connection whose ping goes unanswered for 3 s fails the call
# (UNAVAILABLE; retried on the next server). A server takes pings on a connection that
# saw no data as abuse (gRPC's default: one per 5 minutes, then GOAWAY "too many
# pings"), so a long poll is asked of a server in slices of at most _POLL_S, each
# answered: a waiting call is never silent long enough to ping (measured on a test
# bed: 15 polls of 2 s in 30 s, no GOAWAY; a partitioned server noticed in 2 s).
_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.http2.max_pings_without_data", 0),
]
_POLL_S = 2.0


class _Broken(Exception):
    """A fetch's stream broke after it began (it is fetched again from where it got)."""


def _not_reached(exc: BaseException) -> bool:
    """The call never reached the server (nothing it carried can have been applied)."""
    text = str(exc).lower()
    return isinstance(exc, flight.FlightUnavailableError) and (
        "failed to connect" in text or "connection refused" in text
    )


log = logging.getLogger(__name__)


class FlightLogStorage(LogStorage):
    waits = True
    columnar = True  # a produced batch goes as columns on the wire anyway

    def __init__(self, url: str, resolve: Callable[[], list[str]] | None = None) -> None:
        """``resolve``: where the servers are now (``host:port``), asked when none of the
        list could be reached (``riverbed://``, :mod:`riverbed.log.discovery`)."""
        parts = urlsplit(url)
        self._resolve = resolve
        self._grpc = "grpc+tls" if parts.scheme == "flight+tls" else "grpc+tcp"
        if parts.scheme not in SCHEMES:
            raise LogError(f"not a log server URL: {url!r}; e.g. flight://host:8815")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        grpc = "grpc+tls" if parts.scheme == "flight+tls" else "grpc+tcp"
        servers = [_server(item, url) for item in parts.netloc.split(",")]
        # any server of a list serves the same diskless topics: calls go to one, and
        # move on to the next when it cannot be reached
        self._locations = [f"{grpc}://{server}" for server in servers]
        # each client starts at a server of its own: load spreads, and a lost server
        # stalls only the clients that were on it
        self._current = random.randrange(len(self._locations))  # noqa: S311 - not a secret
        # the URL others see: without the token
        self.url = f"{parts.scheme}://{','.join(servers)}"
        token = query.get("token") or inherited("RIVERBED_LOG_TOKEN")
        self._ca = Path(query["ca"]).read_bytes() if "ca" in query else None
        try:
            self._reconnect_s = float(query.get("reconnect", 30))
        except ValueError:
            raise LogError(f"?reconnect= in {url!r} must be seconds, e.g. 30") from None
        headers = [(PROTOCOL_HEADER.encode(), str(PROTOCOL).encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        self._headers = headers
        self._lock = threading.Lock()
        self._client: flight.FlightClient | None = None
        self._configs: dict[str, tuple[float, TopicConfig]] = {}
        # a retried append carries the same (producer, sequence): a server of diskless
        # topics writes it once (LogStorage.append_once), whichever server gets it
        self._producer = uuid.uuid4().hex[:16]
        self._sequences = itertools.count()
        self._idempotent: bool | None = None

    # -- the connection -----------------------------------------------------------------
    def _connected(self) -> flight.FlightClient:
        with self._lock:
            if self._client is None:
                kwargs: dict[str, Any] = {}
                if self._ca is not None:
                    kwargs["tls_root_certs"] = self._ca
                if len(self._locations) > 1:
                    kwargs["generic_options"] = _KEEPALIVE
                self._client = flight.connect(self._locations[self._current], **kwargs)
            return self._client

    def _drop(self, client: flight.FlightClient) -> None:
        """Forget a connection that failed, so the next call dials afresh (gRPC's own
        reconnect backs off for up to two minutes) — the next server of a list."""
        with self._lock:
            if self._client is client:
                self._client = None
                self._current = (self._current + 1) % len(self._locations)
        with contextlib.suppress(Exception):  # closing a broken connection may fail too
            client.close()

    def _rediscover(self) -> None:
        """Ask where the servers are now (``resolve``), when none answered: a server
        moved or replaced is found without a new URL."""
        if self._resolve is None:
            return
        try:
            servers = self._resolve()
        except Exception as exc:  # the control plane out of reach too: keep the list
            log.debug("log servers not rediscovered: %s", exc)
            return
        with self._lock:
            self._locations = [f"{self._grpc}://{server}" for server in servers]
            self._current = random.randrange(len(self._locations))  # noqa: S311
            self._client = None
            self.url = f"{urlsplit(self.url).scheme}://{','.join(servers)}"

    def _options(self, timeout: float | None = None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(headers=self._headers, timeout=timeout)

    def _call(self, fn: Callable[[flight.FlightClient], T], *, idempotent: bool = True) -> T:
        deadline = time.monotonic() + self._reconnect_s
        delay = 0.05
        for attempt in itertools.count(1):
            client = self._connected()
            try:
                return fn(client)
            except flight.FlightUnauthenticatedError as exc:
                raise LogError(_first_line(exc)) from None
            except (flight.FlightServerError, flight.FlightInternalError) as exc:
                raise remote_error(exc.extra_info, _first_line(exc)) from None
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as exc:
                self._drop(client)
                if not idempotent and not _not_reached(exc):
                    raise ProduceOutcomeUnknownError(
                        f"the connection to the log server {self.url} broke after a batch "
                        "was sent; it may or may not have been appended (it is not retried, "
                        "so it is never written twice); check the partition's end offset "
                        f"({_first_line(exc)})"
                    ) from None
                if time.monotonic() >= deadline:
                    raise ServerUnavailableError(
                        f"the log server {self.url} cannot be reached "
                        f"(tried for {self._reconnect_s:g} s): {_first_line(exc)}; is "
                        "`riverbed log serve` running there?"
                    ) from None
                if attempt % len(self._locations) == 0:  # every server tried: back off
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    self._rediscover()
        raise AssertionError("unreachable")  # pragma: no cover

    def _act(self, kind: str, request: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        body = encode(request or {})

        def run(client: flight.FlightClient) -> Any:
            results = list(client.do_action(flight.Action(kind, body), self._options(timeout)))
            return decode(results[0].body.to_pybytes(), "a reply")["result"]

        return self._call(run)

    def hello(self) -> dict[str, Any]:
        result: dict[str, Any] = self._act("hello")
        return result

    # -- topics -------------------------------------------------------------------------
    def create_topic(self, config: TopicConfig) -> None:
        self._act("create_topic", {"config": config.to_dict()})

    def topic_config(self, name: str) -> TopicConfig:
        cached = self._configs.get(name)
        if cached is not None and time.monotonic() - cached[0] < _CONFIG_TTL_S:
            return cached[1]
        return self._remember(self._act("topic_config", {"topic": name}))

    def _remember(self, data: dict[str, Any]) -> TopicConfig:
        config = TopicConfig.from_dict(data)
        self._configs[config.name] = (time.monotonic(), config)
        return config

    def list_topics(self) -> list[str]:
        topics: list[str] = self._act("list_topics")
        return topics

    def set_partitions(self, name: str, partitions: int) -> TopicConfig:
        request = {"topic": name, "partitions": partitions}
        return self._remember(self._act("set_partitions", request))

    def skip(self, topic: str, partition: int, start: int, end: int, reason: str) -> TopicConfig:
        request = {"topic": topic, "partition": partition, "start": start, "end": end}
        return self._remember(self._act("skip", {**request, "reason": reason}))

    def verify(self, topic: str, rebuild_indexes: bool = False) -> list[PartitionReport]:
        reports = self._act("verify", {"topic": topic, "rebuild_indexes": rebuild_indexes}, 3600)
        return [report_of(r) for r in reports]

    def enforce_retention(self, topic: str) -> int:
        removed: int = self._act("enforce_retention", {"topic": topic})
        return removed

    # -- records ------------------------------------------------------------------------
    def append(
        self, topic: str, partition: int, records: Sequence[RawRecord], typed: Any = None
    ) -> int:
        config = self.topic_config(topic)
        typed = typed_values(topic, config, records, typed)  # checked here, not after a trip
        return self._send(topic, partition, records_batch(records, typed))

    def append_columns(self, topic: str, partition: int, batch: ColumnBatch) -> int:
        if not len(batch):
            raise LogValueError("cannot append an empty batch")
        check_column_values(self.topic_config(topic), batch.values)
        return self._send(topic, partition, columns_batch(batch))

    @property
    def idempotent(self) -> bool:  # type: ignore[override]
        """Whether the servers recognise a retried batch (servers of diskless topics)."""
        if self._idempotent is None:
            self._idempotent = bool(self.hello().get("idempotent"))
        return self._idempotent

    def append_once(
        self, topic: str, partition: int, batch: ColumnBatch, producer: str, sequence: int
    ) -> int:
        if not self.idempotent:
            return super().append_once(topic, partition, batch, producer, sequence)
        if not len(batch):
            raise LogValueError("cannot append an empty batch")
        check_column_values(self.topic_config(topic), batch.values)
        return self._send(topic, partition, columns_batch(batch), (producer, sequence))

    def _send(
        self,
        topic: str,
        partition: int,
        batch: pa.RecordBatch,
        once: tuple[str, int] | None = None,
    ) -> int:
        """One produced wire batch to the server; the base offset it acknowledges.
        ``once``: the caller's (producer, sequence) instead of this client's own."""
        request: dict[str, Any] = {"op": "append", "topic": topic, "partition": partition}
        if once is not None:
            request |= {"producer": once[0], "sequence": once[1]}
        elif self.idempotent:
            request |= {"producer": self._producer, "sequence": next(self._sequences)}
        descriptor = flight.FlightDescriptor.for_command(encode(request))

        def run(client: flight.FlightClient) -> int:
            writer, acks = client.do_put(descriptor, batch.schema, self._options(60))
            try:
                writer.write_batch(batch)
                writer.done_writing()
                ack = acks.read()
            finally:
                writer.close()  # raises the server's refusal, if any
            if ack is None:
                raise ProduceOutcomeUnknownError(
                    f"the log server {self.url} closed the append without acknowledging it"
                )
            base: int = decode(ack.to_pybytes(), "an acknowledgement")["base"]
            return base

        return self._call(run, idempotent=self.idempotent)

    def read(
        self, topic: str, partition: int, offset: int, max_records: int, wait: float = 0
    ) -> list[tuple[int, RawRecord]]:
        """Up to ``max_records`` records from ``offset`` — what one fetch brings (fewer
        when they are over its byte bound); at the end, the server waits up to ``wait``
        seconds for an append."""
        fetched = self.fetch(topic, partition, offset, offset + max_records, wait=wait)
        return rows_from(((s.base_offset, s.decode()) for s in fetched), offset, max_records)

    def read_waiting(
        self, topic: str, partition: int, offset: int, max_records: int, wait: float
    ) -> list[tuple[int, RawRecord]]:
        return self.read(topic, partition, offset, max_records, wait=wait)  # one fetch

    def read_columns(self, topic: str, partition: int, start: int, end: int) -> Columns:
        return columns_from(self._fetched(topic, partition, start, end), start, end)

    def _fetched(
        self, topic: str, partition: int, start: int, end: int
    ) -> Iterator[tuple[int, ColumnBatch]]:
        """The batches holding [start, end) as columns the server decoded (a fetch "as
        columns"), taken as they stream in, fetch after fetch (each bounded by bytes); a
        fetch cut by a broken connection goes on from where it got to."""
        at = start
        while at < end:
            before = at
            with contextlib.suppress(_Broken):
                columns = {"as": "columns"}
                for chunk in self._replies(
                    topic, partition, at, end, DEFAULT_FETCH_BYTES, 0, columns
                ):
                    base, batch = columns_fetched(chunk.data, chunk.app_metadata)
                    yield base, batch
                    at = base + len(batch)
                if at == before:
                    return  # the end of the partition (a broken fetch is tried again)

    def fetch(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        wait: float = 0,
    ) -> list[StoredBatch]:
        """One fetch: the stored batches holding [start, end), up to ``max_bytes`` of them
        (at least one), as the server keeps them; at the end, the server waits up to
        ``wait`` seconds for an append."""
        deadline = time.monotonic() + wait
        while True:  # a long wait in slices: see _POLL_S
            step = min(max(deadline - time.monotonic(), 0.0), _POLL_S)
            with contextlib.suppress(_Broken):
                got = list(self._stream(topic, partition, start, end, max_bytes, step))
                if got or time.monotonic() >= deadline:
                    return got

    def _stream(
        self, topic: str, partition: int, start: int, end: int, max_bytes: int, wait: float
    ) -> Iterator[StoredBatch]:
        for chunk in self._replies(topic, partition, start, end, max_bytes, wait, {}):
            yield from batch_stored(chunk.data)

    def _replies(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        max_bytes: int,
        wait: float,
        more: dict[str, Any],
    ) -> Iterator[Any]:
        """One fetch's chunks (Flight stream chunks) as the server streams them."""
        ticket = {
            "op": "fetch",
            "topic": topic,
            "partition": partition,
            "start": start,
            "end": end,
            "max_bytes": max_bytes,
            "wait_ms": int(wait * 1000),
            **more,
        }
        data = flight.Ticket(encode(ticket))
        options = self._options(600 + wait)

        def begin(client: flight.FlightClient) -> tuple[flight.FlightClient, Any, Any]:
            reader = client.do_get(data, options)
            try:
                return client, reader, reader.read_chunk()  # the server's refusal comes here
            except StopIteration:
                return client, reader, None

        client, reader, chunk = self._call(begin)
        try:
            while chunk is not None:
                yield chunk
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    chunk = None
                except (flight.FlightUnavailableError, flight.FlightTimedOutError):
                    self._drop(client)
                    raise _Broken from None
                except (flight.FlightServerError, flight.FlightInternalError) as exc:
                    raise remote_error(exc.extra_info, _first_line(exc)) from None
        finally:
            if chunk is not None:  # left early: the server stops streaming the rest
                with contextlib.suppress(Exception):
                    reader.cancel()

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        start, end = self._act("offsets", {"topic": topic, "partitions": [partition]})[0]
        return int(start), int(end)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        request = {"topic": topic, "partition": partition, "timestamp_ms": timestamp_ms}
        return int(self._act("offset_for_time", request, 3600))  # read where the files are

    def object_stats(self) -> dict[str, Any] | None:
        stats: dict[str, Any] | None = self._act("object_stats")
        return stats

    def size(self, topic: str, partition: int) -> int | None:
        size = self._act("size", {"topic": topic, "partition": partition})
        return None if size is None else int(size)

    def wait(self, positions: Mapping[tuple[str, int], int], timeout: float) -> bool:
        """Block until one of ``positions`` (partition → offset) has a record at or past
        it, or ``timeout`` seconds pass; the server wakes the call on an append."""
        request = {
            "positions": [[t, p, o] for (t, p), o in positions.items()],
            "timeout_ms": int(timeout * 1000),
        }
        deadline = time.monotonic() + timeout
        while True:  # in slices: see _POLL_S
            step = min(max(deadline - time.monotonic(), 0.0), _POLL_S)
            request["timeout_ms"] = int(step * 1000)
            if self._act("wait", request, step + 30):
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _server(item: str, url: str) -> str:
    """``host:port`` of one server of a ``flight://`` URL (the default port if none)."""
    parts = urlsplit(f"//{item}")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise LogError(f"log server URL {url!r} has a bad port in {item!r}") from None
    if not parts.hostname:
        raise LogError(f"log server URL {url!r} has no host; e.g. flight://host:8815")
    return f"{url_host(parts.hostname)}:{port}"


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for marker in (". Detail:", ". gRPC client debug context:"):
        text = text.split(marker)[0]
    return text.strip()
