"""A stream-stream join's trigger loop and entry points: :class:`JoinQuery` plans each
batch over both topics and runs it (:mod:`riverbed.stream.streamjoin`), as riverbed's
loop does for a log-native aggregation (:mod:`riverbed.stream.loop`); :func:`start_join`
checks a :class:`~riverbed.stream.joins.Join` against its topics and its checkpoint and
starts it; :func:`read_joined` reads the joined rows back."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from riverbed.locations import location
from riverbed.spark.offsets import batch_ends, begin_offsets, capped
from riverbed.spark.source import open_log
from riverbed.state import StateConfig, StateProvider
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.errors import StreamValueError
from riverbed.stream.fencing import check_term
from riverbed.stream.joins import DATAFRAME, Join
from riverbed.stream.joinsides import prepare
from riverbed.stream.layout import JOIN, MANIFEST, checkpoint_store, default_state
from riverbed.stream.pairing import Rule, buffered_count
from riverbed.stream.plan import Trigger, ends_of, has_input, parse_trigger, slices_json
from riverbed.stream.results import read_table
from riverbed.stream.selects import Select
from riverbed.stream.streamjoin import SIDES, JoinConfig, run_planned, watermark_of
from riverbed.stream.threadquery import ThreadQuery

log = logging.getLogger(__name__)


class JoinQuery(ThreadQuery):
    """A stream-stream join running on a driver thread; constructing it starts the loop
    and returns at once (the ``StreamingQuery`` part: :class:`~riverbed.stream.
    threadquery.ThreadQuery`)."""

    kind = "join"

    def __init__(
        self, spark: Any, cfg: JoinConfig, trigger: Trigger, name: str | None = None
    ) -> None:
        """``name``: the query's, when not the join's (the last aggregation over its rows)."""
        group = f"riverbed-join-{cfg.join.name}" if name is None else f"riverbed-{name}"
        super().__init__(spark, name or cfg.join.name, group, trigger)
        self.cfg = cfg
        self.kind = cfg.join.noun  # how errors name it
        self.streams = SIDES[: len(cfg.join.sides)]  # a lookup join's: the left one only
        self.batches = open_batches(cfg.checkpoint, cfg.fence)
        self._start()

    def _body(self) -> None:
        logs: dict[str, Any] = {}
        try:
            for which, side in zip(self.streams, self.cfg.sides, strict=False):
                logs[which] = open_log(side.options)
            self._loop(logs)
        finally:
            for opened in logs.values():
                with contextlib.suppress(Exception):
                    opened.close()

    def _retained(self, logs: dict[str, Any], which: str) -> dict[int, tuple[int, int]]:
        topic = self.cfg.sides[SIDES.index(which)].options["topic"]
        return {o.partition: (o.start, o.end) for o in logs[which].offsets(topic)}

    def _target(self, logs: dict[str, Any]) -> dict[str, dict[int, int]] | None:
        """With ``availableNow``: each side's ends now (what the topics hold now, and no
        more); else None."""
        if not self.trigger.available_now:
            return None
        return {w: {p: e for p, (_, e) in self._retained(logs, w).items()} for w in self.streams}

    def _loop(self, logs: dict[str, Any]) -> None:
        target = self._target(logs)

        def run(batch_id: int, record: BatchRecord, began: float) -> None:
            tasks_of = self._tasks_of(batch_id, record)
            done = run_planned(self.spark, self.cfg, self.batches, batch_id, record, tasks_of)
            self._add_progress(
                {
                    "name": self.name,
                    "batchId": batch_id,
                    "numInputRows": done.counted("input"),
                    "joined": int(done.joined or 0),
                    "watermarkMs": done.watermark_ms,
                    "durationMs": {"triggerExecution": round((time.perf_counter() - began) * 1000)},
                }
            )

        self._triggered(lambda: self._next(logs, target), run)

    def _tasks_of(self, batch_id: int, record: BatchRecord) -> Any:
        """What runs a batch's tasks: a lookup join's or a Select's (None: the stream
        join's)."""
        if not self.cfg.join.stateless:
            return None
        from riverbed.stream import lookupjoin

        def tasks_of() -> Any:
            return lookupjoin.run_batch(self.spark, self.cfg, batch_id, record)

        return tasks_of

    def _next(
        self, logs: dict[str, Any], target: dict[str, dict[int, int]] | None
    ) -> tuple[int, BatchRecord] | None:
        """The batch to run: the newest again if it did not finish, else a new plan
        recorded durably; None when there is nothing to do."""
        ids = self.batches.ids()
        newest = self.batches.get(ids[-1]) if ids else None
        if newest is not None and not newest.done:
            return ids[-1], newest  # re-run exactly what was planned
        batch_id = ids[-1] + 1 if ids else 0
        now = int(time.time() * 1000)
        sources: dict[str, dict[str, list[int]]] = {}
        moved: dict[str, int] = {}
        for which in self.streams:
            retained = self._retained(logs, which)
            before = None
            if newest is not None and newest.sources is not None:
                before = ends_of(newest.sources.get(which, {}))
            begin = begin_offsets(retained, before, "earliest")
            ends = batch_ends(
                begin,
                capped(retained, None if target is None else target[which]),
                self.cfg.max_records,
            )
            sources[which] = slices_json(begin, ends)
            was = (newest.source_moved_ms or {}).get(which) if newest is not None else None
            moved[which] = now if has_input(sources[which]) or was is None else int(was)
        stateless = self.cfg.join.stateless  # no state, nothing late: no watermark
        watermark = 0 if stateless else watermark_of(self.cfg.join, newest, moved, now)
        previous = newest.watermark_ms if newest is not None else 0
        if not any(has_input(s) for s in sources.values()) and watermark <= previous:
            return None
        record = BatchRecord(
            watermark_ms=watermark,
            previous_watermark_ms=previous,
            max_event_ms=newest.max_event_ms if newest is not None else 0,
            sources=sources,
            source_max_ms=dict(newest.source_max_ms or {}) if newest is not None else {},
            source_moved_ms=moved,
        )
        if self.cfg.join.lookup is not None:  # and the table's version it joins with
            from riverbed.stream import lookupjoin

            record.lookups = lookupjoin.plan(self.cfg, newest)
        self.batches.put(batch_id, record)  # durable: the plan comes before any write
        return batch_id, record


