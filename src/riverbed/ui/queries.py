"""The query layer: what ``riverbed ui`` shows and the CLI prints with ``--json``.

Every function takes :class:`Sources` and returns plain JSON-ready data (dicts, lists,
numbers, strings), so a page, its JSON endpoint, ``/metrics`` and the CLI read the same
thing. Reads never take a lock a running job needs: topics are read through the log's
readers, groups from the control plane's keys, state through durable storage into a
private directory, jobs with plain SELECTs.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from riverbed.config import Config
from riverbed.errors import RiverbedError
from riverbed.stream.layout import Checkpoint, aggregations, state_root

__all__ = ["QueryError", "Sources"]


class QueryError(RiverbedError):
    """A query named something that does not exist, or asked in a way it cannot answer."""


def _local(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return Path(parts.path if parts.scheme else url)
    if parts.scheme == "sqlite":
        return Path(parts.path[1:] if parts.path.startswith("//") else parts.path)
    return None


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    try:
        for f in path.rglob("*"):
            try:
                if f.is_file():
                    total += f.stat().st_size
            except OSError:
                continue  # a file removed while we walked (segment retention, purge)
    except OSError:
        return total
    return total


class Sources:
    """Where the console reads, opened once (lazily) from a :class:`Config`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._log: Any = None
        self._cp: Any = None
        self._state: Any = None
        self._jobs: Any = None

    @property
    def log(self) -> Any:
        with self._lock:
            if self._log is None:
                import riverbed.log

                self._log = riverbed.log.open(self.config.log_url)
            return self._log

    @property
    def control(self) -> Any:
        with self._lock:
            if self._cp is None:
                from riverbed.control import connect

                self._cp = connect(self.config.control_url)
            return self._cp

    @property
    def checkpoints(self) -> Path:
        path = _local(self.config.checkpoints_url)
        if path is None:
            raise QueryError(f"checkpoints at {self.config.checkpoints_url}: only local paths")
        return path

    @property
    def state(self) -> Any:
        with self._lock:
            if self._state is None:
                from riverbed.state import StateConfig, StateProvider

                self._state = StateProvider(
                    StateConfig(
                        local_dir=self.config.state_dir, durable=state_root(self.checkpoints)
                    )
                )
            return self._state

    @property
    def jobs(self) -> Any:
        """The jobs database's reader, or None when there is none yet (a SQLite file
        that does not exist is not created by looking at it)."""
        with self._lock:
            if self._jobs is None:
                url = self.config.jobs_db_url
                path = _local(url) if url.startswith("sqlite") else None
                if path is not None and not path.exists():
                    return None
                from riverbed.jobs.reads import QueueReader

                self._jobs = QueueReader(url)
            return self._jobs

    def close(self) -> None:
        for thing in (self._log, self._cp, self._jobs):
            if thing is not None:
                thing.close()
        self._log = self._cp = self._jobs = self._state = None


# -- topics -----------------------------------------------------------------------------


def topics(src: Sources) -> list[dict[str, Any]]:
    """Every topic: its partitions with first/next offsets and bytes."""
    return [topic(src, name) for name in src.log.topics()]


