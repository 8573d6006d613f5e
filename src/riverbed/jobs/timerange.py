"""A time-range job as a job of the orchestrator: cron, dependencies, retries, workers —
and the one module users import time-range jobs from (it re-exports the engine,
:mod:`riverbed.timerange`, which sits below the orchestrator).

::

    # jobs/sensor_metrics.py  (in RIVERBED_JOBS_DIR)
    from riverbed.jobs import Dependency
    from riverbed.jobs.timerange import ParquetInput, Rolling, TimeRangeJob

    metrics = TimeRangeJob(input=ParquetInput("data/readings", partition="hour"),
                           key="sensor_id", time="ts",
                           metrics=[Rolling("30min", "value", ["mean"])], chunk="1h")

    job = metrics.as_job(start="2026-01-01", delay="10min", schedule="5 * * * *",
                         dependencies=[Dependency("ingest", max_lag="1h")], retries=3)

Each run of the job drives the time-range job from its origin (``start``) up to the
last chunk edge at or before ``now - delay`` — resuming what earlier runs published, so
an hourly cron computes the new hour and a run after an outage catches up. kwargs
``end`` (a time, or ``"now"``), ``start`` and ``rerun`` (late corrections) override a
run: ``riverbed jobs submit sensor_metrics --kwarg start=2026-01-03 --kwarg
end=2026-01-04 --kwarg rerun=true``.

Exactly-once holds through everything the orchestrator does: a retried or reclaimed
attempt is one more driver of the same job, and the time-range election and marker
decide which driver may publish (a zombie attempt publishes nothing; the next one
resumes after the last published chunk). The same file also works with ``riverbed
timerange run|status|reset``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed import timerange as engine
from riverbed.config import Config
from riverbed.control import connect
from riverbed.durations import duration_ms
from riverbed.jobs.spec import Dependency, Job, Schedule
from riverbed.timerange import *  # noqa: F403 - re-exported: users import time-range jobs here
from riverbed.timerange import (
    Driver,
    Event,
    LoadedSpec,
    SpecError,
    TimeRangeSpec,
    format_time,
    parse_time,
)
from riverbed.timerange.spec import placed

if TYPE_CHECKING:
    from collections.abc import Mapping

    from riverbed.jobs.context import Context

__all__ = [*engine.__all__, "TimeRangeJob", "TimeRangeMain", "as_job"]


@dataclass(frozen=True)
class TimeRangeMain:
    """``main(ctx, work_ids, **kwargs)`` of a time-range job run by a worker."""

    job: TimeRangeSpec
    start: int  # the origin (µs)
    delay_us: int = 0
    ttl: int = 10

    def end_at(self, now_us: int) -> int:
        """The last chunk edge at or before ``now - delay``."""
        chunk = self.job.chunk_us
        at = now_us - self.delay_us
        return self.start + (at - self.start) // chunk * chunk

    @property
    def timerange_spec(self) -> TimeRangeSpec:
        """The spec this main runs (how ``load_spec`` finds it inside a job)."""
        return self.job

    def loaded(self, name: str, path: Path, version: str, config: Config) -> LoadedSpec:
        job = placed(self.job, name, config.checkpoints, config.log_url)
        return LoadedSpec(job, path, version)

    def __call__(
        self,
        ctx: Context,
        work_ids: Sequence[int],
        start: str | None = None,
        end: str | None = None,
        rerun: bool = False,
    ) -> None:
        if work_ids:
            raise SpecError(
                f"time-range job '{ctx.job}' takes no work ids; give the range as kwargs "
                "start=… end=… (default: from its origin up to now - delay)"
            )
        lo = parse_time(start) if start is not None else self.start
        hi = self.end_at(int(time.time() * 1e6)) if end in (None, "now") else parse_time(end)
        if hi <= lo:
            ctx.log.info(
                "time-range job '%s': no whole chunk between %s and %s yet",
                ctx.job,
                format_time(lo),
                format_time(hi),
            )
            return
        path = ctx.spec_path or Path(f"{ctx.job}.py")
        config = ctx.config if ctx.config is not None else Config()
        spec = self.loaded(ctx.job, path, ctx.code_version or "unknown", config)

        def on_event(event: Event) -> None:
            if event.kind == "chunk" and event.record is not None:
                r = event.record
                ctx.log.info(
                    "published %s (%d rows, %.1f s)", format_time(r.start), r.rows, r.seconds
                )
            elif event.kind == "planned" and event.progress is not None:
                p = event.progress
                ctx.log.info(
                    "time-range job '%s': %d/%d chunks done, computing up to %s",
                    ctx.job,
                    p.done,
                    p.total,
                    format_time(p.target),
                )
            elif event.kind in ("standby", "leader"):
                ctx.log.info("time-range job '%s': %s %s", ctx.job, event.kind, event.detail)

        cp = connect(config.control_url)
        try:
            driver = Driver(spec, cp, lambda: ctx.spark, ttl=self.ttl, on_event=on_event)
            progress = driver.run(lo, hi, rerun=bool(rerun))
        finally:
            cp.close()
        ctx.log.info(
            "time-range job '%s': %d/%d chunks done up to %s",
            ctx.job,
            progress.done,
            progress.total,
            format_time(progress.done_to),
        )


def as_job(
    job: TimeRangeSpec,
    *,
    start: str | Any,
    delay: str | int = 0,
    schedule: Schedule | Mapping[str, Any] | str | None = None,
    dependencies: Sequence[Dependency] = (),
    retries: int = 0,
    retry_backoff: str = "30s",
    timeout: str | None = None,
    ttl: int = 10,
    description: str = "",
) -> Job:
    """The orchestrator's :class:`~riverbed.jobs.Job` that runs ``job`` (see the module)."""
    try:
        origin = parse_time(start)
    except Exception as exc:
        raise SpecError(f"as_job(start=...): {exc}") from None
    try:
        delay_us = duration_ms(delay) * 1000 if delay else 0
    except (ValueError, TypeError) as exc:
        raise SpecError(f"as_job(delay=...): {exc}") from None
    main = TimeRangeMain(job, origin, delay_us, ttl)
    return Job(
        main=main,
        kind="spark",
        schedule=schedule,
        dependencies=dependencies,
        retries=retries,
        retry_backoff=retry_backoff,
        timeout=timeout,
        description=description or job.description,
    )


class TimeRangeJob(TimeRangeSpec):
    """The spec of a time-range job, as users write it (see :class:`TimeRangeSpec` for
    its fields), and :meth:`as_job` to run it under the orchestrator. It lives here,
    above the driver, because ``as_job`` builds a job whose main runs the driver."""

    def as_job(self, **options: Any) -> Job:
        """This job as a job of the orchestrator (cron, dependencies, retries, workers):
        see :func:`as_job` for the options."""
        return as_job(self, **options)