# -- the entry points ----------------------------------------------------------------------


def _shape(join: Join) -> dict[str, Any]:
    """What a join's state depends on: fixed at its first start (a lookup join has no
    state; its topic's rows are placed by the partition count)."""
    if join.select is not None:  # (its topic's rows are placed by the partition count)
        return {"kind": "select", "state_partitions": join.state_partitions}
    if join.lookup is not None:
        return {"kind": "lookup", "state_partitions": join.state_partitions}
    shape = {
        "state_partitions": join.state_partitions,
        "on": list(join.keys),
        "window_ms": join.window_ms,
        "bounds_ms": list(join.bounds_ms),
        "how": join.how,
    }
    if join.until is not None:  # (absent for a join without: older checkpoints match)
        shape["until"] = join.until
    return shape


def output_columns(schema: pa.Schema) -> list[list[str]]:
    """A join's (or Select's) output columns as its checkpoint records them: each name
    and Arrow type (its result table's files must agree, as must its topic's rows)."""
    return [[f.name, str(f.type)] for f in schema]


def _check_shape(checkpoint: str, join: Join, columns: list[list[str]] | None = None) -> None:
    """Record the join's shape, its output ``columns`` (:func:`output_columns`) and its
    state's format at the first start; refuse a changed shape or changed columns, or
    state a newer riverbed wrote. State of an older format is read (each partition
    rewritten by its next batch), so the record is raised to this one; a record without
    columns (an older riverbed's) takes them."""
    from riverbed.formats import CURRENT, check

    store = checkpoint_store(checkpoint)
    current = CURRENT["join state"]
    shape = {**_shape(join), "format": current}
    if columns is not None:
        shape["columns"] = columns
    if store.put_if_absent(JOIN, json.dumps(shape, sort_keys=True).encode()):
        return
    recorded = json.loads(store.get(JOIN))
    check("join state", recorded.get("format"), f"join {join.name} ({checkpoint})")
    now = _shape(join)
    if {k: v for k, v in recorded.items() if k not in ("format", "columns")} != now:
        changed = [
            k
            for k in sorted({*now, *recorded} - {"format", "columns"})
            if recorded.get(k) != now.get(k)
        ]
        raise StreamValueError(
            f"{join.noun} {join.name}: its checkpoint {checkpoint} ran with "
            + ", ".join(f"{k}={recorded.get(k)!r}" for k in changed)
            + f", not {', '.join(f'{k}={now.get(k)!r}' for k in changed)}: the buffered "
            "events were placed and kept by those; start on a new checkpoint (and output) "
            "to run the changed join"
        )
    was = recorded.get("columns")
    if columns is not None and was is not None and was != columns:
        raise StreamValueError(
            f"{join.noun} {join.name}: its checkpoint {checkpoint} wrote rows of "
            f"{_columns_text(was, columns)}, now {_columns_text(columns, was)}: its output's "
            "files (and its topic's rows) keep one set of columns; start on a new "
            "checkpoint and output (a new name) to run the changed columns, or put the "
            "columns back"
        )
    if recorded.get("format") != current or (columns is not None and was is None):
        store.put(JOIN, json.dumps(shape, sort_keys=True).encode())


