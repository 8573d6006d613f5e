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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.storage.errors import ObjectNotFoundError
from riverbed.stream.batchlog import open_batches
from riverbed.stream.changes import Plan, legacy_shape, plan, shape, shape_hash
from riverbed.stream.errors import StreamValueError
from riverbed.stream.layout import SPEC, checkpoint_store, spec_key

if TYPE_CHECKING:
    from riverbed.stream.aggregation import Aggregation

__all__ = ["check", "plan_start", "recorded", "start"]


def recorded(checkpoint: str | Path) -> tuple[dict[str, Any] | None, int | None]:
    """The shape the checkpoint's newest batch ran with, and that batch (``(None,
    None)``: nothing recorded — a first start)."""
    store = checkpoint_store(checkpoint)
    batches = open_batches(checkpoint)
    ids = batches.ids()
    if ids:
        newest = batches.get(ids[-1])
        if newest is not None and newest.spec:
            try:
                return json.loads(store.get(spec_key(newest.spec))), ids[-1]
            except ObjectNotFoundError:
                pass  # (a shape is written before any batch names it; never absent)
    if store.exists(SPEC):
        return legacy_shape(json.loads(store.get(SPEC))), (ids[-1] if ids else None)
    return None, None


def plan_start(checkpoint: str | Path, spec: Aggregation) -> Plan:
    """What starting ``spec`` on ``checkpoint`` does; reads only."""
    from riverbed.stream import rescale

    was, since = recorded(checkpoint)
    if was is not None and "state_partitions" in was:  # the state's count: its generation's
        now = rescale.current(checkpoint, int(was["state_partitions"]))
        was = {**was, "state_partitions": now.partitions}
    return plan(spec.name, was, shape(spec), since)


def check(checkpoint: str | Path, spec: Aggregation) -> Plan:
    """The plan of starting ``spec``, or :class:`StreamValueError` with the plan's words
    when it refuses (nothing is written either way)."""
    decided = plan_start(checkpoint, spec)
    refusal = decided.refusal()
    if refusal is not None:
        raise StreamValueError(f"{refusal} (`riverbed stream plan SPEC` shows every change)")
    return decided


def start(checkpoint: str | Path, spec: Aggregation) -> str:
    """Check ``spec`` against the checkpoint (:func:`check`: refused as ``stream plan``
    says), then record its shape and return the hash new batch records carry."""
    check(checkpoint, spec)
    now = shape(spec)
    digest = shape_hash(now)
    store = checkpoint_store(checkpoint)
    store.put_if_absent(spec_key(digest), json.dumps(now, indent=1, sort_keys=True).encode())
    # the first start also fixes the partition count and layout older readers check
    store.put_if_absent(SPEC, json.dumps(legacy_spec(spec)).encode())
    return digest


def legacy_spec(spec: Aggregation) -> dict[str, Any]:
    """``riverbed/spec.json``'s object (what riverbed before shapes read)."""
    return {
        "name": spec.name,
        "state_partitions": spec.state_partitions,
        "windows": "sessions" if spec.sessions else "fixed",
    }
