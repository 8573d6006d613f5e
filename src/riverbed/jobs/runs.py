"""Planning and submitting runs: the specs (catalog) and the queue, put together.

The resolver (:mod:`riverbed.jobs.graph`) is pure; this module feeds it what the
database knows (freshness, active chunks, its clock) **inside the submitting
transaction**, so the plan written is the plan resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from riverbed.jobs.errors import SpecError, WorkIdsError
from riverbed.jobs.graph import ActiveChunk, Freshness, Plan, node_keys, resolve
from riverbed.jobs.queue import JobQueue, Policy
from riverbed.jobs.spec import Catalog, Job, parse_work_ids


def work_ids_for(
    catalog: Catalog, job: str, explicit: Sequence[int] | str | None, kwargs: Mapping[str, Any]
) -> list[int]:
    """The run's work ids: given, else the root job's ``select_work(**kwargs)``, else
    the jobs directory's ``default_work_ids(job, **kwargs)`` (``_work_ids.py``), else
    none (each job then runs as one chunk without work ids)."""
    if explicit is not None:
        return parse_work_ids(explicit)
    spec = catalog.get(job).spec
    default = catalog.default_work_ids() if spec.select_work is None else None
    if spec.select_work is None and default is None:
        return []
    what = f"select_work() of job '{job}'" if default is None else f"default_work_ids('{job}')"
    try:
        if spec.select_work is not None:
            chosen = spec.select_work(**kwargs)
        else:
            assert default is not None
            chosen = default(job, **kwargs)
    except Exception as exc:
        raise WorkIdsError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    return parse_work_ids(chosen)


def policies(catalog: Catalog, specs: Mapping[str, Job]) -> dict[str, Policy]:
    out = {}
    for name, spec in specs.items():
        loaded = catalog.get(name)
        out[name] = Policy(
            kind=spec.kind,
            max_attempts=spec.retries + 1,
            backoff=spec.backoff_seconds,
            timeout=spec.timeout_seconds,
            bisect=spec.bisect,
            code_version=loaded.code_version,
        )
    return out


def code_versions(catalog: Catalog, specs: Mapping[str, Job]) -> dict[str, str]:
    """Each job's current code version (what a chunk submitted now would run)."""
    return {name: catalog.get(name).code_version for name in specs}


def plan(
    catalog: Catalog,
    queue: JobQueue | None,
    job: str,
    work_ids: Sequence[int] | str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    stale_only: bool = False,
) -> Plan:
    """Resolve without writing anything (freshness and active chunks from ``queue``);
    ``stale_only``: the root's chunks only where the current code has not run them."""
    kwargs = dict(kwargs or {})
    specs = catalog.closure(job)
    ids = work_ids_for(catalog, job, work_ids, kwargs)
    fresh, active, now = Freshness(), list[ActiveChunk](), 0.0
    if queue is not None:
        with queue.db.read() as conn:
            fresh, active = queue.inputs(conn, node_keys(specs, job, kwargs), lock=False)
            now = queue._now(conn)
    code = code_versions(catalog, specs)
    return resolve(specs, job, ids, kwargs, fresh, active, now, code, stale_only)


def prepare(
    catalog: Catalog,
    queue: JobQueue,
    job: str,
    work_ids: Sequence[int] | str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    schedule: str | None = None,
    fire_time: float | None = None,
    parent: int | None = None,
    stale_only: bool = False,
) -> Callable[[Connection | None], tuple[int, Plan]]:
    """Everything of a submission that runs the job's code (its work ids, the graph's
    keys, the code versions), done now; returns the writer of the run, which resolves
    and queues it in ``conn``'s transaction (or its own) — so no transaction waits on
    job code. ``stale_only``: the root's chunks only where the current code has not run
    them."""
    kwargs = dict(kwargs or {})
    specs = catalog.closure(job)
    ids = work_ids_for(catalog, job, work_ids, kwargs)
    nodes = node_keys(specs, job, kwargs)
    code = code_versions(catalog, specs)
    pols = policies(catalog, specs)

    def plan_for(fresh: Freshness, active: Sequence[ActiveChunk], now: float) -> Plan:
        return resolve(specs, job, ids, kwargs, fresh, active, now, code, stale_only)

    def write(conn: Connection | None) -> tuple[int, Plan]:
        return queue.submit(
            nodes, plan_for, pols, conn=conn, schedule=schedule, fire_time=fire_time, parent=parent
        )

    return write


def submit(
    catalog: Catalog,
    queue: JobQueue,
    job: str,
    work_ids: Sequence[int] | str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    parent: int | None = None,
    stale_only: bool = False,
) -> tuple[int, Plan]:
    """Resolve and queue a run in one transaction; returns (master id, plan).
    ``stale_only``: the root's chunks only where the current code has not run them."""
    write = prepare(catalog, queue, job, work_ids, kwargs, parent=parent, stale_only=stale_only)
    return write(None)


def rerun(catalog: Catalog, queue: JobQueue, run_or_chunk: int) -> int:
    """Run again with the same job, kwargs and work ids: a run is resolved afresh; a
    chunk runs again alone. Returns the new run's id."""
    import json

    row = queue.get(run_or_chunk)
    kwargs = json.loads(row["kwargs"])
    ids = json.loads(row["work_ids"])
    if row["kind"] == "master":
        master, _ = submit(catalog, queue, row["job"], ids, kwargs, parent=run_or_chunk)
        return master
    if row["job"] not in catalog.names():
        raise SpecError(f"job '{row['job']}' of chunk {run_or_chunk} no longer exists")
    spec = catalog.get(row["job"]).spec
    single = {row["job"]: _without_dependencies(spec)}
    nodes = node_keys(single, row["job"], kwargs)
    code = code_versions(catalog, single)

    def plan_for(fresh: Freshness, active: Sequence[ActiveChunk], now: float) -> Plan:
        return resolve(single, row["job"], ids, kwargs, fresh, (), now, code)

    master, _ = queue.submit(nodes, plan_for, policies(catalog, single), parent=run_or_chunk)
    return master


def _without_dependencies(spec: Job) -> Job:
    from dataclasses import replace

    return replace(spec, dependencies=(), chunk_size=None)
