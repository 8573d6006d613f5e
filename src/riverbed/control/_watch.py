"""A watch fed by a background thread, shared by the SQLite and etcd backends."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from riverbed.control.base import Event, Watch, prefix_end


class KeyFilter:
    """Matches one key, or every key of a prefix (etcd's [key, range_end))."""

    def __init__(self, key: bytes, prefix: bool) -> None:
        self.start = key
        self.end = prefix_end(key) if prefix else None
        self.prefix = prefix

    def __call__(self, key: bytes) -> bool:
        if self.end is None:
            return key == self.start
        return key >= self.start and (self.end == b"" or key < self.end)


class ThreadedWatch(Watch):
    """Events arrive on a queue from a producer thread that this object owns.

    The producer calls :meth:`emit` for each event and :meth:`fail` once with an error
    that ends the watch (it is raised to the consumer after the events before it).
    :meth:`close` stops the producer (it must watch ``self.stopping``) and joins it.
    """

    def __init__(self, name: str, run: Callable[[ThreadedWatch], None]) -> None:
        super().__init__()
        self._queue: queue.Queue[Event | BaseException] = queue.Queue()
        self.stopping = threading.Event()
        # Called by close() to unblock a producer stuck in I/O (e.g. close a socket).
        self.interrupt: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._main, args=(run,), name=name, daemon=True)
        self._thread.start()

    def _main(self, run: Callable[[ThreadedWatch], None]) -> None:
        try:
            run(self)
        except BaseException as exc:  # handed to the consumer, not swallowed
            self.fail(exc)

    def emit(self, event: Event) -> None:
        self._queue.put(event)

    def fail(self, error: BaseException) -> None:
        self._queue.put(error)

    def get(self, timeout: float | None = None) -> Event | None:
        if self.closed:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        super().close()
        self.stopping.set()
        if self.interrupt is not None:
            self.interrupt()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
