"""``etcd://host:port[,host:port…]``: the control plane on an etcd v3 cluster.

The client speaks etcd's v3 JSON gateway (``/v3/kv/*``, ``/v3/lease/*``,
``/v3/watch``) over ``httpx``: synchronous, no generated stubs, and failover that we
control. (The gRPC clients measured here either broke with current protobuf or
refused every call for 300 s after one failure; see docs/architecture.md.)

Failover: requests go to one endpoint at a time. A request that could not be sent
(connection refused/reset before a response, or etcd saying it has no leader) moves
to the next endpoint and is retried until ``timeout``. A *write* whose outcome is
unknown (the connection broke after sending it) is not retried blindly: it raises
:class:`UnavailableError` saying so, because replaying a compare-and-swap could apply
it twice. Reads are always retried.

Watches stream from one endpoint and reconnect to the next one at the revision after
the last event delivered, so no event is lost or repeated across a failover. A watch
is quiet while nothing changes, so a silent stream cannot tell a healthy member from
one whose host was cut off: TCP keepalive on every connection (the probes the Go
client sends as gRPC pings) breaks a stream to an unreachable member within
:data:`DEAD_PEER_S`, and the watch moves on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from riverbed.control._watch import KeyFilter, ThreadedWatch
from riverbed.control.base import (
    Bytes,
    Compare,
    ControlPlane,
    Delete,
    Event,
    EventType,
    Get,
    KeyValue,
    LeaseGrant,
    Op,
    OpResult,
    Put,
    TxnResult,
    Watch,
    prefix_end,
    to_bytes,
)
from riverbed.control.errors import (
    CompactedError,
    ControlError,
    ControlValueError,
    LeaseNotFoundError,
    OutcomeUnknownError,
    UnavailableError,
)

log = logging.getLogger(__name__)

_TARGETS = {
    "value": "VALUE",
    "version": "VERSION",
    "create": "CREATE",
    "mod": "MOD",
    "lease": "LEASE",
}
_FIELDS = {
    "value": "value",
    "version": "version",
    "create": "create_revision",
    "mod": "mod_revision",
    "lease": "lease",
}
_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
# etcd errors that mean "not applied, try another member".
_RETRYABLE = ("no leader", "leader changed", "not capable", "too many requests")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(d.get("key")),
        value=_unb64(d.get("value")),
        create_revision=int(d.get("create_revision", 0)),
        mod_revision=int(d.get("mod_revision", 0)),
        version=int(d.get("version", 0)),
        lease=int(d.get("lease", 0)),
    )


def _shutdown(response: httpx.Response) -> None:
    """Unblock a thread reading ``response``: closing alone does not interrupt a recv()."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    response.close()


# A read (or a lease refresh, which is safe to repeat) that gets no answer from one
# member in this long moves on to the next: a member on a cut-off host never answers,
# and a lease's holder must reach another one well inside its TTL (a 5 s lease is
# refreshed every 1.7 s). Writes wait the whole timeout: a write retried elsewhere after
# it was sent could apply twice.
READ_TRY_S = 1.5

# A connection whose peer stops answering — its host cut off, not closed — is given up
# after this long: keepalive probes on an idle connection (a watch waiting for its
# next event), and a limit on unacknowledged data on a busy one.
DEAD_PEER_S = 5


def _keepalive_options() -> list[tuple[int, int, int]]:
    idle, interval = 2, 1
    count = max((DEAD_PEER_S - idle) // interval, 1)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", DEAD_PEER_S * 1000),
    ):
        if hasattr(socket, name):  # Linux has all four; others keep their defaults
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


class _Unsent(Exception):
    """The request did not reach a working member; safe to retry elsewhere."""


