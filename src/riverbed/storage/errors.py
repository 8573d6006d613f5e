"""Errors of the object storage layer (see :mod:`riverbed.errors` for the tree)."""

from __future__ import annotations

from riverbed.errors import InvalidValueError, RiverbedError


class StorageError(RiverbedError):
    """Root of the object storage layer's errors."""


class StorageValueError(StorageError, InvalidValueError):
    """A storage location or setting that cannot be used as given."""


class ObjectNotFoundError(StorageError, KeyError):
    """An object that must exist does not."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StorageAccessError(StorageError):
    """The store refuses riverbed for good (no such bucket, no permission, bad
    credentials): retrying would not help; the message says what to change."""


class StorageUnavailableError(StorageError):
    """The store did not answer for as long as riverbed was told to wait."""


__all__ = [
    "ObjectNotFoundError",
    "StorageAccessError",
    "StorageError",
    "StorageUnavailableError",
    "StorageValueError",
]
