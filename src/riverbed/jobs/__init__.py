"""Jobs: recurring data jobs with specs next to their code (see docs/jobs.md)."""

from __future__ import annotations

from riverbed.jobs.errors import (
    CycleError,
    FencedError,
    JobsError,
    NotFoundError,
    QueueError,
    SpecError,
    WorkIdsError,
)
from riverbed.jobs.spec import Catalog, Dependency, Job, LoadedJob, Schedule, parse_work_ids

__all__ = [
    "Catalog",
    "CycleError",
    "Dependency",
    "FencedError",
    "Job",
    "JobsError",
    "LoadedJob",
    "NotFoundError",
    "QueueError",
    "Schedule",
    "SpecError",
    "WorkIdsError",
    "parse_work_ids",
]
