"""Savepoints: a named, consistent cut of an aggregation that retention never deletes,
and starting an aggregation from one — a fork for a what-if, or a rollback.

**Taking one** (:func:`take`, ``riverbed stream savepoint SPEC NAME``) needs no driver
and stops none: the cut is the newest committed batch *b*. Its state version (*b* + 1)
is copied, partition by partition, to a namespace of the savepoint's own
(:func:`namespace`), which maintenance never purges; the result table's rows as of *b*
are stored beside the record; then one create-only record,
``riverbed/savepoints/<NAME>.json`` (:func:`~riverbed.stream.layout.savepoint_key`),
makes the savepoint exist: the cut's source offsets and watermark, the spec's shape,
the state's partition count and place, the running totals and riverbed's version. A
kill before the record leaves no savepoint (taking it again finishes the copy).

**Starting from one** (:func:`restore`, ``stream run SPEC --from-savepoint [AGG:]NAME``)
on the aggregation's own checkpoint (a rollback) or a new one (a fork, under another
name) is one *restore batch*, *r* = the next batch id, run before any other:

1. its plan is recorded first (``restore``: which savepoint; its slices end where the
   savepoint's cut ended, reading nothing; its watermark the cut's);
2. the savepoint's state is copied into a new state generation as version *r* + 1 and
   made current (:func:`riverbed.stream.rescale.switch`);
3. the batch is committed with the savepoint's totals; the savepoint's result rows,
   stored with the new generation before its switch, are written by the next batch
   with its own (:func:`riverbed.stream.backfill.pending`: as a backfill's rows), so
   every sink gets them exactly once (that batch runs even with nothing new to read).

The next batch then reads the source from the cut, with the watermark the cut had, on
the savepoint's state: what ran after the cut is computed again. A kill at any step
re-runs the restore batch (each step is idempotent). The spec is then compared with the
savepoint's shape as with any checkpoint's (``stream plan``'s rules: a change is
applied, backfilled or refused).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from riverbed import __version__
from riverbed.formats import CURRENT, check
from riverbed.state import StateConfig, StateProvider
from riverbed.storage.errors import ObjectNotFoundError
from riverbed.stream import rescale
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.changes import legacy_record
from riverbed.stream.errors import StreamValueError
from riverbed.stream.layout import (
    SAVEPOINTS,
    SPEC,
    checkpoint_store,
    restored_key,
    savepoint_key,
    savepoint_rows_key,
    spec_key,
)

log = logging.getLogger(__name__)

__all__ = [
    "Savepoint",
    "delete",
    "listed",
    "namespace",
    "read",
    "restore",
    "started_from",
    "take",
]

FORMAT = CURRENT["savepoint"]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def namespace(aggregation: str, savepoint: str) -> str:
    """The state namespace a savepoint's copy of the state lives in."""
    return f"{aggregation}.sp.{savepoint}"


