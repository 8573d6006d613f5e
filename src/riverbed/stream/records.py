"""Batch records: one JSON file per batch, where
:class:`~riverbed.stream.layout.Checkpoint` says, of the one shape
:class:`BatchRecord`, read and written only by :class:`BatchLog`.

A batch's record is written before any of its work — its watermark (from earlier batches
only) and, on the log-native path, its plan — and fsynced, so a re-run reads the same
plan back; it is marked ``done`` with running totals as the batch's commit
(:func:`riverbed.stream.batch.finish_batch`), and every ``snapshot_every`` batches the
driver prunes records older than ``retain_versions`` batches
(:func:`riverbed.stream.batch.maintain`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.state.errors import CorruptStateError
from riverbed.stream.layout import (
    BATCHES,
    COMMITS,
    RIVERBED,
    Checkpoint,
    batch_key,
    checkpoint_store,
    commit_key,
    is_local,
    numbered,
    side_key,
)

if TYPE_CHECKING:
    from riverbed.storage import ObjectStore


@dataclass
class BatchRecord:
    """What one batch is, as its record file holds it (the only shape of that file;
    :class:`BatchLog` is the only reader and writer).

    Written before the batch runs — its watermark (from earlier batches only) and, on
    the log-native path, its plan (``slices``, ``co_located``) — then its counts as they
    are known, then ``done`` with running ``totals`` as the batch's commit. A count that
    is ``None`` is not known yet (a re-run counts it; one that is known is kept)."""

    watermark_ms: int = 0
    previous_watermark_ms: int = 0
    max_event_ms: int = 0
    # the plan (log-native path): {"<log partition>": [start, end]}; None for batches
    # the Spark-driven loop ran (their offsets are in Spark's offset log)
    slices: dict[str, list[int]] | None = None
    co_located: bool | None = None
    input: int | None = None  # records read from the source, malformed ones included
    late: int | None = None
    malformed: int | None = None
    filtered: int | None = None  # events the spec's ``where`` did not keep
    helped: int | None = None  # records read for another task's partition (steal.py)
    side_outputs_written: bool = False
    ms: dict[str, int] = field(default_factory=dict)  # where the batch's time went
    term: int | None = None  # the term of the driver that committed it (fencing.py)
    done: bool = False
    totals: dict[str, int] | None = None  # running totals up to this batch, once done
    # keys a newer riverbed wrote, kept as they are so a rewrite never drops them
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record file's object: fields with no value (None, an unset flag, no
        timings) are left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None or (f.name in _FLAGS and not value) or (f.name == "ms" and not value):
                continue
            out[f.name] = value
        return out | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRecord:
        """A record from its file's object (any riverbed version's: missing fields take
        their defaults, unknown ones are kept in ``extra``)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.extra = {k: v for k, v in data.items() if k not in known}
        for name in ("watermark_ms", "previous_watermark_ms", "max_event_ms"):
            setattr(record, name, int(getattr(record, name)))
        return record

    def counted(self, name: str) -> int:
        """One of :data:`COUNTS` (0 while not known)."""
        return int(getattr(self, name) or 0)


COUNTS = ("input", "late", "malformed", "filtered")
_FLAGS = ("done", "side_outputs_written")  # written only when true


