"""Errors of the jobs package.

::

    RiverbedError
    └── JobsError
        ├── SpecError          a job module does not load, or its spec is malformed
        ├── CycleError         the job specs depend on each other in a circle
        ├── WorkIdsError       no work ids, or ids that are not whole numbers
        ├── NotFoundError      no run/chunk with that id
        ├── FencedError        a write from a stale attempt or a demoted orchestrator
        └── QueueError         the jobs database is unreachable or its schema is wrong
"""

from __future__ import annotations

from riverbed import errors
from riverbed.errors import InvalidValueError, RiverbedError


class JobsError(RiverbedError):
    """Root of the jobs package's errors."""


class SpecError(JobsError, errors.SpecError):
    """A job module failed to import, or its spec is malformed."""


class CycleError(SpecError):
    """Job specs depend on each other in a circle; the message names the circle."""

    def __init__(self, cycle: list[str]) -> None:
        self.cycle = cycle
        super().__init__(
            f"jobs depend on each other in a circle: {' → '.join(cycle)}; "
            "remove one of these dependencies"
        )


class WorkIdsError(JobsError):
    """Work ids are missing or malformed."""


class NotFoundError(JobsError):
    """No run or chunk with the given id."""


class FencedError(JobsError, errors.FencedError):
    """A write was refused because its writer no longer holds the claim or the term."""


class QueueError(JobsError):
    """The jobs database cannot be used (unreachable, or a schema of another version)."""


class JobsValueError(JobsError, InvalidValueError):
    """A malformed or out-of-range value given to the jobs layer (a worker setting, a
    catch-up policy, an output name)."""
