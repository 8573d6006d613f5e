"""Stream aggregations: drivers, batches, the ledger, lag, live results from state."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from riverbed.errors import RiverbedError
from riverbed.inspect.sources import QueryError, Sources, jsonable
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.layout import aggregations, joins
from riverbed.stream.versions import version_status

NOTHING_KNOWN: dict[str, Any] = {
    "batches": 0,
    "input_records": 0,
    "late": 0,
    "malformed": 0,
    "watermark": None,
    "watermark_ms": 0,
    "lag": {},
    "last_batch_ms": None,
    "input_rate": None,
    "state_bytes": 0,
}


def stream_names(src: Sources) -> list[str]:
    """Aggregations with a checkpoint (a batch ledger) under the checkpoints root."""
    return aggregations(src.checkpoints)


def _manifest(src: Sources, name: str) -> dict[str, Any]:
    from riverbed.stream.specjob import read_manifest

    checkpoint = src.place(name)
    manifest = read_manifest(checkpoint)
    if name in joins(src.checkpoints):
        raise QueryError(
            f"'{name}' is a stream-stream join, not an aggregation: `riverbed stream status "
            "<its spec file>` shows it (its sides' lag, the events it holds)"
        )
    if manifest is None and not open_batches(checkpoint).ids():
        known = ", ".join(stream_names(src)) or "none"
        raise QueryError(f"no aggregation '{name}' in {src.checkpoints} (aggregations: {known})")
    return manifest or {"name": name, "checkpoint": str(checkpoint)}


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


def active_driver(src: Sources, name: str) -> str | None:
    """The driver running aggregation ``name`` now (host:pid …), or None."""
    active: str | None = _driver(src, name)["active"]
    return active


def stream(src: Sources, name: str, ledger: int = 0) -> dict[str, Any]:
    """Status of one aggregation; with ``ledger`` its newest batches, newest first."""
    from riverbed.stream.fencing import recorded_driver
    from riverbed.stream.specjob import status_of

    info = _manifest(src, name)
    out: dict[str, Any] = {"name": name, "spec": info.get("spec"), "topic": info.get("topic")}
    if "topic" in info:
        log = src.log if info["log"] == src.config.log_url else None
        try:
            out.update(status_of(info, log))
        except RiverbedError as exc:
            out["error"] = str(exc)
    else:  # the same shape as a status, with nothing known
        out.update(NOTHING_KNOWN)
        out["error"] = "checkpoint written before manifests: run it once with this version"
    out["driver"] = _driver(src, name)
    checkpoint = src.place(name)
    out["checkpoint"] = str(checkpoint)  # a directory or an s3:// URL: never a credential
    recorded = recorded_driver(checkpoint)
    out["term"] = recorded.get("term") if recorded else None
    out["state"] = _state_generation(checkpoint)
    out["version"] = version_status(src.checkpoints, name)
    now_ms = time.time() * 1000
    wm = out.get("watermark_ms") or 0
    out["watermark_gap_s"] = round((now_ms - wm) / 1000, 1) if wm else None
    batches = open_batches(checkpoint)
    ids = batches.ids()
    newest = batches.get(ids[-1]) if ids else None
    out["last_batch"] = _batch_row(checkpoint, ids[-1], newest) if newest else None
    if ledger:
        rows = [(b, batches.get(b)) for b in reversed(ids[-ledger:])]
        out["ledger"] = [_batch_row(checkpoint, b, r) for b, r in rows if r is not None]
    return out


def _state_generation(checkpoint: str | Path) -> dict[str, Any] | None:
    """The state's partition count and generation (stream/rescale.py); None before the
    aggregation's first start recorded one."""
    from riverbed.stream.rescale import generations

    gens = generations(checkpoint, 0)
    if gens[-1].partitions == 0:
        return None
    g = gens[-1]
    return {"partitions": g.partitions, "generation": g.number, "from_version": g.from_version}


def _batch_row(checkpoint: str | Path, batch_id: int, record: BatchRecord) -> dict[str, Any]:
    """One ledger line: what the batch read (offsets per log partition, from the
    previous batch's ends to its own), the state version it committed, its time."""
    ms = record.ms
    total_ms = sum(ms.values())
    offsets: dict[str, list[int]] | None
    from riverbed.stream.chain import upstream_range

    read = upstream_range(record)
    if record.slices is not None:  # the plan the batch recorded before it ran
        offsets = {p: [int(s), int(e)] for p, (s, e) in record.slices.items()}
    elif read is not None:  # over a join's or an aggregation's rows: its batches it read
        offsets = {f"{read[0]} batches": [read[1], read[2]]}
    else:  # a batch of the Spark-driven loop: Spark's offset log
        from riverbed.stream.plan import slices_json
        from riverbed.stream.sparklog import spark_ends

        ends = spark_ends(checkpoint, batch_id)
        before = (spark_ends(checkpoint, batch_id - 1) if batch_id > 0 else None) or {}
        offsets = None if ends is None else slices_json({p: before.get(p, 0) for p in ends}, ends)
    return {
        "batch": batch_id,
        "done": record.done,
        "input": record.counted("input"),
        "late": record.counted("late"),
        "malformed": record.counted("malformed"),
        "watermark_ms": record.watermark_ms,
        "offsets": offsets,
        "state_version": batch_id + 1,
        "term": record.term,
        "ms": ms,
        "duration_s": total_ms / 1000 if total_ms else None,
        "process_rate": round(record.counted("input") * 1000 / total_ms) if total_ms else None,
    }


