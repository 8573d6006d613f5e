"""Errors of stream aggregations (more live beside their owners: ``DriverFencedError``
in fencing.py, ``AlreadyRunningError`` in leader.py, ``StreamFailedError`` in specjob.py)."""

from __future__ import annotations

from riverbed.errors import InvalidValueError, RiverbedError

__all__ = ["StreamError", "StreamValueError"]


class StreamError(RiverbedError):
    """Base of the stream package's errors."""


class StreamValueError(StreamError, InvalidValueError):
    """A malformed aggregation, window, metric or source option."""
