"""Cron: which fire times are due, decided purely from times (UTC, seconds).

The orchestrator stores, per schedule, the last fire time it submitted. At each tick,
:func:`due_fires` answers with the fire times to submit now, oldest first — fire times
after the stored one, at or before now, and no older than the schedule's ``grace``.
What happens to fires that fell due while no orchestrator ticked (an outage, or a
leadership move slower than the schedule's period) is the schedule's **catch-up
policy**, as in Airflow's ``catchup``:

* ``"all"`` (default): every missed fire inside the grace window runs, once each,
  oldest first — a failover never drops a fire;
* ``"latest"``: only the newest missed fire runs (for jobs where a newer run
  supersedes older ones).

Fires older than the grace are never run: :func:`missed_fires` counts them, and the
orchestrator records and logs them as missed. Each fire is recorded under a unique
(schedule, fire time) key in the same transaction as its submission, so no fire runs
twice across any number of failovers. A schedule never fired before starts with the
latest fire only (it does not backfill its past).

A trigger is a five-field cron expression (UTC) or an interval, ``@every 15m`` (any
duration of :mod:`riverbed.durations`, at least a second): it fires at the whole
multiples of its period since the epoch (``@every 15m`` at :00, :15, :30, :45), so
every orchestrator computes the same fire times — which is what keeps a fire once
across failovers.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

from riverbed.durations import duration_seconds
from riverbed.jobs.errors import JobsValueError

__all__ = [
    "CATCHUP",
    "due_fire",
    "due_fires",
    "every",
    "latest_fire",
    "missed_fires",
    "next_fire",
    "parse_cron",
]

EVERY = "@every "  # an interval trigger: "@every 15m"


def every(expr: str) -> float | None:
    """The period of an interval trigger (``@every 15m``) in seconds; None for cron."""
    if not isinstance(expr, str) or not expr.startswith(EVERY):
        return None
    text = expr[len(EVERY) :].strip()
    try:
        period = duration_seconds(text)
    except ValueError as exc:
        raise JobsValueError(f"interval {text!r}: {exc}") from None
    if not math.isfinite(period) or period < 1:
        raise JobsValueError(f"interval {text!r} must be at least one second (e.g. '15m')")
    return float(period)


CATCHUP = ("all", "latest")  # the catch-up policies (see the module doc)
MAX_CATCHUP = 1000  # fires submitted by one catch-up at most (a tiny period, a long grace)


def parse_cron(expr: str) -> CronSim | float:
    """Validate a trigger — a five-field cron expression (UTC), or ``@every <duration>``
    (returns its period); ValueError names the problem."""
    period = every(expr)
    if period is not None:
        return float(period)
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise JobsValueError(
            f"cron expression {expr!r} must have five fields: minute hour day month weekday "
            "(e.g. '*/5 * * * *')"
        )
    try:
        return CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise JobsValueError(f"cron expression {expr!r}: {exc}") from None


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _multiple_at_or_before(t: float, period: float) -> float:
    """The largest whole multiple of ``period`` at or before ``t`` (the division rounds:
    the answer is checked against ``t`` itself)."""
    k = math.floor(t / period)
    while k * period > t:
        k -= 1
    while (k + 1) * period <= t:
        k += 1
    return k * period


def next_fire(expr: str, after: float) -> float:
    """The first fire time strictly after ``after``."""
    period = parse_cron(expr)
    if isinstance(period, float):
        return _multiple_at_or_before(after, period) + period
    return next(CronSim(expr, _at(after))).timestamp()


def latest_fire(expr: str, at_or_before: float) -> float:
    """The last fire time at or before ``at_or_before``."""
    period = parse_cron(expr)
    if isinstance(period, float):
        return _multiple_at_or_before(at_or_before, period)
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


def due_fires(
    expr: str, last: float | None, now: float, grace: float, catchup: str = "all"
) -> list[float]:
    """The fire times to submit now, oldest first (see the module doc)."""
    if catchup not in CATCHUP:
        raise JobsValueError(f"catchup must be one of {', '.join(CATCHUP)}, not {catchup!r}")
    newest = due_fire(expr, last, now, grace)
    if newest is None or last is None or catchup == "latest":
        return [] if newest is None else [newest]
    fires: list[float] = []
    fire = next_fire(expr, max(last, now - grace - 1.0))
    while fire <= newest and len(fires) < MAX_CATCHUP:
        if now - fire <= grace:
            fires.append(fire)
        fire = next_fire(expr, fire)
    if not fires or fires[-1] != newest:
        fires.append(newest)  # past the cap: the newest still runs
    return fires


def missed_fires(
    expr: str, last: float | None, now: float, grace: float, cap: int = 10_000
) -> tuple[int, float | None]:
    """Fires after ``last`` that are older than ``grace`` at ``now`` — those that can no
    longer run: how many (counted up to ``cap``) and the newest of them."""
    if last is None:
        return 0, None
    count, newest = 0, None
    fire = next_fire(expr, last)
    while now - fire > grace and count < cap:
        count, newest = count + 1, fire
        fire = next_fire(expr, fire)
    return count, newest
