"""A streaming job from a spec file, with the default locations under RIVERBED_HOME.

A spec file is Python that defines ``aggregation`` (an :class:`Aggregation`) and
``source`` (options of ``format("riverbed")``; ``topic`` at least)::

    from riverbed.stream import Aggregation, Count, Distinct, Tumbling

    source = {"topic": "events", "schema": "user_id long, flag string, ts timestamp"}
    aggregation = Aggregation(
        name="flags_hourly", key="flag", time="ts", window=Tumbling("1h"), watermark="10m",
        metrics={"users": Distinct("user_id"), "events": Count()},
    )

Locations: checkpoint ``<checkpoints>/<name>``, state ``<checkpoints>/state`` (namespace
= the aggregation's name) with local databases in ``RIVERBED_HOME/state``, results in
``RIVERBED_HOME/output/<name>`` — or, when the checkpoints are in a bucket
(``s3://bucket/prefix``), in ``s3://bucket/prefix/output/<name>``: then nothing a
driver needs to resume is on its disk (:func:`results_location`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.config import Config
from riverbed.durations import iso_ms
from riverbed.errors import RiverbedError
from riverbed.locations import OUTPUT, output_in_bucket
from riverbed.state import StateConfig
from riverbed.stream import kafkasource as kafka
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batchlog import BatchRecord, input_rate, open_batches, summed_totals
from riverbed.stream.layout import (
    MANIFEST,
    checkpoint_store,
    checkpoints_location,
    child,
    state_root,
    state_url,
)
from riverbed.stream.leader import DriverLease
from riverbed.stream.specsource import CHAINED_SOURCE, door, is_joined, load_spec

if TYPE_CHECKING:
    from riverbed.stream.savepoints import Savepoint


class StreamFailedError(RiverbedError):
    """The streaming query stopped with an error (its root cause is in the message)."""


_CAUSE = re.compile(r"^\s*((?:[\w]+\.)*\w*(?:Error|Exception|Fault)): (.+)$", re.MULTILINE)


def root_cause(exc: BaseException) -> str:
    """The innermost ``SomeError: message`` line of a Spark failure (whose text nests
    the JVM's and the Python worker's tracebacks), else ``SomeError: <first line>`` of
    the exception itself (a task that ran in the driver raised it directly)."""
    text = str(exc)
    causes = [m for m in _CAUSE.finditer(text) if "py4j" not in m.group(1).lower()]
    if causes:
        name, message = causes[-1].groups()
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclass(frozen=True)
class StreamJob:
    aggregation: Aggregation
    source: dict[str, Any]  # a riverbed topic's options, or {"kafka": {...}}
    checkpoint: str | Path  # a directory, or a bucket's URL
    output: str | Path
    state: StateConfig
    log_url: str
    spec: Path | None = None  # the spec file it came from (the console decodes live state)


def manifest(job: StreamJob) -> dict[str, Any]:
    """What a checkpoint says about its aggregation, so the console and ``status`` can
    read it without the spec file: name, source topic, log, watermark, locations."""
    joined: dict[str, Any] = {}
    if is_joined(job.source):  # the join's checkpoint: its own manifest says the rest
        from riverbed.stream.joinedagg import locations as join_locations

        joined = {"join": join_locations(job.checkpoint, None, None)[0]}
    if CHAINED_SOURCE in job.source:  # the upstream aggregation's checkpoint, likewise
        from riverbed.stream.chained import locations as upstream_locations

        joined = {"upstream": upstream_locations(job.checkpoint, None, None)[0]}
    return {
        "name": job.aggregation.name,
        "spec": str(job.spec) if job.spec else None,
        "topic": (
            kafka.parse(job.source).label
            if kafka.is_kafka(job.source)
            else job.source.get("topic")  # (None: a join's rows, an aggregation's)
        ),
        **joined,
        "log": job.log_url,
        "watermark_ms": job.aggregation.watermark_ms,
        "checkpoint": str(job.checkpoint),
        "output": str(job.output),
        "state_dir": str(job.state.local_dir),
        "state_durable": str(job.state.durable),
    }


def write_manifest(job: StreamJob) -> None:
    """The job's manifest, and each chained upstream's in its own checkpoint."""
    upstream: StreamJob | None = job
    while upstream is not None:
        data = json.dumps(manifest(upstream), indent=1).encode()
        checkpoint_store(upstream.checkpoint).put(MANIFEST, data)
        upstream = upstream_job(upstream)


def upstream_job(job: StreamJob) -> StreamJob | None:
    """The aggregation a job's driver runs before it (``source = {"chained": …}``), as
    a job of its own: its checkpoint, result table and state inside the job's
    (:mod:`riverbed.stream.chained`); None for any other source."""
    if CHAINED_SOURCE not in job.source:
        return None
    from riverbed.stream.chained import locations, state_of

    path = Path(job.source[CHAINED_SOURCE])
    upstream, source = load_spec(path)
    checkpoint, output = locations(job.checkpoint, None, None)
    return StreamJob(
        aggregation=upstream, source=source, checkpoint=checkpoint, output=output,
        state=state_of(job.state, job.aggregation.name),
        log_url=str(source.get("log") or job.log_url), spec=path,
    )  # fmt: skip


def read_manifest(checkpoint: str | Path) -> dict[str, Any] | None:
    """The manifest a run wrote into ``checkpoint`` (None before the first run, for a
    checkpoint written before manifests, or a damaged one: it only describes the run).
    A bucket that cannot be read is an error, not "no manifest"."""
    from riverbed.storage import ObjectNotFoundError

    try:
        data = json.loads(checkpoint_store(checkpoint).get(MANIFEST))
    except (OSError, ValueError, ObjectNotFoundError):
        return None
    return data if isinstance(data, dict) else None


def results_location(config: Config, name: str) -> str | Path:
    """Where an aggregation's result table is: beside its checkpoints in a bucket
    (``<checkpoints>/output/<name>``), else under ``RIVERBED_HOME/output/<name>``."""
    checkpoints = checkpoints_location(config.checkpoints_url)
    bucket = output_in_bucket(checkpoints, name)
    return bucket if bucket is not None else config.home.resolve() / OUTPUT / name


def locations(config: Config, name: str) -> tuple[str | Path, str | Path, StateConfig]:
    """Where the stream ``name`` (an aggregation or a join) keeps its checkpoint, its
    result rows and its state, by the configuration's defaults."""
    checkpoints = checkpoints_location(config.checkpoints_url)
    durable = state_url(checkpoints) if isinstance(checkpoints, str) else state_root(checkpoints)
    state = StateConfig(
        local_dir=config.state_dir.resolve(), durable=durable, memory_mb=config.state_memory_mb
    )
    return child(checkpoints, name), results_location(config, name), state