def parse_record(data: bytes | str) -> BatchRecord:
    """A record from its file's bytes; ``ValueError`` when they are not one."""
    try:
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return BatchRecord.from_json(value)
    except (TypeError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


def read_record(path: Path) -> BatchRecord:
    """A batch record, or :class:`CorruptStateError` naming it and the recovery."""
    try:
        return parse_record(path.read_bytes())
    except ValueError as exc:
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


class BatchLog:
    """The batch records of a local checkpoint: one file per batch, replaced atomically
    (temporary, fsync, rename) as the batch goes from planned to done. The object-store
    twin is :class:`ObjectBatchLog`; :func:`open_batches` picks by location, and both
    pass one contract suite (``tests/stream/test_checkpoint_contract.py``)."""

    def __init__(self, checkpoint: str, fence: Callable[[], None] | None = None) -> None:
        self.layout = Checkpoint.of(checkpoint)
        self.dir = self.layout.batches  # made by the first put: reading makes nothing
        self.fence = fence or (lambda: None)

    def _path(self, batch_id: int) -> Path:
        return self.layout.batch(batch_id)

    def get(self, batch_id: int) -> BatchRecord | None:
        path = self._path(batch_id)
        return read_record(path) if path.exists() else None

    def previous(self, batch_id: int) -> BatchRecord | None:
        """The newest record before ``batch_id`` (almost always ``batch_id - 1``; a
        listing only when that one is missing)."""
        if batch_id > 0 and (record := self.get(batch_id - 1)) is not None:
            return record
        earlier = sorted(p for p in self.dir.glob("*.json") if int(p.stem) < batch_id)
        return read_record(earlier[-1]) if earlier else None

    def put(self, batch_id: int, record: BatchRecord, *, durable: bool = True) -> None:
        """Replace the record atomically; ``durable=False`` skips the fsync (for records
        a re-run would rebuild the same way). The fence is checked after the slow part
        (writing and syncing the new version) and right before the rename that
        publishes it, so a driver paused and replaced meanwhile publishes nothing."""
        path = self._path(batch_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            tmp.write_text(json.dumps(record.to_json()))
            if durable:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            self.fence()
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def update(self, batch_id: int, **changes: Any) -> None:
        self.put(batch_id, replace(self.get(batch_id) or BatchRecord(), **changes))

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


class ObjectBatchLog:
    """The batch records of a checkpoint in a bucket, where nothing can be renamed and a
    plain PUT is last-writer-wins: every object that decides something is created once
    (``If-None-Match: *``, :meth:`ObjectStore.put_if_absent`) and never replaced.

    * the **plan** — the first record put for a batch (its slices and watermark) — is
      ``batches/<b>.json``; a later put of the same batch must carry the same plan, and
      one with another plan is refused (two drivers never run different plans of one
      batch: the second reads the first's and runs it);
    * ``side_outputs_written`` is the marker ``batches/<b>.side``;
    * **done** is ``commits/<b>.json``, the commit. A driver that loses the race to
      commit a batch finds the winner's record: the same batch from the same plan over
      the same state, so the same result; the fence (the newest term) stops the loser
      at its next write.

    Counts and timings of an unfinished batch are not stored: a re-run counts again.
    """

    def __init__(self, store: ObjectStore, fence: Callable[[], None] | None = None) -> None:
        self.store = store
        self.fence = fence or (lambda: None)

    def _read(self, key: str, batch_id: int) -> BatchRecord | None:
        from riverbed.storage import ObjectNotFoundError

        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            return None
        try:
            return parse_record(data)
        except ValueError as exc:
            raise CorruptStateError(
                f"the record of batch {batch_id} is damaged: {self.store.url}/{key} ({exc}). "
                "If it is the newest batch, delete the object and the batch runs again; "
                "otherwise start the aggregation on a new checkpoint (docs/stream.md, "
                "'Failure model')"
            ) from None

    def get(self, batch_id: int) -> BatchRecord | None:
        done = self._read(commit_key(batch_id), batch_id)
        if done is not None:
            return done
        plan = self._read(batch_key(batch_id), batch_id)
        if plan is not None and self.store.exists(side_key(batch_id)):
            plan.side_outputs_written = True
        return plan

    def previous(self, batch_id: int) -> BatchRecord | None:
        if batch_id > 0 and (record := self.get(batch_id - 1)) is not None:
            return record
        earlier = [b for b in self.ids() if b < batch_id]
        return self.get(earlier[-1]) if earlier else None

    def put(self, batch_id: int, record: BatchRecord, *, durable: bool = True) -> None:
        """Record a batch (see the class doc): its plan once, its side marker once, its
        commit once. Every object store write is durable when it returns."""
        self.fence()
        data = json.dumps(record.to_json()).encode()
        if record.done:
            if not self.store.put_if_absent(commit_key(batch_id), data):
                self.fence()  # lost the race: to a newer driver (fenced) or a retry
            return
        if not self.store.put_if_absent(batch_key(batch_id), data):
            recorded = self._read(batch_key(batch_id), batch_id)
            if recorded is not None and _plan(recorded) != _plan(record):
                self.fence()  # a newer driver's plan: this driver is the stale one
                raise CorruptStateError(
                    f"batch {batch_id} is recorded in {self.store.url} with another plan "
                    f"({_plan(recorded)}) than this driver's ({_plan(record)}): is a "
                    "second driver running this aggregation without an election? Run "
                    "drivers with `riverbed stream run --control …` (docs/stream.md)"
                )
        if record.side_outputs_written:
            self.store.put_if_absent(side_key(batch_id), b"")

    def update(self, batch_id: int, **changes: Any) -> None:
        self.put(batch_id, replace(self.get(batch_id) or BatchRecord(), **changes))

    def ids(self) -> list[int]:
        keys = [i.key for i in self.store.list(RIVERBED)]  # plans and commits: one LIST
        return sorted(set(numbered(keys, BATCHES, ".json")) | set(numbered(keys, COMMITS, ".json")))

    def prune(self, keep_from: int) -> int:
        old = [b for b in self.ids() if b < keep_from]
        self.store.delete_many(
            key for b in old for key in (commit_key(b), side_key(b), batch_key(b))
        )
        return len(old)


def _plan(record: BatchRecord) -> tuple[Any, ...]:
    """What must be the same in every run of a batch."""
    return (record.slices, record.watermark_ms, record.co_located)


Batches = BatchLog | ObjectBatchLog


def open_batches(checkpoint: str | Path, fence: Callable[[], None] | None = None) -> Batches:
    """The batch records of the checkpoint at ``checkpoint``: files on a local one,
    create-only objects in a bucket."""
    if is_local(checkpoint):
        return BatchLog(str(Checkpoint.of(checkpoint).root), fence)
    return ObjectBatchLog(checkpoint_store(str(checkpoint)), fence)


def next_record(batches: Batches, batch_id: int, delay_ms: int) -> BatchRecord:
    """A new batch's record: its watermark, derived from earlier batches only (the
    newest event seen before it, less the aggregation's watermark delay)."""
    prev = batches.previous(batch_id) or BatchRecord()
    return BatchRecord(
        watermark_ms=max(prev.watermark_ms, prev.max_event_ms - delay_ms),
        previous_watermark_ms=prev.watermark_ms,
        max_event_ms=prev.max_event_ms,
    )


def input_rate(record: BatchRecord) -> float | None:
    """Records per second while a finished batch ran (log-native batches say where
    their time went in ``ms``; others do not)."""
    ms = sum(record.ms.values())
    return record.counted("input") * 1000 / ms if ms else None


def summed_totals(records: Iterable[BatchRecord]) -> dict[str, int]:
    """Totals over finished batch records, for checkpoints from before running totals
    (where no record was pruned yet)."""
    done = [r for r in records if r.done]
    totals = {c: sum(r.counted(c) for r in done) for c in COUNTS}
    totals["batches"] = len(done)
    return totals
