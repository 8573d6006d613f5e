"""Job specs: a module per job, its spec next to its code.

A job is a Python module in the jobs directory (``RIVERBED_JOBS_DIR``, default
``./jobs``) whose module-level ``job`` is a :class:`Job`::

    # jobs/daily_usage.py
    from riverbed.jobs import Dependency, Job

    def main(ctx, work_ids, day="today"):
        ...

    job = Job(main=main, chunk_size=50, retries=2, timeout="10m",
              dependencies=[Dependency("ingest", max_lag="1h")])

The job's name is the file's stem. Loading a module never calls ``main``; modules whose
name starts with ``_`` are helpers the jobs may import. A module that fails to import
is a :class:`~riverbed.jobs.errors.SpecError` naming the file and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from riverbed.durations import duration_seconds
from riverbed.jobs.errors import SpecError, WorkIdsError
from riverbed.specfiles import NAME, code_version, git_sha, import_file

__all__ = [
    "Catalog",
    "Dependency",
    "Job",
    "LoadedJob",
    "Schedule",
    "canonical_kwargs",
    "code_version",
    "import_file",
    "parse_work_ids",
    "schedule_job",
]

Duration = str | float | timedelta
Kind = Literal["python", "spark"]


def canonical_kwargs(kwargs: Mapping[str, Any]) -> str:
    """The one JSON text of ``kwargs`` (sorted keys): equal kwargs, equal text."""
    try:
        return json.dumps(dict(kwargs), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SpecError(
            f"job kwargs must be JSON values (str, int, float, bool, None, lists, dicts): {exc}"
        ) from None


def _frozen(kwargs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    data = dict(kwargs or {})
    canonical_kwargs(data)
    return MappingProxyType(data)


@dataclass(frozen=True)
class Dependency:
    """An edge from a job to a job it needs.

    * ``max_lag``: the dependency is pruned for a chunk only when every work id in it
      succeeded (with the same kwargs) less than ``max_lag`` ago; ``None`` = always run.
    * ``kwargs``: fixed keyword arguments for the dependency and every job below it
      (a lower edge's value for the same name wins).
    * ``allow_missing_work_ids``: fresh when the job succeeded within ``max_lag`` for
      *any* work ids.
    * ``unique``: this edge gets its own copy of the dependency instead of sharing one
      with other paths of the graph.
    """

    job: str
    max_lag: Duration | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    allow_missing_work_ids: bool = False
    unique: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not NAME.match(self.job):
            raise SpecError(f"dependency job {self.job!r} is not a job name (a module's stem)")
        if self.max_lag is not None:
            try:
                duration_seconds(self.max_lag)
            except ValueError as exc:
                raise SpecError(f"dependency on '{self.job}': max_lag: {exc}") from None
        object.__setattr__(self, "kwargs", _frozen(self.kwargs))

    @property
    def max_lag_seconds(self) -> float | None:
        return None if self.max_lag is None else duration_seconds(self.max_lag)


SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SCHEDULE_FIELDS = ("cron", "every", "name", "kwargs", "work_ids", "grace", "catchup")


@dataclass(frozen=True)
class Schedule:
    """When the job is submitted by itself: a five-field cron expression (UTC) *or* an
    interval (``every="15m"``: at the whole multiples of the period since the epoch), the
    kwargs and work ids of each fire, how late a missed fire may still run (``grace``),
    and which missed fires run after an outage (``catchup``: ``"all"`` — each once,
    oldest first — or ``"latest"`` only; see :mod:`riverbed.jobs.cron`). A job may have
    several (``schedule=[…]``), each with its own ``name``."""

    cron: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    work_ids: Sequence[int] | None = None
    grace: Duration = "10m"
    catchup: str = "all"
    every: Duration | None = None
    name: str = ""

    def __post_init__(self) -> None:
        from riverbed.jobs.cron import CATCHUP, parse_cron

        if (self.cron is None) == (self.every is None):
            raise SpecError(
                "a schedule takes cron='…' (five fields, UTC) or every='15m' — one of them"
                + (f", not both ({self.cron!r}, {self.every!r})" if self.cron else "")
            )
        if self.name and not SCHEDULE_NAME.match(str(self.name)):
            raise SpecError(
                f"schedule name {self.name!r}: letters, digits, '_' and '-' only (64 at most)"
            )
        try:
            parse_cron(self.trigger)
            duration_seconds(self.grace)
        except ValueError as exc:
            raise SpecError(f"schedule {self.trigger!r}: {exc}") from None
        if self.catchup not in CATCHUP:
            raise SpecError(
                f"schedule {self.trigger!r}: catchup must be 'all' (every missed fire inside "
                f"the grace runs once) or 'latest' (only the newest), not {self.catchup!r}"
            )
        object.__setattr__(self, "kwargs", _frozen(self.kwargs))
        if self.work_ids is not None:
            object.__setattr__(self, "work_ids", tuple(parse_work_ids(self.work_ids)))

    @property
    def trigger(self) -> str:
        """What fires it, as :mod:`riverbed.jobs.cron` reads it: the cron expression, or
        ``@every <duration>``."""
        if self.cron is not None:
            return self.cron
        every = self.every
        text = every if isinstance(every, str) else f"{duration_seconds(every)}s"  # type: ignore[arg-type]
        return f"@every {text}"

    @property
    def grace_seconds(self) -> float:
        return duration_seconds(self.grace)

    def key(self, job: str) -> str:
        """The schedule's key in the jobs database: the job's name for an unnamed one,
        else ``job:name`` (:func:`schedule_job` reads the job back)."""
        return f"{job}:{self.name}" if self.name else job


def schedule_job(key: str) -> str:
    """The job a schedule's key (:meth:`Schedule.key`) submits."""
    return key.partition(":")[0]


def _schedules(where: str, value: Any) -> tuple[Schedule, ...]:
    """A job's ``schedule`` as Schedules: a cron string, a Schedule, a dict, or a list
    of them; their keys distinct."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    out = []
    for item in items:
        if isinstance(item, str):
            item = Schedule(item)
        elif isinstance(item, Mapping):
            unknown = set(item) - set(SCHEDULE_FIELDS)
            if unknown or not ({"cron", "every"} & set(item)):
                raise SpecError(
                    f"{where}: a schedule takes cron or every, and name, kwargs, work_ids, "
                    "grace and catchup" + (f", not {', '.join(sorted(unknown))}" if unknown else "")
                )
            try:
                item = Schedule(**item)
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
        elif not isinstance(item, Schedule):
            raise SpecError(
                f"{where}: schedule must be a cron string, Schedule(...), a dict or a list of "
                f"them, not {item!r}"
            )
        out.append(item)
    names = [sched.name for sched in out]
    if len(set(names)) != len(names):
        raise SpecError(
            f"{where}: its {len(out)} schedules need distinct names (name='hourly', "
            "name='nightly', …; one may have none)"
        )
    return tuple(out)


@dataclass(frozen=True)
class Job:
    """A job's spec. ``main(ctx, work_ids, **kwargs)`` runs one chunk."""

    main: Callable[..., Any]
    name: str = ""
    chunk_size: int | None = None
    dependencies: Sequence[Dependency] = ()
    allow_multiple_jobs: bool = False
    retries: int = 0
    retry_backoff: Duration = "5s"
    timeout: Duration | None = None
    select_work: Callable[..., Iterable[int]] | None = None
    schedule: Schedule | Mapping[str, Any] | str | Sequence[Any] | None = None
    kind: Kind = "python"
    bisect: bool = False
    description: str = ""
    table: str | None = None

    def __post_init__(self) -> None:
        where = f"job '{self.name}'" if self.name else "job"
        if self.table is not None:  # each chunk's Parquet files: a partition of it
            from riverbed.tables import TableNameError, parse_table

            try:
                parse_table(self.table, "table")
            except TableNameError as exc:
                raise SpecError(f"{where}: {exc}") from None
        if not callable(self.main):
            raise SpecError(f"{where}: main must be a function main(ctx, work_ids, **kwargs)")
        if self.chunk_size is not None and (
            not isinstance(self.chunk_size, int) or self.chunk_size < 1
        ):
            raise SpecError(f"{where}: chunk_size must be a whole number ≥ 1 (or None: one chunk)")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise SpecError(f"{where}: retries must be a whole number ≥ 0")
        if self.kind not in ("python", "spark"):
            raise SpecError(f"{where}: kind must be 'python' or 'spark', not {self.kind!r}")
        try:
            duration_seconds(self.retry_backoff)
            if self.timeout is not None:
                duration_seconds(self.timeout)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        deps = tuple(self.dependencies)
        for dep in deps:
            if not isinstance(dep, Dependency):
                raise SpecError(f"{where}: dependencies must be Dependency(...), got {dep!r}")
        object.__setattr__(self, "dependencies", deps)
        if self.schedule is None:
            return
        scheds = _schedules(where, self.schedule)
        object.__setattr__(self, "schedule", scheds[0] if len(scheds) == 1 else scheds)

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """Every schedule of the job (``schedule`` holds one, or a tuple of several)."""
        if self.schedule is None:
            return ()
        return self.schedule if isinstance(self.schedule, tuple) else (self.schedule,)

    @property
    def timeout_seconds(self) -> float | None:
        return None if self.timeout is None else duration_seconds(self.timeout)

    @property
    def backoff_seconds(self) -> float:
        return duration_seconds(self.retry_backoff)


@dataclass(frozen=True)
class LoadedJob:
    """A job spec with where it came from."""

    spec: Job
    path: Path
    code_version: str

    @property
    def name(self) -> str:
        return self.spec.name


def format_work_ids(ids: Iterable[int] | None) -> str:
    """``1..6,9``-style for runs of consecutive ids (what tables and pages print); cut
    at 60 characters with the count."""
    ids = list(ids or [])
    if not ids:
        return "—"
    parts: list[str] = []
    start = prev = ids[0]
    for w in [*ids[1:], None]:
        if w is not None and w == prev + 1:
            prev = w
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if w is not None:
            start = prev = w
    text = ",".join(parts)
    return text if len(text) < 60 else f"{text[:57]}… ({len(ids)} ids)"


def parse_work_ids(value: str | Iterable[int]) -> list[int]:
    """``"1-100,205"`` or an iterable of whole numbers → sorted, unique ids."""
    if isinstance(value, str):
        ids: set[int] = set()
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                if sep:
                    a, b = int(lo), int(hi)
                    if b < a:
                        raise WorkIdsError(f"work id range {part!r} runs backwards; write {b}-{a}")
                    ids.update(range(a, b + 1))
                else:
                    ids.add(int(part))
            except ValueError:
                raise WorkIdsError(
                    f"cannot read work ids {value!r}: {part!r} is not a whole number or a "
                    "range; write e.g. 1-100,205"
                ) from None
        return sorted(ids)
    out: set[int] = set()
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            try:
                as_int = int(item)
            except (TypeError, ValueError):
                as_int = None
            if as_int is None or as_int != item:
                raise WorkIdsError(f"work id {item!r} is not a whole number")
            item = as_int
        out.add(int(item))
    return sorted(out)


DEFAULTS = "_work_ids"  # <jobs dir>/_work_ids.py: default_work_ids(job, **kwargs)


class Catalog:
    """The jobs of one directory, imported on first use and kept."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()
        self._jobs: dict[str, LoadedJob] = {}
        self._git: str | bool | None = False  # False: not asked yet

    def __repr__(self) -> str:
        return f"Catalog({str(self.directory)!r}, loaded={sorted(self._jobs)})"

    def names(self) -> list[str]:
        """Every job module in the directory (without importing them)."""
        if not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.py") if not p.stem.startswith("_"))

    def _git_sha(self) -> str | None:
        if self._git is False:
            self._git = git_sha(self.directory)
        return self._git if isinstance(self._git, str) else None

    def get(self, name: str) -> LoadedJob:
        """The job ``name`` (``<dir>/<name>.py``), imported the first time."""
        if name in self._jobs:
            return self._jobs[name]
        if not NAME.match(name):
            raise SpecError(f"{name!r} is not a job name; job names are module stems")
        path = self.directory / f"{name}.py"
        if not path.exists():
            known = ", ".join(self.names()) or "none"
            raise SpecError(
                f"no job '{name}': {path} does not exist (jobs in {self.directory}: {known}); "
                "set RIVERBED_JOBS_DIR or create the module"
            )
        loaded = self._import(name, path)
        self._jobs[name] = loaded
        return loaded

    def default_work_ids(self) -> Callable[..., Iterable[int]] | None:
        """The directory's default work-id function — ``default_work_ids(job, **kwargs)``
        in ``<dir>/_work_ids.py`` — for a submitted job without ``select_work``; None
        without the module. A module without the function is a SpecError naming it."""
        if not hasattr(self, "_defaults"):
            path = self.directory / f"{DEFAULTS}.py"
            function = None
            if path.exists():
                module = import_file(path, f"riverbed_jobs_{DEFAULTS}", f"module {DEFAULTS!r}")
                function = getattr(module, "default_work_ids", None)
                if not callable(function):
                    raise SpecError(
                        f"{path} has no function default_work_ids(job, **kwargs); define it "
                        "(returning the work ids of a job without select_work) or remove the file"
                    )
            self._defaults = function
        return self._defaults

    def load_all(self) -> tuple[list[LoadedJob], list[SpecError]]:
        """Every job of the directory; modules that fail are returned as errors."""
        jobs: list[LoadedJob] = []
        errors: list[SpecError] = []
        for name in self.names():
            try:
                jobs.append(self.get(name))
            except SpecError as exc:
                errors.append(exc)
        return jobs, errors

    def closure(self, root: str) -> dict[str, Job]:
        """``root`` and every job it depends on, transitively."""
        out: dict[str, Job] = {}
        todo = [root]
        while todo:
            name = todo.pop()
            if name in out:
                continue
            spec = self.get(name).spec
            out[name] = spec
            todo.extend(d.job for d in spec.dependencies if d.job not in out)
        return out

    def _import(self, name: str, path: Path) -> LoadedJob:
        # Jobs may import their _helpers from the jobs directory.
        module = import_file(path, f"riverbed_jobs_{name}", f"job module '{name}'", SpecError)
        job = getattr(module, "job", None)
        if not isinstance(job, Job):
            raise SpecError(
                f"{path} defines no `job = Job(main=..., ...)`; add one, or rename it "
                f"_{name}.py if it is a helper module"
            )
        if job.name and job.name != name:
            raise SpecError(
                f"{path}: Job(name={job.name!r}) differs from the module's name '{name}'; "
                "a job's name is its module's stem — drop name= or rename the file"
            )
        if not job.name:
            job = _with_name(job, name)
        for dep in job.dependencies:
            if dep.job == name:
                raise SpecError(f"{path}: job '{name}' depends on itself; remove that dependency")
        return LoadedJob(job, path, code_version(path.read_bytes(), self._git_sha()))


def _with_name(job: Job, name: str) -> Job:
    from dataclasses import replace

    return replace(job, name=name)
