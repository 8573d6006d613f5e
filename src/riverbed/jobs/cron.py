"""Cron: which fire times are due, decided purely from times (UTC, seconds).

The orchestrator stores, per schedule, the last fire time it submitted. At each tick,
:func:`due_fire` answers with at most **one** fire: the latest fire time at or before
now that is after the stored one, if it is still within the grace window — so after
an outage a schedule runs once, not once per missed tick, and a fire older than the
grace is skipped. Fires are recorded under a unique (schedule, fire time) key in the
same transaction as the submission, so a failover can never fire one twice.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

__all__ = ["due_fire", "latest_fire", "next_fire", "parse_cron"]


def parse_cron(expr: str) -> CronSim:
    """Validate a five-field cron expression (UTC); ValueError names the problem."""
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(
            f"cron expression {expr!r} must have five fields: minute hour day month weekday "
            "(e.g. '*/5 * * * *')"
        )
    try:
        return CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"cron expression {expr!r}: {exc}") from None


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def next_fire(expr: str, after: float) -> float:
    """The first fire time strictly after ``after``."""
    parse_cron(expr)
    return next(CronSim(expr, _at(after))).timestamp()


def latest_fire(expr: str, at_or_before: float) -> float:
    """The last fire time at or before ``at_or_before``."""
    parse_cron(expr)
    # CronSim in reverse yields times strictly before its start; start one second later
    # so a fire exactly at ``at_or_before`` counts (cron has minute resolution).
    return next(CronSim(expr, _at(int(at_or_before) + 1), reverse=True)).timestamp()


def due_fire(expr: str, last: float | None, now: float, grace: float) -> float | None:
    """The fire time to submit now, or None.

    ``last`` is the last fire already submitted (None: never). The answer is the latest
    fire in ``(last, now]`` when it is no older than ``grace``."""
    fire = latest_fire(expr, now)
    if last is not None and fire <= last:
        return None
    if now - fire > grace:
        return None
    return fire