class EtcdControlPlane(ControlPlane):
    """A client of an etcd v3 cluster (3.4+)."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 10.0) -> None:
        if not endpoints:
            raise ControlValueError("at least one etcd endpoint is needed")
        self.endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self.url = "etcd://" + ",".join(e.split("://", 1)[1] for e in self.endpoints)
        self.timeout = timeout
        self._current = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=1.0),
            transport=httpx.HTTPTransport(socket_options=_keepalive_options()),
        )
        self._watches: list[Watch] = []

    # -- transport -----------------------------------------------------------------
    def _endpoint(self) -> tuple[int, str]:
        with self._lock:
            return self._current, self.endpoints[self._current]

    def _failed(self, index: int) -> None:
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % len(self.endpoints)

    def _call(
        self, path: str, body: dict[str, Any], *, write: bool, timeout: float | None = None
    ) -> dict[str, Any]:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        backoff = 0.02
        last: Exception | None = None
        while True:
            index, endpoint = self._endpoint()
            try:
                return self._once(endpoint + path, body, write)
            except _Unsent as exc:
                last = exc
                self._failed(index)
            except OutcomeUnknownError:
                self._failed(index)  # the caller's next request goes elsewhere
                raise
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"no etcd endpoint of {self.url} answered within {timeout:g}s "
                    f"({last}); check that etcd is running and the URL is right"
                )
            # Back off between rounds over all endpoints (not a polling loop: a retry).
            if index == len(self.endpoints) - 1:
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    def _once(self, url: str, body: dict[str, Any], write: bool) -> dict[str, Any]:
        try:
            wait = self.timeout if write else min(self.timeout, READ_TRY_S)
            response = self._http.post(url, json=body, timeout=httpx.Timeout(wait, connect=1.0))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise _Unsent(str(exc) or type(exc).__name__) from exc
        except httpx.TransportError as exc:
            if not write:
                raise _Unsent(str(exc) or type(exc).__name__) from exc
            raise OutcomeUnknownError(
                f"etcd at {url} failed while handling a write ({type(exc).__name__}); its "
                "outcome is unknown: re-read the keys before retrying"
            ) from exc
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            raise ControlError(
                f"{url} answered HTTP {response.status_code} with something that is not etcd's "
                "JSON gateway; check the host:port in the etcd:// URL"
            ) from None
        if "error" in data or response.status_code != 200:
            message = str(data.get("message") or data.get("error") or response.text)
            if any(m in message for m in _RETRYABLE) or response.status_code == 503:
                raise _Unsent(message)
            if "lease not found" in message:
                raise LeaseNotFoundError(f"lease does not exist (expired or revoked): {message}")
            raise ControlError(f"etcd rejected the request to {url}: {message}")
        return data

    # -- key/value -------------------------------------------------------------------
    def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        body = {
            "compare": [self._compare(c) for c in compare],
            "success": [self._op(op) for op in success],
            "failure": [self._op(op) for op in failure],
        }
        write = any(not isinstance(op, Get) for op in [*success, *failure])
        data = self._call("/v3/kv/txn", body, write=write)
        succeeded = bool(data.get("succeeded", False))
        ops = success if succeeded else failure
        responses: list[OpResult] = []
        for op, resp in zip(ops, data.get("responses", []), strict=True):
            if isinstance(op, Get):
                kvs = resp.get("response_range", {}).get("kvs", [])
                responses.append([_kv(kv) for kv in kvs])
            elif isinstance(op, Put):
                prev = resp.get("response_put", {}).get("prev_kv")
                responses.append(_kv(prev) if prev else None)
            else:
                responses.append(int(resp.get("response_delete_range", {}).get("deleted", 0)))
        return TxnResult(succeeded, int(data["header"]["revision"]), responses)

    @staticmethod
    def _compare(c: Compare) -> dict[str, Any]:
        operand = _b64(c.operand) if isinstance(c.operand, bytes) else str(c.operand)
        return {
            "key": _b64(c.key),
            "target": _TARGETS[c.target],
            "result": _RESULTS[c.op],
            _FIELDS[c.target]: operand,
        }

    @staticmethod
    def _op(op: Op) -> dict[str, Any]:
        if isinstance(op, Put):
            put: dict[str, Any] = {"key": _b64(op.key), "value": _b64(op.value), "prev_kv": True}
            if op.lease:
                put["lease"] = str(op.lease)
            return {"request_put": put}
        rng: dict[str, Any] = {"key": _b64(op.key)}
        if op.prefix:
            rng["range_end"] = _b64(prefix_end(op.key) or b"\0")
        if isinstance(op, Get):
            return {"request_range": rng}
        assert isinstance(op, Delete)
        return {"request_delete_range": rng}

    def revision(self, timeout: float | None = None) -> int:
        body = {"key": _b64(b"\0"), "count_only": True}
        data = self._call("/v3/kv/range", body, write=False, timeout=timeout)
        return int(data["header"]["revision"])

    def compact(self, revision: int) -> None:
        revision = min(revision, self.revision())
        try:
            self._call("/v3/kv/compaction", {"revision": str(revision)}, write=True)
        except ControlError as exc:
            if "compacted" not in str(exc):
                raise

    # -- leases ----------------------------------------------------------------------
    def grant(self, ttl: int) -> LeaseGrant:
        if ttl < 1:
            raise ControlValueError(f"lease TTL must be at least 1 second, got {ttl}")
        data = self._call("/v3/lease/grant", {"TTL": str(ttl)}, write=True)
        return LeaseGrant(int(data["ID"]), int(data["TTL"]))

    def keepalive(self, lease: int) -> int:
        data = self._call("/v3/lease/keepalive", {"ID": str(lease)}, write=False)
        ttl = int(data.get("result", {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseNotFoundError(f"lease {lease:x} has expired or was revoked")
        return ttl

    def revoke(self, lease: int) -> None:
        with contextlib.suppress(LeaseNotFoundError):
            self._call("/v3/lease/revoke", {"ID": str(lease)}, write=False)

    def time_to_live(self, lease: int) -> int | None:
        data = self._call("/v3/lease/timetolive", {"ID": str(lease)}, write=False)
        ttl = int(data.get("TTL", -1))
        return None if ttl < 0 else ttl

    # -- watches ---------------------------------------------------------------------
    def watch(
        self, key: Bytes, *, prefix: bool = False, start_revision: int | None = None
    ) -> Watch:
        if start_revision is None:
            start_revision = self.revision() + 1
        match = KeyFilter(to_bytes(key), prefix)
        state = {"next": start_revision}

        def run(w: ThreadedWatch) -> None:
            while not w.stopping.is_set():
                index, endpoint = self._endpoint()
                try:
                    self._stream(w, endpoint, match, state)
                except (_Unsent, httpx.TransportError, json.JSONDecodeError) as exc:
                    if w.stopping.is_set():
                        return
                    log.info("watch on %s broke (%s); resuming at %d", endpoint, exc, state["next"])
                    self._failed(index)
                    w.stopping.wait(0.05)

        watch = ThreadedWatch(f"riverbed-etcd-watch-{key!r}", run)
        self._watches = [w for w in self._watches if not w.closed] + [watch]
        return watch

    def _stream(
        self, w: ThreadedWatch, endpoint: str, match: KeyFilter, state: dict[str, int]
    ) -> None:
        create: dict[str, Any] = {
            "key": _b64(match.start),
            "start_revision": str(state["next"]),
            "prev_kv": True,
        }
        if match.prefix:
            create["range_end"] = _b64(match.end or b"\0")
        timeout = httpx.Timeout(None, connect=1.0)
        with self._http.stream(
            "POST", endpoint + "/v3/watch", json={"create_request": create}, timeout=timeout
        ) as response:
            w.interrupt = lambda: _shutdown(response)
            if w.stopping.is_set():
                return
            for line in response.iter_lines():
                if not line.strip():
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise _Unsent(str(message["error"]))
                result = message.get("result", {})
                if result.get("compact_revision") and int(result["compact_revision"]) > 0:
                    raise CompactedError(state["next"], int(result["compact_revision"]))
                if result.get("canceled"):
                    raise _Unsent(result.get("cancel_reason", "watch canceled by the server"))
                for raw in result.get("events", []):
                    kv = _kv(raw["kv"])
                    prev = _kv(raw["prev_kv"]) if raw.get("prev_kv") else None
                    kind = EventType.DELETE if raw.get("type") == "DELETE" else EventType.PUT
                    state["next"] = kv.mod_revision + 1
                    if match(kv.key):
                        w.emit(Event(kind, kv, prev))
        if not w.stopping.is_set():
            raise _Unsent("watch stream ended")

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        self._watches = []
        self._http.close()