def job_for(
    config: Config, aggregation: Aggregation, source: dict[str, Any], spec: Path | None = None
) -> StreamJob:
    checkpoint, output, state = locations(config, aggregation.name)
    return StreamJob(
        spec=spec.resolve() if spec else None,
        aggregation=aggregation,
        source=source,
        checkpoint=checkpoint,
        output=output,
        state=state,
        log_url=source.get("log") or config.log_url,
    )


def log_options(job: StreamJob) -> dict[str, str] | None:
    """The options that open the job's source as a log (its retained records can be
    read again: ``stream plan``'s backfill estimate), or None: a Kafka source Spark
    reads (Avro, pinned offsets), a join's rows, or another aggregation's."""
    if is_joined(job.source) or CHAINED_SOURCE in job.source:
        return None
    if kafka.is_kafka(job.source):
        parsed = kafka.parse(job.source)
        return kafka.log_options(parsed) if kafka.log_native(parsed) else None
    return {"log": str(job.log_url), **{str(k): str(v) for k, v in job.source.items()}}


def savepoint_of(config: Config, job: StreamJob, ref: str) -> tuple[str | Path, Savepoint]:
    """``--from-savepoint [AGG:]NAME``: the checkpoint of the aggregation that took it
    (AGG, else the job's own) and the savepoint."""
    from riverbed.stream.savepoints import read

    aggregation, _, name = ref.rpartition(":")
    home = (
        child(checkpoints_location(config.checkpoints_url), aggregation)
        if aggregation
        else job.checkpoint
    )
    return home, read(home, name)


def batch_line(batch_id: int, record: BatchRecord) -> str:
    """How ``stream run`` (and the demo) report a finished batch, from its record."""

    per_second = input_rate(record)
    rate = f", {per_second:,.0f} records/s" if per_second else ""
    filtered = record.counted("filtered")
    kept_out = f", {filtered} filtered" if filtered else ""  # only specs with a where
    # only specs with lookups count events a table had no row for
    missed = f", {record.unmatched} unmatched" if record.unmatched else ""
    if not record.counted("input") and record.watermark_ms > record.previous_watermark_ms:
        # a no-data batch (loop.py): what it is for, instead of a rate of nothing
        rate = f" — the watermark moved to {iso_ms(record.watermark_ms)}: windows before it close"
    return (
        f"batch {batch_id}: {record.counted('input')} records, {record.counted('late')} late, "
        f"{record.counted('malformed')} malformed{kept_out}{missed}{rate}"
    )