def _columns_text(these: list[list[str]], others: list[list[str]]) -> str:
    """The columns of ``these`` that differ from ``others`` (name and type), as text."""
    differ = [f"{name} {kind}" for name, kind in these if [name, kind] not in others]
    order = [n for n, _ in these] != [n for n, _ in others] and not differ
    shown = ", ".join(differ) if differ else ", ".join(n for n, _ in these)
    return f"columns {shown}" + (" (in this order)" if order else "")


def start_join(
    spark: Any,
    join: Join,
    *,
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig | None = None,
    log_url: str | None = None,
    trigger: dict[str, Any] | None = None,
    term: int | None = None,
    max_records: int | None = None,
    spec: str | Path | None = None,
) -> Any:
    """Start a stream-stream join; returns its query (see the module doc: a
    :class:`JoinQuery` over topics; a Spark ``StreamingQuery`` when both sides are
    ``Frame(df)``, :mod:`riverbed.stream.joinframes`). ``log_url``:
    the log of sides given by name (default: the configured one), where ``<name>.dlq``
    / ``.late`` and the join's ``topic`` go. Spark's ``trigger`` keywords
    (``availableNow=True``, ``processingTime="2 seconds"``); ``max_records``: each
    side's records per batch at most (else its ``maxRecordsPerBatch`` option).
    ``spec``: the spec file it came from (the console names it)."""
    if isinstance(join, Select):
        join = join.join  # (run as a one-sided join)
    if not isinstance(join, Join):
        raise StreamValueError(f"start_join takes a Join or a Select, not {type(join).__name__}")
    parsed = parse_trigger(trigger)
    if join.frames and max_records is not None:
        raise StreamValueError(
            f"{join.noun} {join.name}: max_records limits a topic side's batches; a DataFrame's "
            "source has its own limit (Kafka's maxOffsetsPerTrigger, a riverbed topic's "
            "maxRecordsPerBatch, files' maxFilesPerTrigger)"
        )
    cfg = open_join(
        join, checkpoint=checkpoint, output=output, state=state, log_url=log_url, term=term,
        spec=spec,
    )  # fmt: skip
    if join.frames:  # one Spark streaming query over both (stream/joinframes.py)
        from riverbed.stream import joinframes

        return joinframes.start(cfg, trigger)
    if max_records is not None:
        cfg = replace(cfg, max_records=max_records)
    return JoinQuery(spark, cfg, parsed)


def open_join(
    join: Join,
    *,
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig | None = None,
    log_url: str | None = None,
    term: int | None = None,
    spec: str | Path | None = None,
    state_name: str | None = None,
    fenced_by: str | None = None,
) -> JoinConfig:
    """A join checked against its sides and its checkpoint (its shape and manifest
    recorded there), ready to run: what :func:`start_join` starts, and what an
    aggregation over a join's rows runs in its own driver (:mod:`riverbed.stream.
    joinedagg`; ``state_name``: its state's name, when not the join's; ``fenced_by``:
    the checkpoint whose driver record fences its writes, when not its own)."""
    from riverbed.config import load_config
    from riverbed.stream.layout import record_format

    checkpoint, output = location(checkpoint), location(output)
    if state is None:
        state = default_state(checkpoint)
    if log_url is None and any(side_log is None for _, side_log, _ in join.sides):
        log_url = load_config().log_url
    check_term(fenced_by or str(checkpoint), term, join.name)
    cfg = prepare(  # both sides checked before the checkpoint records anything
        join,
        checkpoint=str(checkpoint),
        output=str(output),
        state=state,
        log_url=log_url,
        term=term,
    )
    record_format(checkpoint)
    _check_shape(str(checkpoint), join, output_columns(cfg.output_schema))
    store = checkpoint_store(checkpoint)
    described = manifest(join, checkpoint, output, state, log_url, spec)
    if state_name is not None:
        described["state_name"] = state_name
    cfg = replace(cfg, state_name=state_name, fenced_by=fenced_by)
    store.put(MANIFEST, json.dumps(described, indent=1).encode())
    return cfg


