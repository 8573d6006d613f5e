"""What holds now, read from riverbed's read model (:mod:`riverbed.inspect`).

Each check is one question the console also asks, turned into :class:`Alert` values:

* ``chunk.failed`` / ``job.retried_out`` (events): a job's chunk ended FAILED — after
  one attempt, or after every retry its job allows;
* ``stream.stopped`` (condition): an aggregation with batches has no active driver
  (its election is empty: stopped, killed, or its lease ran out);
* ``stream.replaced`` (event): an aggregation has a driver term it had not — a new
  driver took over, fencing any before it (a failover, or a restart);
* ``stream.lagging`` (condition): more than ``lag`` records wait in its source;
* ``host.down`` (condition): a host riverbed has seen runs no riverbed process now.

A check that cannot read its part (a jobs database not created yet, a checkpoint being
written) answers with what it could read; the error is logged, never raised, so one
broken part does not silence the others.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from riverbed.alerts.gate import Alert
from riverbed.errors import RiverbedError
from riverbed.inspect.hosts import hosts
from riverbed.inspect.sources import Sources
from riverbed.inspect.streams import stream, stream_names

log = logging.getLogger(__name__)

__all__ = ["Thresholds", "current"]

FAILED_LOOKED_AT = 500  # newest failed chunks a check reads


@dataclass(frozen=True)
class Thresholds:
    """When a number becomes an alert."""

    lag: int = 100_000  # records waiting in a stream's source


def current(src: Sources, thresholds: Thresholds) -> list[Alert]:
    """Every alert that holds now (see the module doc)."""
    out: list[Alert] = []
    for check in (_chunks, _streams, _hosts):
        try:
            out += check(src, thresholds)
        except (RiverbedError, OSError) as exc:
            log.warning("alerts: %s could not be read: %s", check.__name__.strip("_"), exc)
    return out


def _chunks(src: Sources, thresholds: Thresholds) -> list[Alert]:
    reader = src.jobs
    if reader is None:
        return []
    out = []
    for row in reader.chunks_in("FAILED", FAILED_LOOKED_AT):
        error = (row.get("error") or "").strip().splitlines()
        last = error[-1] if error else "no error recorded"
        attempts = int(row.get("attempt") or 1)
        ids = row.get("work_ids") or "[]"
        subject = f"job {row['job']} chunk {row['id']}"
        retried = attempts > 1
        out.append(
            Alert(
                f"chunk:{row['id']}:failed",
                "job.retried_out" if retried else "chunk.failed",
                "error",
                subject,
                f"{subject} (work ids {ids}) failed"
                + (f" all {attempts} attempts" if retried else "")
                + f": {last}",
                event=True,
            )
        )
    return out


def _streams(src: Sources, thresholds: Thresholds) -> list[Alert]:
    out = []
    for name in stream_names(src):
        try:
            info = stream(src, name)
        except RiverbedError as exc:
            log.warning("alerts: stream %s could not be read: %s", name, exc)
            continue
        out += _stream_alerts(name, info, thresholds)
    return out


def _stream_alerts(name: str, info: dict[str, Any], thresholds: Thresholds) -> list[Alert]:
    out = []
    subject = f"stream {name}"
    driver = info.get("driver") or {}
    if info.get("batches") and not driver.get("active"):
        out.append(
            Alert(
                f"stream:{name}:stopped",
                "stream.stopped",
                "error",
                subject,
                f"{subject} has no active driver (stopped, killed or cut off); its results "
                f"stay as of batch {max(0, int(info['batches']) - 1)}",
            )
        )
    term = info.get("term")
    if isinstance(term, int):  # one event per term: a watcher's first look takes it as history
        out.append(
            Alert(
                f"stream:{name}:term:{term}",
                "stream.replaced",
                "warning",
                subject,
                f"{subject}: a new driver took over (term {term}); any driver before it is fenced",
                event=True,
            )
        )
    per_partition = info.get("lag") or {}  # partition -> records behind
    lag = sum(int(n) for n in per_partition.values()) if isinstance(per_partition, dict) else 0
    if lag > thresholds.lag:
        out.append(
            Alert(
                f"stream:{name}:lagging",
                "stream.lagging",
                "warning",
                subject,
                f"{subject} is {lag} records behind its source (threshold {thresholds.lag})",
            )
        )
    return out


def _hosts(src: Sources, thresholds: Thresholds) -> list[Alert]:
    out = []
    for row in hosts(src)["hosts"]:
        if row["state"] == "down":
            out.append(
                Alert(
                    f"host:{row['host']}:down",
                    "host.down",
                    "error",
                    f"host {row['host']}",
                    f"host {row['host']} runs no riverbed process (a process on it last "
                    f"announced itself {_utc(row.get('last_seen'))})",
                )
            )
    return out


def _utc(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "at an unknown time"
    return "at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
