"""Errors of the state store."""

from __future__ import annotations

from riverbed.errors import InvalidValueError, RiverbedError


class StateError(RiverbedError):
    """Base of every state-store error."""


class VersionNotFoundError(StateError):
    """A requested version no longer exists (purged) or never existed."""


class PartitionBusyError(StateError):
    """Another holder has the partition's local database open: another process on this
    machine (``elsewhere``), or this one."""

    def __init__(self, message: str, elsewhere: bool = False) -> None:
        super().__init__(message)
        self.elsewhere = elsewhere


class CorruptStateError(StateError):
    """A changelog or snapshot failed its checksum or could not be read."""


class StoreClosedError(StateError):
    """The store was already committed or aborted."""


class StateValueError(StateError, InvalidValueError):
    """A malformed or out-of-range value given to the state store or a sketch."""