def batch_line(batch_id: int, record: BatchRecord, select: bool = False) -> str:
    """How ``stream run`` reports a join's finished batch (``select``: a Select's)."""
    alone = f", {record.unmatched} unmatched" if record.unmatched else ""
    kept_out = f", {record.filtered} filtered" if record.filtered else ""  # (a side's where)
    if select:  # nothing is late: it has no watermark
        return (
            f"batch {batch_id}: {record.counted('input')} records, {record.joined or 0} rows, "
            f"{record.counted('malformed')} malformed{kept_out}"
        )
    return (
        f"batch {batch_id}: {record.counted('input')} records, {record.joined or 0} joined"
        f"{alone}, {record.counted('late')} late, {record.counted('malformed')} malformed"
        f"{kept_out}"
    )


def read_joined(output: str | Path) -> pd.DataFrame:
    """Every joined row written so far (each once: a re-run batch replaced its file);
    integers stay integers where a row has none (a left join's, a NULL key)."""
    table = read_table(location(output))
    return pd.DataFrame() if table is None else table.to_pandas(types_mapper=_NULLABLE.get)


_NULLABLE = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}


def manifest(
    join: Join,
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig,
    log_url: str | None,
    spec: str | Path | None = None,
) -> dict[str, Any]:
    """What a join's checkpoint says about it (``riverbed/job.json``), so the console
    can show it without the spec file: its sides' topics and logs (not their reader
    options, which may hold a Kafka client's secrets), its shape and locations (a
    lookup join's right side: its table, as errors name it — never a password)."""
    sides: dict[str, dict[str, Any]] = {
        which: {"topic": topic, "log": None if topic == DATAFRAME else side_log or log_url}
        for which, (topic, side_log, _) in zip(SIDES, join.sides, strict=False)
    }
    if join.lookup is not None:
        sides["right"] = {"table": join.lookup.label, "refresh": join.lookup.refresh}
    derived = dict(join.derived[0])
    return {
        "kind": "join",
        "name": join.name,
        # a Select's output columns, {name: Spark SQL} ({}: every field); None: a join
        "select": None if join.select is None else {n: derived[c] for n, c in join.select},
        "spec": str(spec) if spec else None,
        "sides": sides,
        "how": join.how,
        "window_ms": join.window_ms,
        "bounds_ms": list(join.bounds_ms),
        "until": join.until,
        "where": dict(join.where or ()),
        "columns": {
            side: dict(pairs) for side, pairs in zip(SIDES, join.derived, strict=True) if pairs
        },
        "state_partitions": join.state_partitions,
        "checkpoint": str(checkpoint),
        "output": str(output),
        "state_dir": str(state.local_dir),
        "state_durable": str(state.durable),
    }


def status(
    join: Join, checkpoint: str | Path, state: StateConfig, log_url: str | None
) -> dict[str, Any]:
    """What ``riverbed stream status`` shows of a join: its totals and watermark, and
    for each side its topic, the newest event time it has shown, the records not read
    yet (lag) and the events its state holds."""
    sides = {
        which: (topic, None if topic == DATAFRAME else side_log or log_url, reader)
        for which, (topic, side_log, reader) in zip(SIDES, join.sides, strict=False)
    }
    table = None if join.lookup is None else join.lookup.label
    return status_of(
        join.name, sides, join.state_partitions, checkpoint, state, Rule.of(join), table,
        stateless=join.stateless,
    )  # fmt: skip