def backlog_line(total: int, done: int, elapsed_s: float) -> str:
    """How ``stream run --once`` reports its way through the backlog it started with:
    records done of it, the rate so far, and the time left at that rate."""
    done = max(0, done)
    share = 100.0 if total <= 0 else min(100.0, 100.0 * done / total)
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    left = ""
    if rate > 0 and done < total:
        seconds = (total - done) / rate
        left = (
            f", about {seconds:,.0f} s left"
            if seconds < 120
            else f", about {seconds / 60:,.0f} min left"
        )
    return f"backlog: {done:,} of {total:,} records ({share:.0f} %), {rate:,.0f} records/s{left}"


def resume_line(job: StreamJob) -> str | None:
    """What a (re)started driver resumes from, or None on a fresh checkpoint."""

    batches = open_batches(job.checkpoint)
    ids = batches.ids()
    if not ids:
        return None
    newest = ids[-1]
    record = batches.get(newest)
    if record is not None and record.done:
        return (
            f"resuming from the checkpoint: batches up to {newest} are committed; "
            f"next is {newest + 1}"
        )
    return (
        f"resuming from the checkpoint: batches up to {newest - 1} are committed; batch "
        f"{newest} was planned and not finished, it runs again exactly as planned"
    )


# How often a running driver asks whether it should stop (a newer version current).
STOP_CHECK_S = 2.0


def run(
    spark: Any,
    job: StreamJob,
    *,
    once: bool = False,
    max_records: int | None = None,
    sql: str | None = None,
    topic: str | None = None,
    tables: Sequence[str] = (),
    on_progress: Callable[[int, BatchRecord], None] | None = None,
    lease: DriverLease | None = None,
    from_savepoint: tuple[str | Path, str] | None = None,
    stop_when: Callable[[], str | None] | None = None,
) -> str | None:
    """Run until the backlog is processed (``once``) or forever. ``on_progress`` gets each
    finished batch's id and its record (input, late, malformed, watermark). With an
    acquired ``lease`` every write is fenced by its term and the query stops the moment
    the lease is lost (see :mod:`riverbed.stream.leader`). ``tables``: ``--table``'s
    lakehouse tables (``delta:PATH``). ``stop_when`` is asked every
    :data:`STOP_CHECK_S` whether to stop (a newer version was switched in: its text);
    what it said is returned, or None when the run ended otherwise."""
    from riverbed.stream.dataframe import start
    from riverbed.stream.doors import table_sink
    from riverbed.stream.fencing import DriverFencedError

    write_manifest(job)
    options = door(job.source, job.log_url, max_records)
    trigger = {"availableNow": True} if once else {"processingTime": "1 second"}
    query = start(
        spark,
        job.aggregation,
        options,
        checkpoint=job.checkpoint,
        output=job.output,
        state=job.state,
        log_url=job.log_url,
        sql=sql,
        topic=topic,
        sinks=[table_sink(t) for t in tables],
        trigger=trigger,
        term=lease.term if lease is not None else None,
        from_savepoint=from_savepoint,
    )

    batches = open_batches(job.checkpoint)
    # earlier runs' finished batches; an unfinished newest one is re-run and reported
    reported = set(batches.ids())
    if reported and not _done(batches.get(max(reported))):
        reported.discard(max(reported))

    def report() -> None:
        for batch_id in batches.ids():
            if batch_id in reported or on_progress is None:
                continue  # read only the records not reported yet
            record = batches.get(batch_id)
            if record is not None and record.done:
                reported.add(batch_id)
                on_progress(batch_id, record)

    if lease is not None:  # a stop the moment the lease clock runs out (self-fencing)
        lease.watch(lambda: threading.Thread(target=query.stop, daemon=True).start())
    fenced = DriverFencedError(
        f"this driver lost the lead of '{job.aggregation.name}' (its lease expired: was it "
        "paused or cut off from the control plane?); it stopped, and the active driver "
        "carries on from the checkpoint"
    )
    asked = time.monotonic()
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            if lease is not None and not lease.still_leading():
                query.stop()
                raise fenced
            report()
            if stop_when is not None and time.monotonic() - asked >= STOP_CHECK_S:
                asked = time.monotonic()
                said = stop_when()
                if said is not None:
                    query.stop()
                    report()
                    return said
        if lease is not None and not lease.still_leading():
            raise fenced  # stopped by the lease's watch
        report()
        if query.exception() is not None:
            raise StreamFailedError(
                f"aggregation {job.aggregation.name!r} stopped: {root_cause(query.exception())}"
            )
        return None
    finally:
        if query.isActive:
            query.stop()


def status(job: StreamJob) -> dict[str, Any]:
    """Batches, input, late and malformed counts, watermark, lag per log partition."""
    return status_of(manifest(job))


