"""Errors of the control plane (see :mod:`riverbed.errors` for the tree)."""

from __future__ import annotations

from riverbed.errors import InvalidValueError, RiverbedError


class ControlError(RiverbedError):
    """Base of every control-plane error."""


class InvalidURLError(ControlError):
    """The control-plane URL has an unknown scheme or a malformed address."""


class UnavailableError(ControlError):
    """No endpoint of the control plane answered."""


class OutcomeUnknownError(UnavailableError):
    """A write reached a member that stopped answering: it may or may not have been
    applied. Re-read before retrying — or retry it as is when it is idempotent (a
    create-if-absent of one's own key, say)."""


class KeyNotFoundError(ControlError):
    """A key that had to exist does not."""


class LeaseNotFoundError(ControlError):
    """The lease was revoked or has expired."""


class CompactedError(ControlError):
    """A watch asked for revisions that were compacted away."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested} has been compacted (oldest kept: {compact_revision}); "
            f"re-read the keys with get/range, then watch from their revision + 1"
        )
        self.requested = requested
        self.compact_revision = compact_revision


class LockTimeoutError(ControlError):
    """A lock or leadership was not acquired within the timeout."""


class SessionLostError(ControlError):
    """The session's lease expired or was revoked while something depended on it."""


class ControlValueError(ControlError, InvalidValueError):
    """A malformed value given to the control plane (a name, a TTL, a transaction)."""
