"""Jobs: runs, chunks, attempts, schedules, and an attempt's log."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from riverbed.errors import RiverbedError
from riverbed.inspect.sources import QueryError, Sources


def _job_row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for field in ("work_ids", "kwargs"):
        if isinstance(out.get(field), str):
            with contextlib.suppress(ValueError):
                out[field] = json.loads(out[field])
    if out.get("error") and len(str(out["error"])) > 300 and "attempts" not in out:
        out["error_head"] = str(out["error"]).splitlines()[0][:300]
    return out


def jobs(src: Sources, state: str | None = None, limit: int = 100) -> dict[str, Any]:
    """Runs (newest first, ``state`` filters), chunk counts by state, the orchestrator,
    workers holding chunks, and schedules with their next fire."""
    reader = src.jobs
    if reader is None:
        return {"db": src.config.jobs_db_url, "exists": False, "runs": [], "counts": {}}
    term, leader = reader.leader()
    from riverbed.control import Registry
    from riverbed.jobs.worker import WORKERS

    workers: dict[str, dict[str, Any]] = {}
    for m in Registry(src.control, WORKERS).members():  # live workers and their slots
        workers[m.id] = {
            "worker": m.id,
            "host": m.metadata.get("host"),
            "slots": m.metadata.get("concurrency", 1),
            "kinds": m.metadata.get("kinds"),
            "live": True,
            "chunks": [],
        }
    for chunk in reader.chunks_in("RUNNING", 500):
        name = chunk["worker"] or "?"
        w = workers.setdefault(
            name,
            {"worker": name, "host": chunk["host"], "slots": None, "live": False, "chunks": []},
        )  # a worker that holds a chunk but is gone: the orchestrator will reap it
        w["chunks"].append(chunk["id"])
        w["heartbeat_at"] = max(w.get("heartbeat_at") or 0, chunk["heartbeat_at"] or 0)
    now = reader.now()
    return {
        "db": src.config.jobs_db_url,
        "exists": True,
        "now": now,
        "orchestrator": {"term": term, "leader": leader},
        "counts": reader.counts(),
        "runs": [_job_row(r) for r in reader.runs(state, limit)],
        "workers": list(workers.values()),
        "schedules": [_schedule(s, now) for s in reader.schedules()],
    }


def _schedule(row: dict[str, Any], now: float) -> dict[str, Any]:
    from riverbed.jobs.cron import next_fire
    from riverbed.jobs.spec import schedule_job

    out = dict(row)
    out["schedule"] = row["job"]  # the schedule's key: the job, or job:name of several
    out["job"] = schedule_job(row["job"])
    try:
        out["next_fire"] = next_fire(row["cron"], now)
    except ValueError:
        out["next_fire"] = None
    return out


def _row_of(src: Sources, chunk_id: int) -> tuple[Any, dict[str, Any]]:
    """The jobs reader and one run's or chunk's row, or the QueryError that says why not."""
    reader = src.jobs
    if reader is None:
        raise QueryError(f"no jobs database at {src.config.jobs_db_url} yet")
    try:
        return reader, reader.get(chunk_id)
    except RiverbedError as exc:
        raise QueryError(str(exc)) from None


def run(src: Sources, run_id: int, offset: int = 0, limit: int = 200) -> dict[str, Any]:
    """A run: its row, its chunks by state, a page of its chunks (``offset``, ``limit``)
    with upstream ids, and freshness per work id of the jobs on that page."""
    reader, master = _row_of(src, run_id)
    if master["kind"] != "master":
        raise QueryError(f"{run_id} is a chunk of run {master['master']}, not a run")
    chunks = [_job_row(c) for c in reader.graph(run_id, max(0, offset), max(1, limit))]
    counts = reader.run_counts(run_id)
    now = reader.now()
    freshness = []
    from riverbed.jobs.spec import canonical_kwargs

    by_job: dict[tuple[str, str], set[int]] = {}
    for c in chunks:  # freshness is kept per job and kwargs, as their canonical JSON
        key = (c["job"], canonical_kwargs(c["kwargs"]))
        by_job.setdefault(key, set()).update(c["work_ids"])
    for (job, kwargs), id_set in sorted(by_job.items()):
        ids = sorted(id_set)
        fresh = reader.fresh_ids(job, kwargs)
        freshness.append(
            {
                "job": job,
                "kwargs": json.loads(kwargs),
                "work_ids": [
                    {"id": w, "age_s": None if w not in fresh else round(now - fresh[w], 1)}
                    for w in ids[:1000]
                ],
                "shown": min(len(ids), 1000),
                "of": len(ids),
            }
        )
    return {
        "run": _job_row(master),
        "counts": counts,
        "total": sum(counts.values()),
        "offset": max(0, offset),
        "chunks": chunks,
        "freshness": freshness,
    }


def chunk(src: Sources, chunk_id: int) -> dict[str, Any]:
    """A chunk with its attempts (errors and tracebacks) and where each attempt logs."""
    from riverbed.jobs.worker import log_path

    _, row = _row_of(src, chunk_id)
    out = _job_row(row)
    for a in out["attempts"]:
        path = log_path(src.config.home, chunk_id, a["attempt"])
        a["log_bytes"] = path.stat().st_size if path.exists() else None
    return out


def chunk_log(src: Sources, chunk_id: int, attempt: int, offset: int = 0) -> dict[str, Any]:
    """An attempt's log from byte ``offset`` (at most 256 KiB), and the next offset:
    what a tailing page asks for again."""
    from riverbed.jobs.worker import log_path

    path = log_path(src.config.home, chunk_id, attempt)
    if not path.exists():
        return {"chunk": chunk_id, "attempt": attempt, "text": "", "next": 0, "exists": False}
    size = path.stat().st_size
    offset = max(0, min(offset, size))
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(256 * 1024)
    return {
        "chunk": chunk_id,
        "attempt": attempt,
        "text": data.decode("utf-8", "backslashreplace"),
        "next": offset + len(data),
        "size": size,
        "exists": True,
    }
