"""The spec a checkpoint ran with, read and written — the I/O around
:mod:`riverbed.stream.changes`.

Each batch record names the hash of the shape it was planned with (``spec``); the
shape is stored once, create-only, under ``riverbed/specs/<hash>.json``
(:func:`~riverbed.stream.layout.spec_key`). What a new start is compared with is the
newest batch's shape — or, for a checkpoint whose batches an older riverbed planned,
``riverbed/spec.json`` (the partition count and the window layout, written on the first
start and never replaced).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.storage.errors import ObjectNotFoundError
from riverbed.stream.batchlog import open_batches
from riverbed.stream.changes import (
    STATE_LAYOUT,
    Plan,
    legacy_record,
    legacy_shape,
    plan,
    shape,
    shape_hash,
)
from riverbed.stream.errors import StreamValueError
from riverbed.stream.layout import SPEC, checkpoint_store, record_format, spec_key
from riverbed.windows import Hopping, Sliding

if TYPE_CHECKING:
    from riverbed.stream.aggregation import Aggregation
    from riverbed.stream.savepoints import Savepoint

__all__ = ["check", "layout", "plan_start", "recorded", "start"]


def _shape(store: Any, digest: str, where: str | Path) -> dict[str, Any]:
    """The stored shape ``digest`` (refused when a newer riverbed wrote it)."""
    from riverbed.formats import check
    from riverbed.locations import shown

    value: dict[str, Any] = json.loads(store.get(spec_key(digest)))
    check("spec shape", value.get("version"), f"spec {digest} of checkpoint {shown(str(where))}")
    return value


def recorded(
    checkpoint: str | Path, default_partitions: int = 1
) -> tuple[dict[str, Any] | None, int | None]:
    """The shape the checkpoint's newest batch ran with, and that batch (``(None,
    None)``: nothing recorded — a first start) — or the shape the current state
    generation was moved for (:mod:`riverbed.stream.backfill`), when no batch was
    planned after that move."""
    from riverbed.stream import rescale

    store = checkpoint_store(checkpoint)
    batches = open_batches(checkpoint)
    ids = batches.ids()
    moved = rescale.current(checkpoint, default_partitions)
    if moved.spec is not None and (not ids or moved.from_version >= ids[-1]):
        return _shape(store, moved.spec, checkpoint), (ids[-1] if ids else None)
    if ids:
        newest = batches.get(ids[-1])
        if newest is not None and newest.spec:
            try:
                return _shape(store, newest.spec, checkpoint), ids[-1]
            except ObjectNotFoundError:
                pass  # (a shape is written before any batch names it; never absent)
    if store.exists(SPEC):
        return legacy_shape(json.loads(store.get(SPEC))), (ids[-1] if ids else None)
    return None, None


def layout(checkpoint: str | Path, spec: Aggregation) -> Aggregation:
    """``spec`` with the state layout its checkpoint holds (``Aggregation.state_layout``):
    a first start's hopping or sliding window is held as panes; a checkpoint that
    recorded no layout (an older riverbed's) holds windows, and keeps doing so."""
    if not isinstance(spec.window, Hopping | Sliding):
        return spec
    was, newest = recorded(checkpoint, spec.state_partitions)
    # a first start (or the record of one that planned no batch: no state), or a shape
    # that says panes
    first = was is None or (newest is None and "window" not in was)
    panes = first or (was is not None and was.get(STATE_LAYOUT) == "panes")
    return replace(spec, state_layout="panes" if panes else "windows")


NOT_REPLAYED = "riverbed cannot read this source's events again (a DataFrame, a join's rows)"


def plan_start(
    checkpoint: str | Path,
    spec: Aggregation,
    source: Mapping[str, str] | None = None,
    savepoint: Savepoint | None = None,
    estimated: bool = True,
) -> Plan:
    """What starting ``spec`` on ``checkpoint`` does; reads only. ``source``: the
    options of the source's log (a riverbed or Kafka topic, whose retained records a
    backfill reads again; None: a source that cannot be read again). ``savepoint``:
    the savepoint the run starts from (its spec is compared with instead).
    ``estimated``: say what a backfill reads (every retained batch record and the
    topic's offsets are read for it; the run itself reads them once, in the backfill)."""
    from riverbed.stream import backfill, rescale

    if savepoint is not None:
        replayed = None if source else NOT_REPLAYED
        return plan(spec.name, savepoint.shape, shape(spec), savepoint.batch, replayed)
    was, since = recorded(checkpoint, spec.state_partitions)
    if was is not None and "state_partitions" in was:  # the state's count: its generation's
        now = rescale.current(checkpoint, int(was["state_partitions"]))
        was = {**was, "state_partitions": now.partitions}
    decided = plan(spec.name, was, shape(spec), since, None if source else NOT_REPLAYED)
    if estimated and decided.backfilled and source is not None and not decided.refused:
        decided = replace(decided, replay=backfill.estimate(checkpoint, source))
    if estimated and source is not None and not decided.first:
        decided = replace(decided, notes=placement_notes(source, spec.state_partitions))
    return decided


def placement_notes(source: Mapping[str, str], state: int) -> tuple[str, ...]:
    """What a ``topic alter --partitions`` of the source means for a state of ``state``
    partitions (nothing for a topic never altered, or one riverbed cannot open)."""
    from riverbed.spark.source import open_log

    if "topic" not in source:
        return ()
    try:
        topic_log = open_log(dict(source))
        try:
            config = topic_log.topic(source["topic"])
        finally:
            topic_log.close()
    except Exception:  # a note, not the plan: a source unreachable now costs only it
        return ()
    if not config.epochs:
        return ()
    epoch = config.epochs[-1]
    starts = epoch.starts_text()
    if epoch.partitions == state:
        return (
            f"topic '{config.name}' was altered to {epoch.partitions} partitions: batches "
            f"can be co-located from offsets {starts} on (what was placed before goes "
            "through the shuffle)",
        )
    return (
        f"topic '{config.name}' has {config.partitions} partitions, the state {state}: "
        f"batches shuffle partials; with state_partitions={config.partitions} they can "
        f"be co-located again from offsets {starts} on",
    )


def check(
    checkpoint: str | Path,
    spec: Aggregation,
    source: Mapping[str, str] | None = None,
    savepoint: Savepoint | None = None,
    estimated: bool = True,
) -> Plan:
    """The plan of starting ``spec`` (from ``savepoint``, if given), or
    :class:`StreamValueError` with the plan's words when it refuses (nothing is written
    either way)."""
    decided = plan_start(checkpoint, spec, source, savepoint, estimated)
    refusal = decided.refusal()
    if refusal is not None:
        raise StreamValueError(f"{refusal} (`riverbed stream plan SPEC` shows every change)")
    return decided


def start(
    checkpoint: str | Path, spec: Aggregation, source: Mapping[str, str] | None = None
) -> tuple[str, Plan]:
    """Check ``spec`` against the checkpoint (:func:`check`: refused as ``stream plan``
    says), then record its shape; returns the hash new batch records carry, and the
    plan (without the backfill's estimate: the run reads what it said)."""
    decided = check(checkpoint, spec, source, estimated=False)
    record_format(checkpoint)
    now = shape(spec)
    digest = shape_hash(now)
    store = checkpoint_store(checkpoint)
    store.put_if_absent(spec_key(digest), json.dumps(now, indent=1, sort_keys=True).encode())
    # the first start also fixes the partition count and layout older readers check
    store.put_if_absent(SPEC, json.dumps(legacy_spec(spec)).encode())
    return digest, decided


def legacy_spec(spec: Aggregation) -> dict[str, Any]:
    """``riverbed/spec.json``'s object (what riverbed before shapes read)."""
    return legacy_record(spec.name, spec.state_partitions, spec.sessions)