def join_names(src: Sources) -> list[str]:
    """Stream-stream joins with a checkpoint under the checkpoints root."""
    return joins(src.checkpoints)


def join(src: Sources, name: str) -> dict[str, Any]:
    """Status of one stream-stream join, from what its checkpoint recorded (its
    manifest): totals, watermark, and per side its topic, newest event, lag and the
    events its state holds; its driver; its shape."""
    from riverbed.stream.joinquery import manifest_status
    from riverbed.stream.specjob import read_manifest

    checkpoint = src.place(name)
    info = read_manifest(checkpoint)
    if name not in join_names(src) or info is None or info.get("kind") != "join":
        known = ", ".join(join_names(src)) or "none"
        raise QueryError(
            f"no join '{name}' with a manifest in {src.checkpoints} (joins: {known}; a join "
            "records one when it starts with this version of riverbed)"
        )
    out: dict[str, Any] = {"name": name, "kind": "join", "spec": info.get("spec")}
    try:
        out.update(manifest_status(info, checkpoint, Path(src.config.state_dir)))
    except RiverbedError as exc:
        out["error"] = str(exc)
    out["driver"] = _driver(src, name)
    out["checkpoint"] = str(checkpoint)
    # (select: a Select's output columns, {name: Spark SQL}, {} for every field; else None)
    shape = ("how", "window_ms", "bounds_ms", "until", "where", "columns", "state_partitions",
             "select")  # fmt: skip
    for key in (*shape, "output"):
        out[key] = info.get(key)
    return out


def joins_status(src: Sources) -> list[dict[str, Any]]:
    out = []
    for name in join_names(src):
        try:
            out.append(join(src, name))
        except QueryError:
            continue  # started before joins recorded a manifest: `stream status` shows it
    return out


def newest_batch(src: Sources, name: str) -> str | None:
    """The newest batch's id and whether it is done (a cheap listing that changes when
    a batch starts or commits: records are created once, never replaced)."""
    batches = open_batches(src.place(name))
    ids = batches.ids()
    newest = batches.get(ids[-1]) if ids else None
    return f"{ids[-1]}:{newest.done}" if newest is not None else None


def streams(src: Sources) -> list[dict[str, Any]]:
    return [stream(src, name) for name in stream_names(src)]


def live(src: Sources, name: str, batch: int | None = None) -> dict[str, Any]:
    """An aggregation's values per window straight from its state (as of ``batch``,
    default the newest), with the relative error band of approximate metrics."""
    from riverbed.stream.dataframe import read_live
    from riverbed.stream.metrics import Distinct
    from riverbed.stream.specsource import load_spec

    info = _manifest(src, name)
    spec = info.get("spec")
    if not spec or not Path(spec).exists():
        raise QueryError(
            f"live results of '{name}' decode state with its spec file, which is not where "
            f"its run recorded it ({spec or 'no spec recorded'}); run it again from its spec"
        )
    aggregation, _ = load_spec(spec)
    from riverbed.state import StateConfig

    state = StateConfig(local_dir=src.config.state_dir, durable=info["state_durable"])
    bands: dict[str, float] = {}
    for metric_name, metric in aggregation.metrics.items():
        if isinstance(metric, Distinct) and metric.mode != "exact":
            bands[metric_name] = 1.04 / (2 ** (metric.lg_k / 2))  # HLL's standard error
    # the values a chart can plot: each metric's numbers (a Quantile's one per q),
    # not its bounds, nor TopK's pairs (in the rows, not on the chart)
    plotted = [
        metric_name + suffix
        for metric_name, metric in aggregation.metrics.items()
        for suffix, kind in metric.outputs(aggregation.column_types)
        if kind in ("long", "double") and suffix not in ("_error", "_is_exact")
    ]
    answer: dict[str, Any] = {
        "name": name,
        "batch": batch,
        "metrics": plotted,
        "error_bands": bands,
        "rows": [],
    }
    try:
        frame = read_live(aggregation, state, batch, info.get("checkpoint"))
    except ValueError as exc:  # no batch has committed state yet: nothing to plot, no error
        return {**answer, "note": str(exc)}
    answer["rows"] = [
        {k: jsonable(v) for k, v in row.items() if k not in ("window_end",)}
        for row in frame.to_dict("records")
    ]
    return answer
