"""Batch records, of the one shape :class:`BatchRecord`, read and written only by
:class:`BatchLog` in a checkpoint's object store (the keys: :mod:`riverbed.stream.layout`).

A batch's record is written before any of its work — its watermark (from earlier batches
only) and, on the log-native path, its plan — durably, so a re-run reads the same
plan back; its commit is the record marked ``done`` with running totals
(:func:`riverbed.stream.batch.finish_batch`), and every ``snapshot_every`` batches the
driver prunes records older than ``retain_versions`` batches
(:func:`riverbed.stream.batch.maintain`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverbed.state.errors import CorruptStateError
from riverbed.storage.base import numbered
from riverbed.stream.layout import (
    BATCHES,
    COMMITS,
    RIVERBED,
    SPARK_COMMITS,
    batch_key,
    check_format,
    checkpoint_store,
    commit_key,
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
    # a stream-stream join's plan (streamjoin.py): each side's slices {"left": {...},
    # "right": {...}}, the newest event time each side had shown before it, and when
    # (wall-clock ms) each side last had new records — its idle timeout's clock
    sources: dict[str, dict[str, list[int]]] | None = None
    source_max_ms: dict[str, int] | None = None
    source_moved_ms: dict[str, int] | None = None
    joined: int | None = None  # pairs a join emitted (its unmatched left events: unmatched)
    # the plan's version of each lookup table (lookups.Snapshot.to_json), so a re-run
    # joins with the same rows
    lookups: list[dict[str, Any]] | None = None
    # the hash of the spec's shape the batch was planned with (changes.py; the shape
    # itself: layout.spec_key) — what `stream plan` compares a changed spec with
    spec: str | None = None
    input: int | None = None  # records read from the source, malformed ones included
    late: int | None = None
    malformed: int | None = None
    filtered: int | None = None  # events the spec's ``where`` (or an inner lookup) did not keep
    unmatched: int | None = None  # events a lookup found no row for (lookups.py)
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


class BatchLog:
    """The batch records of a checkpoint, on any :class:`~riverbed.storage.ObjectStore`
    — a directory (:class:`~riverbed.storage.file.FileStore`) or a bucket — where every
    object that decides something is created once (``put_if_absent``: a link on a
    disk, ``If-None-Match: *`` in a bucket) and never replaced:

    * the **plan** — the first record put for a batch (its slices and watermark, and on
      the DataFrame path the counts a re-run keeps) — is ``batches/<b>.json``; a later
      put of the same batch must carry the same plan, and one with another plan is
      refused (two drivers never run different plans of one batch: the second reads the
      first's and runs it);
    * ``side_outputs_written`` is the marker ``batches/<b>.side``;
    * **done** is ``commits/<b>.json``, the commit. A driver that loses the race to
      commit a batch finds the winner's record: the same batch from the same plan over
      the same state, so the same result; the fence (the newest term) stops the loser
      at its next write.

    Counts and timings of an unfinished log-native batch are not stored: a re-run
    counts again. Checkpoints in a directory from before this layout kept one file per
    batch, replaced as the batch went from planned to done: such a file reads as the
    plan, or — ``"done": true`` in it — as the batch's commit.
    """

    def __init__(self, store: ObjectStore, fence: Callable[[], None] | None = None) -> None:
        self.store = store
        self.fence = fence or (lambda: None)
        self._plans: dict[int, tuple[Any, ...]] = {}  # plans known to be recorded

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
                f"the record of batch {batch_id} (its plan, watermark and counts) is "
                f"damaged: {self.store.locate(key)} ({exc}). {self._recovery(batch_id)} and "
                "the batch runs again and writes it anew; otherwise restore it from a "
                "backup or start the aggregation on a new checkpoint (docs/stream.md, "
                "'Failure model')"
            ) from None

    def _recovery(self, batch_id: int) -> str:
        """How to recover a damaged record: by deleting it, if nothing after it counts
        on it (Spark's own commit, for a checkpoint Spark's loop wrote)."""
        if self.store.list(SPARK_COMMITS):
            commit = self.store.locate(f"{SPARK_COMMITS}{batch_id}")
            return f"If Spark has not committed that batch (no {commit}), delete it"
        return "If it is the newest batch record, delete it"

    def get(self, batch_id: int) -> BatchRecord | None:
        done = self._read(commit_key(batch_id), batch_id)
        if done is not None:
            return done
        plan = self._read(batch_key(batch_id), batch_id)
        if plan is not None and self.store.exists(side_key(batch_id)):
            plan.side_outputs_written = True
        return plan

    def previous(self, batch_id: int) -> BatchRecord | None:
        """The newest record before ``batch_id`` (almost always ``batch_id - 1``; a
        listing only when that one is missing)."""
        if batch_id > 0 and (record := self.get(batch_id - 1)) is not None:
            return record
        earlier = [b for b in self.ids() if b < batch_id]
        return self.get(earlier[-1]) if earlier else None

    def put(self, batch_id: int, record: BatchRecord) -> None:
        """Record a batch (see the class doc): its plan once, its side marker once, its
        commit once. Every write is durable when it returns."""
        self.fence()
        data = json.dumps(record.to_json()).encode()
        if record.done:
            if not self.store.put_if_absent(commit_key(batch_id), data):
                self.fence()  # lost the race: to a newer driver (fenced) or a retry
            return
        plan = _plan(record)
        if self._plans.get(batch_id) != plan:  # a plan recorded already costs nothing
            if not self.store.put_if_absent(batch_key(batch_id), data):
                recorded = self._read(batch_key(batch_id), batch_id)
                if recorded is not None and _legacy(recorded, record):
                    # a plan Spark's offset log held, written before plans had slices:
                    # completed once with the slices read from that log (the only record
                    # ever replaced, and only by the one driver the fence lets write)
                    self.store.put(batch_key(batch_id), data)
                elif recorded is not None and _plan(recorded) != plan:
                    self.fence()  # a newer driver's plan: this driver is the stale one
                    raise CorruptStateError(
                        f"batch {batch_id} is recorded in {self.store.url} with another "
                        f"plan ({_plan(recorded)}) than this driver's ({plan}): is a "
                        "second driver running this aggregation without an election? "
                        "Run drivers with `riverbed stream run --control …` (docs/stream.md)"
                    )
            self._plans[batch_id] = plan
        if record.side_outputs_written:
            self.store.put_if_absent(side_key(batch_id), b"")

    def update(self, batch_id: int, **changes: Any) -> None:
        self.put(batch_id, replace(self.get(batch_id) or BatchRecord(), **changes))

    def ids(self) -> list[int]:
        keys = [i.key for i in self.store.list(RIVERBED)]  # plans and commits: one LIST
        return sorted(set(numbered(keys, BATCHES, ".json")) | set(numbered(keys, COMMITS, ".json")))

    def prune(self, keep_from: int) -> int:
        """Delete the records of batches before ``keep_from``; returns how many."""
        old = [b for b in self.ids() if b < keep_from]
        self.store.delete_many(
            key for b in old for key in (commit_key(b), side_key(b), batch_key(b))
        )
        for b in old:
            self._plans.pop(b, None)
        return len(old)


def _plan(record: BatchRecord) -> tuple[Any, ...]:
    """What must be the same in every run of a batch."""
    return (record.slices, record.watermark_ms, record.co_located, record.sources)


def _legacy(recorded: BatchRecord, record: BatchRecord) -> bool:
    """``record`` completes the slice-less plan of a checkpoint Spark's loop wrote."""
    return (
        recorded.slices is None
        and record.slices is not None
        and recorded.watermark_ms == record.watermark_ms
    )


Batches = BatchLog  # (the name callers type with)


def open_batches(checkpoint: str | Path, fence: Callable[[], None] | None = None) -> BatchLog:
    """The batch records of the checkpoint at ``checkpoint`` (a directory or a bucket);
    refused when a newer riverbed wrote the checkpoint (:mod:`riverbed.formats`)."""
    check_format(checkpoint)
    return BatchLog(checkpoint_store(checkpoint), fence)


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
