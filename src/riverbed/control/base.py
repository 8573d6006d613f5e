"""The control-plane interface: etcd v3 semantics, whatever the backend.

Every backend (``memory://``, ``sqlite:///``, ``etcd://``) implements
:class:`ControlPlane` and passes one contract suite (``tests/control/test_contract.py``),
so code above it behaves the same on a laptop and on a cluster:

* a **global revision** that grows by one with every write transaction; every key
  carries ``create_revision``, ``mod_revision`` and ``version`` (writes since creation);
* **transactions**: a list of :class:`Compare` guards, then ``success`` or ``failure``
  operations, applied atomically at one revision;
* **leases** with a TTL; keys put with a lease vanish (a delete event is emitted) when it
  expires or is revoked;
* **watches** that deliver every event from a start revision, in revision order, none
  skipped; asking for a compacted revision raises :class:`CompactedError`.

Keys and values are bytes; ``str`` arguments are encoded as UTF-8.
"""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, TypeAlias

Bytes: TypeAlias = bytes | str


def to_bytes(value: Bytes) -> bytes:
    """Encode a key or value: ``str`` as UTF-8, ``bytes`` unchanged."""
    return value.encode("utf-8") if isinstance(value, str) else value


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end).

    An empty result means "no upper bound" (prefix was empty or all ``0xff``).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b""
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(frozen=True)
class KeyValue:
    """A key's value and its revision metadata, as etcd reports it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    @property
    def text(self) -> str:
        """The value decoded as UTF-8."""
        return self.value.decode("utf-8")

    def __repr__(self) -> str:
        return (
            f"KeyValue({self.key!r}={self.value[:40]!r}, create={self.create_revision}, "
            f"mod={self.mod_revision}, version={self.version}, lease={self.lease:x})"
        )


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class Event:
    """One change seen by a watch.

    For a delete, ``kv`` holds the key, an empty value and ``mod_revision`` = the
    revision of the delete; ``prev_kv`` holds what was deleted when the backend knows it.
    """

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


CompareTarget = Literal["value", "version", "create", "mod", "lease"]
CompareOp = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True)
class Compare:
    """A transaction guard: ``target(key) op operand``.

    For a missing key, ``version``, ``create``, ``mod`` and ``lease`` are 0 and the
    value compare is false (as in etcd). Build them with the helpers::

        Compare.version("k") == 0          # key does not exist
        Compare.value("k") == b"old"       # compare-and-swap
        Compare.mod("k") < 42
    """

    key: bytes
    target: CompareTarget
    op: CompareOp
    operand: bytes | int

    @staticmethod
    def value(key: Bytes) -> _CompareBuilder:
        return _CompareBuilder(to_bytes(key), "value")

    @staticmethod
    def version(key: Bytes) -> _CompareBuilder:
        return _CompareBuilder(to_bytes(key), "version")

    @staticmethod
    def create(key: Bytes) -> _CompareBuilder:
        return _CompareBuilder(to_bytes(key), "create")

    @staticmethod
    def mod(key: Bytes) -> _CompareBuilder:
        return _CompareBuilder(to_bytes(key), "mod")

    @staticmethod
    def lease(key: Bytes) -> _CompareBuilder:
        return _CompareBuilder(to_bytes(key), "lease")

    def evaluate(self, kv: KeyValue | None) -> bool:
        """Whether this guard holds against the key's current state (``None`` = missing)."""
        actual: bytes | int
        if self.target == "value":
            if kv is None:
                return False
            actual = kv.value
        elif kv is None:
            actual = 0
        else:
            actual = {
                "version": kv.version,
                "create": kv.create_revision,
                "mod": kv.mod_revision,
                "lease": kv.lease,
            }[self.target]
        operand = self.operand
        if self.op == "==":
            return actual == operand
        if self.op == "!=":
            return actual != operand
        if self.op == "<":
            return actual < operand  # type: ignore[operator]
        return actual > operand  # type: ignore[operator]


@dataclass(frozen=True)
class _CompareBuilder:
    key: bytes
    target: CompareTarget

    def _make(self, op: CompareOp, operand: Bytes | int) -> Compare:
        if self.target == "value":
            if isinstance(operand, int):
                raise TypeError("a value compare takes bytes or str, not int")
            return Compare(self.key, self.target, op, to_bytes(operand))
        if not isinstance(operand, int) or isinstance(operand, bool):
            raise TypeError(f"a {self.target} compare takes an int")
        return Compare(self.key, self.target, op, operand)

    def __eq__(self, operand: object) -> Compare:  # type: ignore[override]
        return self._make("==", operand)  # type: ignore[arg-type]

    def __ne__(self, operand: object) -> Compare:  # type: ignore[override]
        return self._make("!=", operand)  # type: ignore[arg-type]

    def __lt__(self, operand: Bytes | int) -> Compare:
        return self._make("<", operand)

    def __gt__(self, operand: Bytes | int) -> Compare:
        return self._make(">", operand)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    @staticmethod
    def of(key: Bytes, value: Bytes, lease: int = 0) -> Put:
        return Put(to_bytes(key), to_bytes(value), lease)


