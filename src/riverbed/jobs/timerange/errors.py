"""Errors of time-range jobs.

::

    JobsError (riverbed.jobs.errors)
    ├── SpecError               the spec file does not load, or the spec is malformed
    ├── FencedError             a driver lost its term: it may not advance or publish
    └── TimeRangeError
        ├── RangeError          from ≥ to, a chunk that does not divide, an edge off the grid
        └── MissingInputError   an input partition the range needs does not exist
"""

from __future__ import annotations

from riverbed.jobs.errors import FencedError, JobsError, SpecError

__all__ = ["FencedError", "MissingInputError", "RangeError", "SpecError", "TimeRangeError"]


class TimeRangeError(JobsError):
    """Root of the errors that only time-range jobs raise."""


class RangeError(TimeRangeError):
    """A time range or chunk size that cannot be run as asked."""


class MissingInputError(TimeRangeError):
    """An input partition inside the range does not exist."""