def topic(src: Sources, name: str) -> dict[str, Any]:
    log = src.log
    if name not in log.topics():
        known = ", ".join(log.topics()[:20]) or "none"
        raise QueryError(f"no topic '{name}' in {log.url} (topics: {known})")
    config = log.topic(name)
    parts = []
    for p in range(config.partitions):
        start, end = log.storage.offsets(name, p)
        parts.append(
            {
                "partition": p,
                "start": start,
                "end": end,
                "records": end - start,
                "bytes": log.storage.size(name, p),
            }
        )
    return {
        "name": name,
        "partitions": parts,
        "serde": config.serde,
        "schema": config.schema,
        "records": sum(p["records"] for p in parts),
        "bytes": sum(p["bytes"] or 0 for p in parts),
        "skipped": [
            {"partition": s.partition, "start": s.start, "end": s.end, "reason": s.reason}
            for s in config.skipped
        ],
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


_WHERE = re.compile(r"\s*([A-Za-z_][\w.]*)\s*(=|!=|~)\s*(.*)\Z")


def parse_where(text: str) -> tuple[str, str, str]:
    """``field=value``, ``field!=value`` or ``field~text`` (contains) on a record's
    value fields (dotted for nested ones)."""
    match = _WHERE.match(text)
    if not match:
        raise QueryError(
            f"filter {text!r} is not FIELD=VALUE, FIELD!=VALUE or FIELD~TEXT "
            "(e.g. flag=flag-03 or user.name~ann)"
        )
    return match.group(1), match.group(2), match.group(3).strip()


def _field(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def _matches(value: Any, where: tuple[str, str, str]) -> bool:
    name, op, wanted = where
    found = _field(value, name)
    if found is _MISSING:
        return False
    text = found if isinstance(found, str) else json.dumps(_jsonable(found))
    if op == "~":
        return wanted in text
    return (text == wanted) == (op == "=")


def browse(
    src: Sources,
    name: str,
    partition: int,
    *,
    offset: int | None = None,
    at_ms: int | None = None,
    key: str | None = None,
    where: str | None = None,
    limit: int = 50,
    scan: int = 10_000,
) -> dict[str, Any]:
    """Records of one partition from ``offset`` (or the first at/after ``at_ms``), those
    with ``key`` and matching ``where``; at most ``limit`` of them, looking at no more
    than ``scan`` records. Says how many it scanned of how many there are, and where
    the next page starts."""
    info = topic(src, name)
    if not 0 <= partition < len(info["partitions"]):
        raise QueryError(
            f"topic '{name}' has partitions 0..{len(info['partitions']) - 1}, not {partition}"
        )
    part = info["partitions"][partition]
    first, end = part["start"], part["end"]
    if offset is not None and at_ms is not None:
        raise QueryError("seek by offset or by time, not both")
    start = first if offset is None else max(first, min(offset, end))
    if at_ms is not None:
        start = src.log.storage.offset_for_time(name, partition, at_ms)
    condition = parse_where(where) if where else None
    wanted_key = key.encode() if key is not None else None
    log = src.log
    found: list[dict[str, Any]] = []
    scanned = 0
    position = start
    while position < end and scanned < scan and len(found) < limit:
        batch = log.read(name, partition, position, min(500, scan - scanned))
        if not batch:
            break
        for record in batch:
            scanned += 1
            position = record.offset + 1
            if wanted_key is not None and record.key != wanted_key:
                continue
            if condition is not None and not _matches(record.value, condition):
                continue
            found.append(
                {
                    "offset": record.offset,
                    "timestamp": record.timestamp.isoformat(),
                    "key": None if record.key is None else _jsonable(record.key),
                    "value": _jsonable(record.value),
                    "headers": {k: _jsonable(v) for k, v in record.headers.items()},
                }
            )
            if len(found) >= limit or scanned >= scan:
                break
    return {
        "topic": name,
        "partition": partition,
        "from": start,
        "next": position,
        "first": first,
        "end": end,
        "records": found,
        "scanned": scanned,
        "of": end - start,
        "more": position < end,
    }


# -- consumer groups --------------------------------------------------------------------


def group_names(src: Sources) -> list[str]:
    from riverbed.log.group.consumer import list_groups

    names: list[str] = list_groups(src.control)
    return names


def group(src: Sources, name: str) -> dict[str, Any]:
    return group_of(src.log, src.control, name)


def group_of(log: Any, cp: Any, name: str) -> dict[str, Any]:
    """Members, leader, generation, and per partition owner, committed, end and lag."""
    from riverbed.log.group import describe_group

    desc = describe_group(log, cp, name)
    parts = [
        {
            "topic": p.topic,
            "partition": p.partition,
            "owner": p.owner,
            "committed": p.committed,
            "end": p.end,
            "lag": p.lag,
        }
        for p in desc.partitions
    ]
    return {
        "group": desc.group,
        "generation": desc.generation,
        "members": desc.members,
        "leader": desc.leader,
        "partitions": parts,
        "lag": sum(p["lag"] for p in parts),
    }


def groups(src: Sources) -> list[dict[str, Any]]:
    return [group(src, name) for name in group_names(src)]


# -- streams ----------------------------------------------------------------------------


def stream_names(src: Sources) -> list[str]:
    """Aggregations with a checkpoint (a batch ledger) under the checkpoints root."""
    return aggregations(src.checkpoints)


def _manifest(src: Sources, name: str) -> dict[str, Any]:
    from riverbed.stream.job import read_manifest

    checkpoint = src.checkpoints / name
    if not Checkpoint(checkpoint).batches.is_dir():
        known = ", ".join(stream_names(src)) or "none"
        raise QueryError(f"no aggregation '{name}' in {src.checkpoints} (aggregations: {known})")
    return read_manifest(checkpoint) or {"name": name, "checkpoint": str(checkpoint)}


def _driver(src: Sources, name: str) -> dict[str, Any]:
    """The active driver of an aggregation and how many stand by (the election
    ``streams/<name>``: its lowest candidacy leads, the others wait)."""
    prefix = f"riverbed/election/streams/{name}/".encode()
    candidates = sorted(src.control.get_prefix(prefix), key=lambda kv: kv.create_revision)
    if not candidates:
        return {"active": None, "standbys": 0, "since": None}
    try:
        who = json.loads(candidates[0].value)
    except ValueError:
        who = {}
    return {
        "active": who.get("driver", "unknown driver"),
        "since": who.get("since"),
        "standbys": len(candidates) - 1,
    }


def stream(src: Sources, name: str, ledger: int = 0) -> dict[str, Any]:
    """Status of one aggregation; with ``ledger`` its newest batches, newest first."""
    from riverbed.stream.engine import read_record
    from riverbed.stream.fencing import recorded_driver
    from riverbed.stream.job import status_of

    info = _manifest(src, name)
    out: dict[str, Any] = {"name": name, "spec": info.get("spec"), "topic": info.get("topic")}
    if "topic" in info:
        log = src.log if info["log"] == src.config.log_url else None
        try:
            out.update(status_of(info, log))
        except RiverbedError as exc:
            out["error"] = str(exc)
    else:
        out["error"] = "checkpoint written before manifests: run it once with this version"
    out["driver"] = _driver(src, name)
    recorded = recorded_driver(src.checkpoints / name)
    out["term"] = recorded.get("term") if recorded else None
    now_ms = time.time() * 1000
    wm = out.get("watermark_ms") or 0
    out["watermark_gap_s"] = round((now_ms - wm) / 1000, 1) if wm else None
    checkpoint = src.checkpoints / name
    paths = sorted(Checkpoint(checkpoint).batches.glob("*.json"))
    newest = read_record(paths[-1]) if paths else None
    out["last_batch"] = _batch_row(checkpoint, int(paths[-1].stem), newest) if newest else None
    if ledger:
        out["ledger"] = [
            _batch_row(checkpoint, int(p.stem), read_record(p)) for p in reversed(paths[-ledger:])
        ]
    return out


def _batch_row(checkpoint: Path, batch_id: int, record: dict[str, Any]) -> dict[str, Any]:
    """One ledger line: what the batch read (offsets per log partition, from the
    previous batch's ends to its own), the state version it committed, its time."""
    ms = record.get("ms") or {}
    total_ms = sum(ms.values())
    offsets: dict[str, list[int]] | None
    if "slices" in record:  # the plan the batch recorded before it ran
        offsets = {p: [int(s), int(e)] for p, (s, e) in record["slices"].items()}
    else:  # a batch of the Spark-driven loop: Spark's offset log
        from riverbed.stream.direct import spark_ends
        from riverbed.stream.plan import slices_json

        ends = spark_ends(checkpoint, batch_id)
        before = (spark_ends(checkpoint, batch_id - 1) if batch_id > 0 else None) or {}
        offsets = None if ends is None else slices_json({p: before.get(p, 0) for p in ends}, ends)
    return {
        "batch": batch_id,
        "done": bool(record.get("done")),
        "input": record.get("input", 0),
        "late": record.get("late", 0),
        "malformed": record.get("malformed", 0),
        "watermark_ms": record.get("watermark_ms"),
        "offsets": offsets,
        "state_version": batch_id + 1,
        "outputs": record.get("outputs"),
        "term": record.get("term"),
        "ms": ms,
        "duration_s": total_ms / 1000 if total_ms else None,
        "process_rate": round(record.get("input", 0) * 1000 / total_ms) if total_ms else None,
    }


def newest_batch(src: Sources, name: str) -> str | None:
    """The newest batch record's id and modification time (a cheap listing that changes
    when a batch starts or commits)."""
    paths = sorted(Checkpoint(src.checkpoints / name).batches.glob("*.json"))
    if not paths:
        return None
    try:
        return f"{paths[-1].stem}:{paths[-1].stat().st_mtime_ns}"
    except FileNotFoundError:  # pruned while we looked
        return None


def streams(src: Sources) -> list[dict[str, Any]]:
    return [stream(src, name) for name in stream_names(src)]


def live(src: Sources, name: str, batch: int | None = None) -> dict[str, Any]:
    """An aggregation's values per window straight from its state (as of ``batch``,
    default the newest), with the relative error band of approximate metrics."""
    from riverbed.stream.job import load_spec
    from riverbed.stream.metrics import Distinct
    from riverbed.stream.runner import read_live

    info = _manifest(src, name)
    spec = info.get("spec")
    if not spec or not Path(spec).exists():
        raise QueryError(
            f"live results of '{name}' decode state with its spec file, which is not where "
            f"its run recorded it ({spec or 'no spec recorded'}); run it again from its spec"
        )
    aggregation, _ = load_spec(spec)
    from riverbed.state import StateConfig

    state = StateConfig(local_dir=src.config.state_dir, durable=Path(info["state_durable"]))
    bands: dict[str, float] = {}
    for metric_name, metric in aggregation.metrics.items():
        if isinstance(metric, Distinct) and metric.mode != "exact":
            bands[metric_name] = 1.04 / (2 ** (metric.lg_k / 2))  # HLL's standard error
    answer: dict[str, Any] = {
        "name": name,
        "batch": batch,
        "metrics": list(aggregation.metrics),
        "error_bands": bands,
        "rows": [],
    }
    try:
        frame = read_live(aggregation, state, batch)
    except ValueError as exc:  # no batch has committed state yet: nothing to plot, no error
        return {**answer, "note": str(exc)}
    answer["rows"] = [
        {k: _jsonable(v) for k, v in row.items() if k not in ("window_end",)}
        for row in frame.to_dict("records")
    ]
    return answer


# -- state ------------------------------------------------------------------------------


def state(src: Sources) -> list[dict[str, Any]]:
    """Namespaces, their partitions, versions, snapshot and changelog bytes."""
    provider = src.state
    root = state_root(src.checkpoints)
    out = []
    for ns in provider.namespaces():
        parts = []
        for p in provider.partitions(ns):
            index = provider.index(ns, p)
            versions = [v for v in index.versions if v >= index.purged_through]
            base = root / ns / str(p)
            parts.append(
                {
                    "partition": p,
                    "latest": index.latest,
                    "oldest": min(versions, default=0),
                    "versions": len(versions),
                    "snapshots": sorted(index.snapshots),
                    "purged_through": index.purged_through,
                    "changelog_bytes": du(base / "changelog"),
                    "snapshot_bytes": du(base / "snapshot"),
                }
            )
        out.append(
            {
                "namespace": ns,
                "partitions": parts,
                "latest_version": max((p["latest"] for p in parts), default=0),
                "bytes": sum(p["changelog_bytes"] + p["snapshot_bytes"] for p in parts),
            }
        )
    return out


def state_keys(
    src: Sources,
    namespace: str,
    *,
    version: int | None = None,
    partition: int | None = None,
    prefix: str = "",
    limit: int = 100,
) -> dict[str, Any]:
    """Keys of a namespace as of ``version`` (default the newest), read from durable
    storage into a private directory — never the running job's database."""
    from riverbed.state.query import read_state

    provider = src.state
    if namespace not in provider.namespaces():
        known = ", ".join(provider.namespaces()) or "none"
        raise QueryError(f"no state namespace '{namespace}' (namespaces: {known})")
    rows: list[dict[str, Any]] = []
    more = False
    batches: Iterator[Any] = read_state(
        provider,
        namespace,
        version,
        partitions=None if partition is None else [partition],
        prefix=prefix.encode(),
    )
    for batch in batches:
        for row in batch.to_pylist():
            if len(rows) >= limit:
                more = True
                break
            rows.append(
                {
                    "partition": row["partition"],
                    "version": row["version"],
                    "key": _jsonable(row["key"]),
                    "bytes": len(row["value"]),
                    "value": _preview(row["value"]),
                }
            )
        if more:
            break
    return {"namespace": namespace, "version": version, "rows": rows, "more": more}


def _preview(value: bytes) -> str:
    try:
        import msgpack

        decoded = msgpack.unpackb(value, raw=False)
        text = json.dumps(_jsonable(decoded), default=lambda v: f"<{len(v)} bytes>")
    except Exception:
        text = value.decode("utf-8", "backslashreplace")
    return text if len(text) <= 200 else text[:197] + "…"


# -- control ----------------------------------------------------------------------------


def control(src: Sources) -> dict[str, Any]:
    return control_of(src.control, src.config.control_url)


def control_of(cp: Any, url: str) -> dict[str, Any]:
    """Elections (leader, term, candidates), locks (holder, waiting), registries
    (members) and the leases behind them, from the control plane's keys."""
    elections: dict[str, list[Any]] = {}
    locks: dict[str, list[Any]] = {}
    registries: dict[str, list[Any]] = {}
    for kv in cp.get_prefix(b"riverbed/"):
        key = kv.key.decode("utf-8", "backslashreplace")
        kind, _, rest = key.removeprefix("riverbed/").partition("/")
        name, _, _ = rest.rpartition("/")
        target = {"election": elections, "lock": locks, "registry": registries}.get(kind)
        if target is not None and name:
            target.setdefault(name, []).append(kv)
    leases: dict[int, int | None] = {}

    def ttl(lease: int) -> int | None:
        if lease and lease not in leases:
            leases[lease] = cp.time_to_live(lease)
        return leases.get(lease)

    def holder(kv: Any) -> dict[str, Any]:
        return {
            "key": kv.key.decode("utf-8", "backslashreplace"),
            "value": kv.value.decode("utf-8", "backslashreplace")[:200],
            "lease": f"{kv.lease:x}",
            "ttl": ttl(kv.lease),
            "since_revision": kv.create_revision,
        }

    out_elections = []
    for name, kvs in sorted(elections.items()):
        kvs.sort(key=lambda kv: kv.create_revision)
        out_elections.append(
            {
                "name": name,
                "leader": holder(kvs[0]),
                "term": kvs[0].create_revision,
                "candidates": [holder(kv) for kv in kvs[1:]],
            }
        )
    out_locks = []
    for name, kvs in sorted(locks.items()):
        kvs.sort(key=lambda kv: kv.create_revision)
        out_locks.append(
            {"name": name, "holder": holder(kvs[0]), "waiting": [holder(kv) for kv in kvs[1:]]}
        )
    out_registries = [
        {"group": name, "members": [holder(kv) for kv in sorted(kvs, key=lambda k: k.key)]}
        for name, kvs in sorted(registries.items())
    ]
    return {
        "url": url,
        "elections": out_elections,
        "locks": out_locks,
        "registries": out_registries,
        "leases": [{"lease": f"{k:x}", "ttl": v} for k, v in sorted(leases.items())],
    }


# -- jobs -------------------------------------------------------------------------------


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
    from datetime import UTC, datetime

    from cronsim import CronSim

    out = dict(row)
    try:
        sim = CronSim(row["cron"], datetime.fromtimestamp(now, tz=UTC))
        out["next_fire"] = next(sim).timestamp()
    except Exception:
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


# -- the overview -----------------------------------------------------------------------


def disk(src: Sources) -> dict[str, int | None]:
    """Bytes used by the log, state (durable and local) and the jobs' logs."""
    log_path = _local(src.config.log_url)
    return {
        "log": du(log_path) if log_path is not None else None,
        "state_durable": du(state_root(src.checkpoints)),
        "state_local": du(src.config.state_dir),
        "job_logs": du(src.config.home / "jobs" / "logs"),
    }