@dataclass(frozen=True)
class Get:
    key: bytes
    prefix: bool = False

    @staticmethod
    def of(key: Bytes, prefix: bool = False) -> Get:
        return Get(to_bytes(key), prefix)


@dataclass(frozen=True)
class Delete:
    key: bytes
    prefix: bool = False

    @staticmethod
    def of(key: Bytes, prefix: bool = False) -> Delete:
        return Delete(to_bytes(key), prefix)


Op: TypeAlias = Put | Get | Delete
# Per operation: Get -> list of KeyValue, Put -> previous KeyValue or None, Delete -> count.
OpResult: TypeAlias = list[KeyValue] | KeyValue | int | None


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[OpResult] = field(default_factory=list)


@dataclass(frozen=True)
class LeaseGrant:
    id: int
    ttl: int


class Watch(ABC):
    """A stream of :class:`Event` from a start revision, in order, none skipped.

    Iterate it (blocks), or call :meth:`get` with a timeout. Close it when done; it is
    a context manager. If the server compacted the revisions it needs, iteration raises
    :class:`~riverbed.control.errors.CompactedError`. To resume after a close or a
    crash, open a new watch at ``last_event.revision + 1``.
    """

    def __init__(self) -> None:
        self._closed = threading.Event()

    @abstractmethod
    def get(self, timeout: float | None = None) -> Event | None:
        """Next event, or ``None`` if none arrived within ``timeout`` or the watch closed."""

    def close(self) -> None:
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def events(self, idle_timeout: float | None = None) -> Iterator[Event]:
        """Yield events until the watch closes, or ``idle_timeout`` seconds pass without one."""
        while not self._closed.is_set():
            event = self.get(timeout=0.5 if idle_timeout is None else idle_timeout)
            if event is not None:
                yield event
            elif idle_timeout is not None:
                return

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ControlPlane(ABC):
    """Key/value + leases + transactions + watches, with etcd v3 semantics."""

    url: str

    # -- key/value ---------------------------------------------------------------
    @abstractmethod
    def txn(
        self,
        compare: Sequence[Compare] = (),
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """Atomically: if every compare holds, apply ``success``, else ``failure``."""

    def get(self, key: Bytes) -> KeyValue | None:
        result = self.txn(success=[Get.of(key)])
        kvs = result.responses[0]
        assert isinstance(kvs, list)
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: Bytes) -> list[KeyValue]:
        """Every live key starting with ``prefix``, sorted by key."""
        result = self.txn(success=[Get.of(prefix, prefix=True)])
        kvs = result.responses[0]
        assert isinstance(kvs, list)
        return kvs

    def put(self, key: Bytes, value: Bytes, lease: int = 0) -> int:
        """Set ``key``; returns the new revision."""
        return self.txn(success=[Put.of(key, value, lease)]).revision

    def delete(self, key: Bytes, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many were deleted."""
        result = self.txn(success=[Delete.of(key, prefix)])
        count = result.responses[0]
        assert isinstance(count, int)
        return count

    def compare_and_swap(self, key: Bytes, expected: Bytes | None, new: Bytes) -> bool:
        """Set ``key`` to ``new`` only if its value is ``expected`` (``None``: absent)."""
        guard = Compare.version(key) == 0 if expected is None else Compare.value(key) == expected
        return self.txn([guard], [Put.of(key, new)]).succeeded

    @abstractmethod
    def revision(self) -> int:
        """The current global revision."""

    @abstractmethod
    def compact(self, revision: int) -> None:
        """Forget history before ``revision``; watches from earlier revisions fail."""

    # -- leases ------------------------------------------------------------------
    @abstractmethod
    def grant(self, ttl: int) -> LeaseGrant:
        """Create a lease that expires ``ttl`` seconds after its last keepalive."""

    @abstractmethod
    def keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its TTL. Raises LeaseNotFoundError if it is gone."""

    @abstractmethod
    def revoke(self, lease: int) -> None:
        """End a lease now, deleting its keys. Revoking a missing lease is a no-op."""

    @abstractmethod
    def time_to_live(self, lease: int) -> int | None:
        """Seconds left on a lease, or ``None`` if it does not exist."""

    # -- watches -----------------------------------------------------------------
    @abstractmethod
    def watch(
        self, key: Bytes, *, prefix: bool = False, start_revision: int | None = None
    ) -> Watch:
        """Watch a key (or prefix) from ``start_revision`` (default: the next write)."""

    # -- lifecycle ---------------------------------------------------------------
    @abstractmethod
    def close(self) -> None:
        """Release connections and stop background threads."""

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