@dataclass(frozen=True)
class Savepoint:
    """A savepoint's record (``riverbed/savepoints/<name>.json``)."""

    name: str
    aggregation: str
    batch: int  # the newest committed batch at the cut
    state_version: int
    state_partitions: int
    durable: str  # the durable state root its namespace is under
    spec: str  # the shape's hash; the shape itself is in ``shape``
    shape: dict[str, Any]
    ends: dict[str, int]  # where the cut is in every source partition
    watermark_ms: int
    previous_watermark_ms: int
    max_event_ms: int
    totals: dict[str, int]
    riverbed: str
    created: str
    rows: bool  # whether result rows are stored beside the record
    # per backfilled metric, the newest event time retention may have deleted before it
    # was counted (riverbed.stream.backfill.since): a fork's `<metric>_since` keeps it
    since: dict[str, int] = field(default_factory=dict)
    format: int = FORMAT

    @property
    def namespace(self) -> str:
        return namespace(self.aggregation, self.name)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Savepoint:
        check("savepoint", data.get("format"), f"savepoint {data.get('name')!r}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def line(self) -> str:
        return (
            f"{self.name}: {self.aggregation} at batch {self.batch} (state version "
            f"{self.state_version}, {self.state_partitions} partitions), "
            f"{self.totals.get('input', 0):,} records counted, taken {self.created} "
            f"by riverbed {self.riverbed}"
        )


def _checked_name(name: str) -> str:
    if not _NAME.match(name):
        raise StreamValueError(f"savepoint name {name!r}: letters, digits, '_' and '-' (max 64)")
    return name


def read(checkpoint: str | Path, name: str) -> Savepoint:
    """Savepoint ``name`` of the aggregation whose checkpoint this is."""
    store = checkpoint_store(checkpoint)
    try:
        data = json.loads(store.get(savepoint_key(_checked_name(name))))
    except ObjectNotFoundError:
        have = ", ".join(s.name for s in listed(checkpoint)) or "none"
        raise StreamValueError(
            f"no savepoint {name!r} in {checkpoint} (it has: {have}); take one with "
            "`riverbed stream savepoint SPEC NAME`"
        ) from None
    return Savepoint.from_json(data)


def listed(checkpoint: str | Path) -> list[Savepoint]:
    """Every savepoint of the checkpoint's aggregation, oldest cut first."""
    store = checkpoint_store(checkpoint)
    keys = [i.key for i in store.list(SAVEPOINTS) if i.key.endswith(".json")]
    out = [Savepoint.from_json(json.loads(store.get(k))) for k in keys]
    return sorted(out, key=lambda s: (s.batch, s.name))


def delete(checkpoint: str | Path, state: StateConfig, aggregation: str, name: str) -> bool:
    """Delete savepoint ``name``: its record first (it stops existing at once), then its
    result rows and its copy of the state (what a kill left of either goes at the next
    delete of the name). Returns whether a record was there."""
    store = checkpoint_store(checkpoint)
    key = savepoint_key(_checked_name(name))
    found = store.exists(key)
    durable = state.durable
    if found:
        durable = read(checkpoint, name).durable
        store.delete(key)
    store.delete(savepoint_rows_key(name))
    StateProvider(replace(state, durable=durable)).drop(namespace(aggregation, name))
    return found


def take(
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig,
    aggregation: str,
    sessions: bool,
    name: str,
    say: Callable[[str], None] = log.info,
) -> Savepoint:
    """Take savepoint ``name`` of the aggregation at its newest committed batch (see
    the module doc)."""
    from riverbed.stream.results import current, encode_file, read_table

    store = checkpoint_store(checkpoint)
    if store.exists(savepoint_key(_checked_name(name))):
        raise StreamValueError(
            f"aggregation {aggregation!r} has a savepoint {name!r} already: choose another "
            "name (`riverbed stream savepoints SPEC` lists them)"
        )
    version = rescale.version_to_move(checkpoint)  # the state after the newest commit
    if version == 0:
        raise StreamValueError(f"aggregation {aggregation!r} has no committed batch to save")
    newest = version - 1
    record = open_batches(checkpoint).get(newest)
    assert record is not None
    if record.slices is None or record.spec is None:
        raise StreamValueError(
            f"batch {newest} of {aggregation!r} does not record its source offsets or spec "
            "(a DataFrame source, or a batch an older riverbed ran): savepoints need a "
            "riverbed or Kafka topic source; run one more batch with this riverbed first"
        )
    began = time.monotonic()
    gens = rescale.generations(checkpoint, 1)
    gen = rescale.for_version(gens, version)
    provider = StateProvider(state)
    entries, nbytes = rescale.copy(
        rescale.Place(provider, gen.namespace(aggregation), gen.partitions, version),
        rescale.Place(provider, namespace(aggregation, name), gen.partitions, version),
        sessions,
        lambda: None,
    )
    table = read_table(output)
    rows = False
    if table is not None:
        frame = table.to_pandas()
        frame = current(frame[frame["batch_id"] <= newest])
        if not frame.empty:
            import pyarrow as pa

            table = pa.Table.from_pandas(frame, preserve_index=False)
            store.put(savepoint_rows_key(name), encode_file(table))
            rows = True
    savepoint = Savepoint(
        name=name,
        aggregation=aggregation,
        batch=newest,
        state_version=version,
        state_partitions=gen.partitions,
        durable=str(state.durable),
        spec=record.spec,
        shape=json.loads(store.get(spec_key(record.spec))),
        ends={p: int(se[1]) for p, se in record.slices.items()},
        watermark_ms=record.watermark_ms,
        previous_watermark_ms=record.previous_watermark_ms,
        max_event_ms=record.max_event_ms,
        totals=dict(record.totals or {}),
        riverbed=__version__,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        rows=rows,
        since={m: t for g in gens for m, t in g.since if t is not None},
    )
    if not store.put_if_absent(
        savepoint_key(name), json.dumps(savepoint.to_json(), indent=1).encode()
    ):
        raise StreamValueError(f"savepoint {name!r} was taken meanwhile by another process")
    say(
        f"savepoint {name} of {aggregation}: batch {newest}, state version {version} "
        f"({gen.partitions} partitions, {entries:,} entries, {nbytes / 1e6:.1f} MB) in "
        f"{time.monotonic() - began:.1f} s"
    )
    return savepoint


def started_from(checkpoint: str | Path, savepoint: Savepoint) -> int | None:
    """The restore batch by which ``checkpoint`` started from ``savepoint`` (None: it
    did not)."""
    store = checkpoint_store(checkpoint)
    key = restored_key(savepoint.aggregation, savepoint.name)
    return int(json.loads(store.get(key))["batch"]) if store.exists(key) else None


def restore(
    checkpoint: str | Path,
    output: str | Path,
    state: StateConfig,
    aggregation: str,
    sessions: bool,
    home: str | Path,
    savepoint: Savepoint,
    fence: Callable[[], None],
    say: Callable[[str], None] = log.info,
) -> int | None:
    """Start aggregation ``aggregation`` (on ``checkpoint``) from ``savepoint`` (of the
    aggregation whose checkpoint is ``home``) with a restore batch (see the module
    doc); returns its id, or None when this checkpoint started from that savepoint
    already — a service manager restarting the same command line restores once (to go
    back to the same savepoint twice, fork it under a new name)."""
    import pyarrow as pa

    from riverbed.stream.results import read_file, store_backfilled

    store = checkpoint_store(checkpoint)
    batches = open_batches(checkpoint, fence)
    ids = batches.ids()
    newest = batches.get(ids[-1]) if ids else None
    mine = {"savepoint": savepoint.name, "of": savepoint.aggregation}
    done_key = restored_key(savepoint.aggregation, savepoint.name)
    at = started_from(checkpoint, savepoint)
    if at is not None:
        say(
            f"{aggregation} started from savepoint {savepoint.name} of {savepoint.aggregation} "
            f"already (restore batch {at}): it runs on from its checkpoint"
        )
        return None
    if newest is not None and newest.extra.get("restore") == mine:
        if newest.done:  # committed, its marker not yet written (a kill between)
            store.put_if_absent(done_key, json.dumps({"batch": ids[-1]}).encode())
            return None
        r = ids[-1]  # a restore a kill interrupted: finish it
    else:
        r = ids[-1] + 1 if ids else 0
    began = time.monotonic()
    # the shape the restored state holds, as every checkpoint records it
    store.put_if_absent(spec_key(savepoint.spec), json.dumps(savepoint.shape).encode())
    record = legacy_record(aggregation, savepoint.state_partitions, sessions)
    store.put_if_absent(SPEC, json.dumps(record).encode())
    plan = BatchRecord(
        watermark_ms=savepoint.watermark_ms,
        previous_watermark_ms=savepoint.previous_watermark_ms,
        max_event_ms=savepoint.max_event_ms,
        slices={p: [e, e] for p, e in savepoint.ends.items()},
        co_located=False,
        spec=savepoint.spec,
        input=0,
        extra={"restore": mine},
    )
    batches.put(r, plan)
    old = rescale.current(checkpoint, savepoint.state_partitions)
    entries = 0
    # (a generation from version r + 1 on is this restore's, made before a kill: only
    # the restore, unfinished, moves state before batch r is committed)
    if not (old.from_version == r + 1 and old.number > 0):
        # its spec is the restore batch's (its record names the savepoint's shape)
        new = rescale.Generation(
            old.number + 1, savepoint.state_partitions, r + 1, since=tuple(savepoint.since.items())
        )
        source = StateProvider(replace(state, durable=savepoint.durable))
        entries, _ = rescale.copy(
            rescale.Place(
                source, savepoint.namespace, savepoint.state_partitions, savepoint.state_version
            ),
            rescale.Place(StateProvider(state), new.namespace(aggregation), new.partitions, r + 1),
            sessions,
            fence,
        )
        if savepoint.rows:  # the result table at the cut: written by batch r + 1
            key = savepoint_rows_key(savepoint.name)
            table = read_file(checkpoint_store(home).get(key), key)
            at = table.schema.get_field_index("batch_id")
            ids_ = pa.array([r + 1] * table.num_rows, type=table.schema.field(at).type)
            store_backfilled(checkpoint, new.number, table.set_column(at, "batch_id", ids_), fence)
        rescale.switch(checkpoint, aggregation, new, old, fence)
    batches.put(r, replace(plan, done=True, totals=dict(savepoint.totals)))
    store.put_if_absent(done_key, json.dumps({"batch": r}).encode())
    say(
        f"{aggregation} restored from savepoint {savepoint.name} of {savepoint.aggregation} "
        f"(batch {savepoint.batch}): {entries:,} state entries, restore batch {r}, in "
        f"{time.monotonic() - began:.1f} s; the source is read again from the cut"
    )
    return r
