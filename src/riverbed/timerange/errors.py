"""Errors of time-range jobs.

::

    RiverbedError
    └── TimeRangeError
        ├── SpecError           the spec file does not load, or the spec is malformed
        │                       (also a riverbed.errors.SpecError)
        ├── FencedError         a driver lost its term: it may not advance or publish
        │                       (also a riverbed.errors.FencedError)
        ├── RangeError          from ≥ to, a chunk that does not divide, an edge off the grid
        ├── MissingInputError   an input partition the range needs does not exist
        └── BadInputError       an input row the job cannot use (a record off its schema)
"""

from __future__ import annotations

from riverbed import errors
from riverbed.errors import RiverbedError

__all__ = [
    "BadInputError",
    "FencedError",
    "MissingInputError",
    "RangeError",
    "SpecError",
    "TimeRangeError",
]


class TimeRangeError(RiverbedError):
    """Root of the errors of time-range jobs."""


class SpecError(TimeRangeError, errors.SpecError):
    """A time-range spec file does not load, or the spec is malformed."""


class FencedError(TimeRangeError, errors.FencedError):
    """A driver lost its term: it may not advance the marker or publish."""


class RangeError(TimeRangeError):
    """A time range or chunk size that cannot be run as asked."""


class MissingInputError(TimeRangeError):
    """An input partition inside the range does not exist."""


class BadInputError(TimeRangeError):
    """An input row the job cannot use; nothing of its chunk is published."""


def raised_by_us(exc: BaseException) -> str | None:
    """The message of a ``raise_error`` riverbed put in a query (Spark wraps it in
    ``[USER_RAISED_EXCEPTION] … SQLSTATE: P0001``), else ``None``."""
    text = str(exc)
    tag = "[USER_RAISED_EXCEPTION] "
    if tag not in text or "time-range job '" not in text:
        return None
    message = text.split(tag, 1)[1]
    return message.split(" SQLSTATE:", 1)[0].strip()
