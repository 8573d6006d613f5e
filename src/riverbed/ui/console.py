"""What the console knows between page loads: the newest sample of everything cheap to
list (topics' offsets, groups' lag, streams' status, job counts, disk) and a trend per
series, taken by one background thread every ``interval`` seconds.

Pages of lists render from the sample, so a page load costs what rendering costs, not
what reading 1,600 partitions costs; detail pages (one topic's records, one run) ask
the query layer directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import riverbed.inspect as q
from riverbed.ui.trend import Trend, describe_drain, drain_seconds, rate

TREND_SECONDS = 300.0  # rates and drain estimates look this far back
STATE_EVERY = 5  # state indexes (a listing per partition of durable storage): every 5th sample


class Console:
    def __init__(
        self,
        sources: q.Sources,
        *,
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sources = sources
        self.interval = interval
        self.clock = clock
        self.trends: dict[str, Trend] = {}
        self._sample: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._taken = 0

    # -- sampling -------------------------------------------------------------------------

    def _trend(self, name: str) -> Trend:
        trend = self.trends.get(name)
        if trend is None:
            trend = self.trends[name] = Trend(keep=max(30, int(TREND_SECONDS / self.interval)))
        return trend

    def sample(self) -> dict[str, Any]:
        """Read everything the list pages show, now; record the trends."""
        src = self.sources
        errors: list[str] = []

        def attempt(what: str, read: Callable[[], Any], empty: Any) -> Any:
            try:
                return read()
            except Exception as exc:
                errors.append(f"{what}: {type(exc).__name__}: {exc}")
                return empty

        at = self.clock()
        topics = attempt("topics", lambda: q.topics(src), [])
        groups = attempt("consumer groups", lambda: q.groups(src), [])
        streams = attempt("streams", lambda: q.streams(src), [])
        joins = attempt("joins", lambda: q.joins_status(src), [])
        jobs = attempt("jobs", lambda: q.jobs(src, limit=20), {"runs": [], "counts": {}})
        disk = attempt("disk", lambda: q.disk(src), {})
        objects = attempt("the log's objects", lambda: q.objects(src), None)
        previous = self._sample
        if previous is None or self._taken % STATE_EVERY == 0:
            state = attempt("state", lambda: q.state(src), [])
            state_at = at
        else:
            state, state_at = previous["state"], previous["state_at"]
        self._taken += 1
        with self._lock:
            for t in topics:
                trend = self._trend(f"topic/{t['name']}")
                trend.add(at, sum(p["end"] for p in t["partitions"]))
                t["rate"] = rate(trend.recent(60.0))
                t["spark"] = trend.recent(TREND_SECONDS)
            for g in groups:
                trend = self._trend(f"group/{g['group']}")
                trend.add(at, g["lag"])
                recent = trend.recent(60.0)
                g["drain_s"] = drain_seconds(recent)
                g["drain"] = describe_drain(g["drain_s"], g["lag"])
                g["trend"] = trend.recent(TREND_SECONDS)
            for s in streams:
                trend = self._trend(f"stream/{s['name']}")
                trend.add(at, s.get("input_records") or 0)
                s["ingest_rate"] = rate(trend.recent(60.0))
                lag = sum((s.get("lag") or {}).values())
                lag_trend = self._trend(f"stream-lag/{s['name']}")
                lag_trend.add(at, lag)
                s["lag_total"] = lag
                s["lag_trend"] = lag_trend.recent(TREND_SECONDS)
            sample = {
                "at": at,
                "topics": topics,
                "groups": groups,
                "streams": streams,
                "joins": joins,
                "jobs": jobs,
                "disk": disk,
                "objects": objects,
                "state": state,
                "state_at": state_at,
                "errors": errors,
                "took_s": round(self.clock() - at, 3),
            }
            self._sample = sample
        return sample

    def latest(self) -> dict[str, Any]:
        """The newest sample (taken now if there is none yet)."""
        with self._lock:
            sample = self._sample
        return sample if sample is not None else self.sample()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="riverbed-ui-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            took = time.monotonic() - started
            # never more than a third of a core: a big home samples less often, pages stay fast
            self._stop.wait(max(0.2, self.interval - took, 2 * took))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    # -- the overview -----------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """What is wrong now: worst lag and its trend, failing jobs, the largest
        watermark gap, stopped drivers, standbys, disk."""
        s = self.latest()
        lags = [
            {"kind": "group", "name": g["group"], "lag": g["lag"], "drain": g["drain"],
             "trend": g["trend"]}
            for g in s["groups"]
        ] + [
            {"kind": "stream", "name": st["name"], "lag": st["lag_total"],
             "drain": describe_drain(drain_seconds(st["lag_trend"][-30:]), st["lag_total"]),
             "trend": st["lag_trend"]}
            for st in s["streams"]
        ]  # fmt: skip
        worst = max(lags, key=lambda x: x["lag"], default=None)
        gaps = [st for st in s["streams"] if st.get("watermark_gap_s") is not None]
        widest = max(gaps, key=lambda st: st["watermark_gap_s"], default=None)
        counts = s["jobs"].get("counts", {})
        failing = [r for r in s["jobs"].get("runs", []) if r.get("state") == "FAILED"]
        return {
            "at": s["at"],
            "worst_lag": worst,
            "lags": sorted(lags, key=lambda x: -x["lag"])[:10],
            "failed_chunks": counts.get("FAILED", 0),
            "failing_runs": failing[:10],
            "widest_watermark_gap": None
            if widest is None
            else {"name": widest["name"], "seconds": widest["watermark_gap_s"]},
            "stopped_drivers": [st["name"] for st in s["streams"] if not st["driver"]["active"]],
            "standbys": {
                st["name"]: st["driver"]["standbys"]
                for st in s["streams"]
                if st["driver"]["standbys"]
            },
            "disk": s["disk"],
            "log_bytes": sum(t["bytes"] for t in s["topics"]),
            "counts": {
                "topics": len(s["topics"]),
                "groups": len(s["groups"]),
                "streams": len(s["streams"]),
                "chunks": counts,
            },
            "errors": s["errors"],
            "sample_took_s": s["took_s"],
        }
