"""A lease kept alive by a background thread that this object owns."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from riverbed.control.base import ControlPlane
from riverbed.control.errors import ControlError, LeaseNotFoundError, SessionLostError

log = logging.getLogger(__name__)


class Session:
    """Grant a lease and keep it alive until :meth:`close` (or the process dies).

    The keeper refreshes every ``ttl / 3`` seconds. If the lease is found expired, or
    no refresh succeeded for a whole TTL, :attr:`lost` is set and the keeper stops:
    everything attached to the lease (locks, leadership, registrations) must be
    considered gone. Code that acts on behalf of the session should check
    :meth:`ensure_alive` and, for safety, fence its writes by revision.

    :meth:`remaining` is the holder's own clock of the lease: the control plane cannot
    expire it sooner than ``ttl`` after the last refresh that succeeded was *sent*
    (granting counts as one), so a holder cut off from the control plane knows, without
    asking it, how long what it holds is certainly still its own — and can stop acting
    before anyone else could be given it (self-fencing).
    """

    def __init__(self, cp: ControlPlane, ttl: int = 10) -> None:
        self.cp = cp
        self.ttl = ttl
        sent = time.monotonic()
        self.lease = cp.grant(ttl).id
        self._valid_until = sent + ttl
        self._refreshed = threading.Condition()
        self.lost = threading.Event()
        #: why the session was lost, with what the keeper saw (None while alive)
        self.lost_reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._keep, name=f"riverbed-lease-{self.lease:x}", daemon=True
        )
        self._thread.start()

    def _keep(self) -> None:
        interval = max(self.ttl / 3, 0.1)
        last_ok = self._valid_until - self.ttl  # when the last refresh that got through was sent
        slept_at = time.monotonic()
        while not self._stop.wait(interval):
            # a refresh can be late two ways: this thread woke late (a starved or paused
            # process) or the control plane answered slowly; a lost session says which
            late = time.monotonic() - slept_at - interval
            try:
                sent = time.monotonic()
                ttl = self.cp.keepalive(self.lease)
                if sent - last_ok > 2 * interval:  # more than one refresh's slack used
                    log.warning(
                        "lease %x refreshed %.1f s after the previous one (TTL %s s): this "
                        "thread woke %.1f s late and the control plane answered in %.1f s",
                        self.lease,
                        sent - last_ok,
                        self.ttl,
                        late,
                        time.monotonic() - sent,
                    )
                last_ok = sent
                with self._refreshed:
                    self._valid_until = sent + min(ttl, self.ttl)
                    self._refreshed.notify_all()
            except LeaseNotFoundError:
                self._lose(
                    f"lease {self.lease:x} expired or was revoked: the control plane no "
                    f"longer has it (TTL {self.ttl} s; the last refresh that got through "
                    f"was sent {sent - last_ok:.1f} s before; this one woke {late:.1f} s "
                    f"late and was answered in {time.monotonic() - sent:.1f} s)"
                )
                return
            except ControlError as exc:
                if time.monotonic() - last_ok >= self.ttl:
                    self._lose(
                        f"lease {self.lease:x} not refreshed for its TTL of {self.ttl} s "
                        f"(the control plane did not answer: {exc})"
                    )
                    return
                log.info("keepalive of lease %x failed (%s); retrying", self.lease, exc)
            slept_at = time.monotonic()

    def _lose(self, reason: str) -> None:
        log.warning("%s; session lost", reason)
        self.lost_reason = reason
        self.lost.set()

    def remaining(self) -> float:
        """Seconds the lease is certainly still held (0 once lost or closed): from the
        send time of the last refresh that succeeded, never from an answer's arrival."""
        if not self.alive:
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    def wait_remaining(self, at_least: float, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`remaining` to be ``at_least`` (a
        refresh getting through); whether it is."""
        deadline = time.monotonic() + timeout
        with self._refreshed:
            while self.remaining() < at_least and self.alive:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._refreshed.wait(min(left, 0.1))
        return self.remaining() >= at_least

    @property
    def alive(self) -> bool:
        return not self.lost.is_set() and not self._stop.is_set()

    def ensure_alive(self) -> None:
        if not self.alive:
            why = self.lost_reason or "expired or closed"
            raise SessionLostError(
                f"session lease {self.lease:x} is gone ({why}); start a new session"
            )

    def close(self, revoke: bool = True) -> None:
        """Stop the keeper; revoke the lease (deleting its keys) unless told not to."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        if revoke and not self.lost.is_set():
            try:
                self.cp.revoke(self.lease)
            except ControlError as exc:
                log.warning(
                    "could not revoke lease %x (%s); it expires in %ss", self.lease, exc, self.ttl
                )

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "lost" if self.lost.is_set() else "closed"
        return f"Session(lease={self.lease:x}, ttl={self.ttl}, {state})"