def status_of(
    name: str,
    sides: dict[str, tuple[str, str | None, dict[str, str]]],
    partitions: int,
    checkpoint: str | Path,
    state: StateConfig,
    rule: Rule,
    table: str | None = None,
    namespace: str | None = None,
    stateless: bool = False,
) -> dict[str, Any]:
    """:func:`status` from what it needs: each side's (topic, log, reader options), the
    state's partition count, its pairing rule; a lookup join's ``table`` (its label),
    shown as its right side with the version the newest batch joined with; its state's
    name when not ``name``; ``stateless``: a lookup join or a Select (no state, no
    watermark). A side whose log cannot be read now has no lag (``None``) and says why
    (``lag_error``)."""
    from riverbed.durations import iso_ms
    from riverbed.errors import RiverbedError

    batches = open_batches(checkpoint)
    ids = batches.ids()
    done = next((r for b in reversed(ids) if (r := batches.get(b)) is not None and r.done), None)
    totals = dict(done.totals or {}) if done is not None else {}
    stateless = stateless or table is not None
    info: dict[str, Any] = {
        "join": name,
        "batches": totals.get("batches", 0),
        "input_records": totals.get("input", 0),
        "joined": totals.get("joined", 0),
        "unmatched": totals.get("unmatched", 0),
        "late": totals.get("late", 0),
        "malformed": totals.get("malformed", 0),
        "filtered": totals.get("filtered", 0),
        # (a lookup join and a Select have none: nothing of them waits for time)
        "watermark": iso_ms(done.watermark_ms) if done is not None and not stateless else None,
        "sides": {},
    }
    holding = _held(namespace or name, 0 if stateless else partitions, state, rule)
    for which, (topic, url, reader) in sides.items():
        read = ends_of((done.sources or {}).get(which, {})) if done is not None else {}
        lag, why = None, None
        if url is not None:
            try:
                opened = open_log({**reader, "topic": topic, "log": url})
                try:
                    ends = {o.partition: o.end for o in opened.offsets(topic)}
                    lag = sum(max(0, end - read.get(p, 0)) for p, end in ends.items())
                finally:
                    opened.close()
            except (RiverbedError, OSError) as exc:
                why = str(exc)
        newest = (done.source_max_ms or {}).get(which) if done is not None else None
        info["sides"][which] = {
            "topic": topic,
            "newest_event": iso_ms(newest) if newest is not None else None,
            "lag": lag,
            "held": holding[which],
        }
        if why is not None:
            info["sides"][which]["lag_error"] = why
    if table is not None:
        snapshots = (done.lookups or []) if done is not None else []
        info["sides"]["right"] = {
            "table": table,
            "read_at": iso_ms(int(snapshots[0]["at_ms"])) if snapshots else None,
            "newest_event": None,
            "lag": None,
            "held": 0,
        }
    return info


def manifest_status(
    info: dict[str, Any], checkpoint: str | Path, local_dir: Path
) -> dict[str, Any]:
    """:func:`status_of` from a join's manifest (:func:`manifest`, in its checkpoint) —
    what the console and the status of an aggregation over a join's rows read; the
    state's local copies under ``local_dir``."""
    sides: dict[str, tuple[str, str | None, dict[str, str]]] = {
        w: (s["topic"], s.get("log"), {}) for w, s in dict(info["sides"]).items() if "topic" in s
    }
    table = dict(info["sides"]).get("right", {}).get("table")  # a lookup join's
    lower, upper = info["bounds_ms"]
    rule = Rule(window_ms=info["window_ms"], lower_ms=int(lower), upper_ms=int(upper))
    state = StateConfig(local_dir=local_dir, durable=info["state_durable"])
    return status_of(
        str(info["name"]), sides, int(info["state_partitions"]), checkpoint, state, rule, table,
        info.get("state_name"), stateless=info.get("select") is not None,
    )  # fmt: skip


def _held(name: str, partitions: int, state: StateConfig, rule: Rule) -> dict[str, int]:
    """How many events each side holds in the state (its newest version) that a partner
    can still reach."""
    out = {"left": 0, "right": 0}
    provider = StateProvider(state)
    for partition in range(partitions):
        store = provider.load(name, partition)
        try:
            for which, n in buffered_count(store, rule).items():
                out[which] += n
        finally:
            store.abort()
    return out


__all__ = [
    "JoinQuery",
    "batch_line",
    "manifest",
    "read_joined",
    "start_join",
    "status",
    "status_of",
    "watermark_of",
]
