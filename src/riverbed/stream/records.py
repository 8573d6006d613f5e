"""Batch records: one JSON file per batch, where
:class:`~riverbed.stream.layout.Checkpoint` says.

A batch's record is written before any of its work — its watermark (from earlier batches
only) and, on the log-native path, its plan — and fsynced, so a re-run reads the same
plan back; it is marked ``done`` with running totals as the batch's commit
(:func:`finish_batch`), and every ``snapshot_every`` batches the driver purges state
history and records older than ``retain_versions`` batches (:func:`maintain`).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from riverbed.state import StateProvider
from riverbed.state.errors import CorruptStateError
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.engine import EngineConfig
from riverbed.stream.layout import Checkpoint
from riverbed.stream.results import compact_output

log = logging.getLogger(__name__)


def read_record(path: Path) -> dict[str, Any]:
    """A batch record, or :class:`CorruptStateError` naming it and the recovery."""
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        batch = path.stem.lstrip("0") or "0"
        checkpoint = Checkpoint.of_batch_record(path)
        commits = checkpoint.spark_commits / batch
        when = (
            f"If Spark has not committed that batch (no {commits}), delete the file"
            if checkpoint.spark_commits.is_dir()
            else "If it is the newest batch record, delete the file"
        )
        raise CorruptStateError(
            f"the record of batch {batch} (its plan, watermark and counts) is damaged: "
            f"{path} ({exc}). {when} and the batch runs again and writes it anew; "
            "otherwise restore it from a backup or start the aggregation on a new "
            "checkpoint (docs/stream.md, 'Failure model')"
        ) from None
    return record


class BatchLog:
    """Per-batch watermark, fixed before the batch runs and reused by re-runs."""

    def __init__(self, checkpoint: str, fence: Callable[[], None] | None = None) -> None:
        self.layout = Checkpoint.of(checkpoint)
        self.dir = self.layout.batches
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fence = fence or (lambda: None)

    def _path(self, batch_id: int) -> Path:
        return self.layout.batch(batch_id)

    def get(self, batch_id: int) -> dict[str, Any] | None:
        path = self._path(batch_id)
        return read_record(path) if path.exists() else None

    def previous(self, batch_id: int) -> dict[str, Any] | None:
        """The newest record before ``batch_id`` (almost always ``batch_id - 1``; a
        listing only when that one is missing)."""
        if batch_id > 0 and (record := self.get(batch_id - 1)) is not None:
            return record
        earlier = sorted(p for p in self.dir.glob("*.json") if int(p.stem) < batch_id)
        return read_record(earlier[-1]) if earlier else None

    def put(self, batch_id: int, record: dict[str, Any], *, durable: bool = True) -> None:
        """Replace the record atomically; ``durable=False`` skips the fsync (for records
        a re-run would rebuild the same way). The fence is checked after the slow part
        (writing and syncing the new version) and right before the rename that
        publishes it, so a driver paused and replaced meanwhile publishes nothing."""
        path = self._path(batch_id)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            tmp.write_text(json.dumps(record))
            if durable:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            self.fence()
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def update(self, batch_id: int, **fields: Any) -> None:
        record = self.get(batch_id) or {}
        record.update(fields)
        self.put(batch_id, record)

    def ids(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.json"))

    def prune(self, keep_from: int) -> int:
        """Delete the records of batches before ``keep_from``; returns how many."""
        gone = 0
        for batch_id in self.ids():
            if batch_id >= keep_from:
                break
            self._path(batch_id).unlink(missing_ok=True)
            gone += 1
        return gone


def next_record(batches: BatchLog, batch_id: int, spec: Aggregation) -> dict[str, Any]:
    """A new batch's record: its watermark, derived from earlier batches only."""
    prev = batches.previous(batch_id) or {"watermark_ms": 0, "max_event_ms": 0}
    return {
        "watermark_ms": max(prev["watermark_ms"], prev["max_event_ms"] - spec.watermark_ms),
        "previous_watermark_ms": prev["watermark_ms"],
        "max_event_ms": prev["max_event_ms"],
    }


COUNTS = ("input", "late", "malformed")


def input_rate(record: dict[str, Any]) -> float | None:
    """Records per second while a finished batch ran (log-native batches say where
    their time went in ``ms``; others do not)."""
    ms = sum((record.get("ms") or {}).values())
    return int(record.get("input", 0)) * 1000 / ms if ms else None


def summed_totals(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Totals over finished batch records, for checkpoints from before running totals
    (where no record was pruned yet)."""
    done = [r for r in records if r.get("done")]
    totals = {c: sum(int(r.get(c, 0)) for r in done) for c in COUNTS}
    totals["batches"] = len(done)
    return totals


def finish_batch(
    config: EngineConfig, batches: BatchLog, batch_id: int, record: dict[str, Any]
) -> None:
    """Record the batch as done (durably, before Spark commits it: the next batch's
    watermark comes from it), with running totals; then, every ``snapshot_every``
    batches, run :func:`maintain`."""
    prev = batches.previous(batch_id)
    if prev is not None and "totals" in prev:
        totals = dict(prev["totals"])
    else:  # the first batch, or records from before totals existed: count them once
        totals = summed_totals(
            r for b in batches.ids() if b < batch_id and (r := batches.get(b)) is not None
        )
    for c in COUNTS:
        totals[c] = int(totals.get(c, 0)) + int(record.get(c, 0))
    totals["batches"] = int(totals.get("batches", 0)) + 1
    if config.term is not None:
        record = record | {"term": config.term}  # which driver ran it (fencing.py)
    batches.put(batch_id, record | {"done": True, "totals": totals})
    if (batch_id + 1) % config.state.snapshot_every == 0:
        maintain(config, batches, batch_id)


def maintain(config: EngineConfig, batches: BatchLog, batch_id: int) -> None:
    """Purge state snapshots and changelogs, and batch records, that no version among
    the newest ``retain_versions`` needs, and compact the result table
    (:func:`compact_output`). Runs on the driver without opening any state
    partition, so it never competes with the state tasks; a failure is logged and
    retried at the next round, never fails the query."""
    spec = config.spec
    config.fence()  # a replaced driver purges nothing
    try:
        provider = StateProvider(config.state)
        for partition in range(spec.state_partitions):
            provider.purge(spec.name, partition)
        batches.prune(batch_id + 1 - config.state.retain_versions)
        if batch_id > 0:  # the batch before this one is committed: fold the table into it
            compact_output(config.output, spec, batch_id - 1)
    except Exception as exc:  # maintenance must not stop the query
        log.warning(
            "maintenance of %s after batch %d failed (retried in %d batches): %s",
            spec.name,
            batch_id,
            config.state.snapshot_every,
            exc,
        )