def join_status(checkpoint: str, state_dir: Path) -> dict[str, Any]:
    """The status of the join an aggregation runs (its checkpoint: ``checkpoint``), from
    its manifest: totals, watermark, and per side its topic, newest event, lag and the
    events its state holds."""
    from riverbed.stream.joinquery import manifest_status

    info = read_manifest(checkpoint)
    if info is None or info.get("kind") != "join":
        return {"sides": {}, "error": f"no join manifest in {checkpoint} yet"}
    return manifest_status(info, checkpoint, state_dir)


def _done(record: BatchRecord | None) -> bool:
    return record is not None and record.done


def status_of(info: dict[str, Any], log: Any = None) -> dict[str, Any]:
    """:func:`status` from a checkpoint's :func:`manifest` (what the console reads);
    ``log`` is an open log of ``info["log"]`` to reuse."""
    import riverbed.log
    from riverbed.stream.sparklog import committed_ends

    checkpoint = info["checkpoint"]
    batches = open_batches(checkpoint)
    ids = batches.ids()
    # newest first, and only as far back as needed: the newest record (watermark), the
    # newest with timings, the newest that read input (the rate) and the newest finished
    # one (its running totals) — a no-data batch is at most one back (loop.py)
    newest_first: list[BatchRecord] = []
    for batch_id in reversed(ids):
        if (record := batches.get(batch_id)) is not None:
            newest_first.append(record)
        if (
            any(d.ms for d in newest_first)
            and any(d.done for d in newest_first)
            and (any(d.counted("input") for d in newest_first) or len(newest_first) > 2)
        ):
            break
    committed = committed_ends(checkpoint, newest_first)
    joined: dict[str, Any] = {}
    if info.get("join"):  # a join's rows: its sides' lag, what its state holds
        joined["join"] = join_status(str(info["join"]), Path(info["state_dir"]))
        lag = {
            side["topic"]: side["lag"]
            for side in joined["join"]["sides"].values()
            if side.get("lag") is not None
        }
    elif info.get("upstream"):  # another aggregation's rows: its status, its lag
        upstream = read_manifest(str(info["upstream"]))
        joined["upstream"] = (
            status_of(upstream, log)
            if upstream is not None
            else {"error": f"no manifest in {info['upstream']} yet", "lag": {}}
        )
        lag = dict(joined["upstream"].get("lag") or {})
    elif kafka.is_label(info["topic"]):  # a Kafka source: the brokers know the ends
        lag = kafka.lag(info["topic"], committed)
    else:
        lag = {}
        own = log is None
        log = riverbed.log.open(info["log"]) if own else log
        try:
            for part in log.offsets(info["topic"]):
                lag[str(part.partition)] = part.end - committed.get(part.partition, part.start)
        finally:
            if own:
                log.close()
    # the watermark the next batch will use: from everything seen so far
    head = newest_first[0] if newest_first else None
    watermark = max(head.watermark_ms, head.max_event_ms - int(info["watermark_ms"])) if head else 0
    if joined and head is not None:  # (held back by what its upstream may still emit)
        watermark = head.watermark_ms
    last = next((d for d in newest_first if d.ms), None)
    # the rate of the newest batch that read input (a no-data batch's would be 0)
    busy = next((d for d in newest_first if d.ms and d.counted("input")), last)
    rate = input_rate(busy) if busy else None
    # running totals of the newest finished batch: older records may have been pruned
    # (a checkpoint from before totals still has every record: sum them)
    newest = next((d for d in newest_first if d.done), None)
    totals = (
        newest.totals
        if newest is not None and newest.totals is not None
        else summed_totals(r for b in ids if (r := batches.get(b)) is not None)
    )
    local = Path(info["state_dir"]) / info["name"]
    return {
        "aggregation": info["name"],
        "batches": totals["batches"],
        "input_records": totals["input"],
        "late": totals["late"],
        "malformed": totals["malformed"],
        "filtered": int(totals.get("filtered", 0)),  # events the spec's where dropped
        # with lookups: events a table had no row for, and the versions the newest
        # batch joined with (content hash, when the table was read)
        **(
            {"unmatched": int(totals.get("unmatched", 0)), "lookups": head.lookups}
            if head is not None and head.lookups is not None
            else {}
        ),
        "watermark": iso_ms(watermark),
        "lag": lag,
        **joined,
        # where the newest batch's time went (log-native path): offsets, state_job, outputs
        "last_batch_ms": last.ms if last else None,
        "input_rate": None if rate is None else round(rate),  # records/s, newest with input
        "watermark_ms": watermark,
        "state_bytes": sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        if local.exists()
        else 0,
    }
