"""Backfilling metrics added to a running aggregation.

``stream plan`` says a metric added to a spec is *backfilled* (:mod:`riverbed.stream.
changes`): when the run starts, before its first batch, the added metrics are computed
from the records the source still holds, up to where the newest committed batch ended
(the *cut*), and

* merged into every window the state holds (open ones, and closed ones kept by
  ``keep_closed``), by a state move (:func:`riverbed.stream.rescale.move`: a new state
  generation, written beside the old one and made current by one create-only record —
  the same move that changes the partition count, so both happen in one pass);
* added to every row the result table holds, as rewritten rows (the other metrics'
  values copied as they are), stored before the switch at
  :func:`~riverbed.stream.layout.backfill_key` and written by the first batch after
  the switch with its own rows (:func:`riverbed.stream.results.with_backfilled`) —
  so every sink gets them exactly once, as it gets any batch (that batch runs even
  when the source has nothing new).

**What the backfill counts** is what the batches counted: the records are read again in
the slices the retained batch records planned, each slice against its batch's
watermark, so an event that batch dropped as late is dropped again (:func:`replay`,
the pure core). Records older than the oldest retained batch record are read as a
first batch would read them (watermark 0). Records retention deleted are not there:
the plan and the run say how many.

A kill at any moment before the switch leaves the old generation current; the next
start computes the same partials again (the same slices, the same watermarks) and
finishes the move. After the switch, the generation's record names the new shape
(:func:`riverbed.stream.specrecord.recorded` compares with it), so a restart never
backfills twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.state.keys import is_closed_window_key, window_key, window_key_of_closed
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batchlog import BatchRecord, input_rate, open_batches
from riverbed.stream.changes import Plan, Replay
from riverbed.stream.engine import combined, partials_of
from riverbed.stream.layout import backfill_key, checkpoint_store
from riverbed.stream.metrics import VALUE_METRICS
from riverbed.stream.rescale import Generation
from riverbed.stream.results import store_backfilled

log = logging.getLogger(__name__)

__all__ = ["Piece", "deleted_bound", "estimate", "pending", "replay", "retained", "run", "since"]

FIRST_WATERMARK = 0  # the watermark a checkpoint's first batch runs with (batchlog.py)


# -- the pure core: which records are read again, against which watermark ---------------


@dataclass(frozen=True)
class Piece:
    """Records ``[start, end)`` of source partition ``partition``, read against
    ``watermark_ms`` (the watermark of the batch that read them)."""

    partition: int
    start: int
    end: int
    watermark_ms: int


def replay(
    planned: Sequence[tuple[Mapping[str, Sequence[int]], int]],
    first: Mapping[int, int],
    cut: Mapping[int, int],
) -> list[Piece]:
    """The pieces a backfill reads: every offset of ``[first[p], cut[p])`` of every
    partition once, against the watermark of the batch whose slice held it
    (``planned``: committed batches' (slices, watermark), in any order), or
    :data:`FIRST_WATERMARK` where no retained record planned it."""
    out: list[Piece] = []
    for p, end in sorted(cut.items()):
        at = min(first.get(p, end), end)
        spans = sorted(
            (int(slices[str(p)][0]), int(slices[str(p)][1]), int(wm))
            for slices, wm in planned
            if str(p) in slices
        )
        for s, e, wm in spans:
            s, e = max(s, at), min(e, end)
            if e <= s:
                continue
            if s > at:
                out.append(Piece(p, at, s, FIRST_WATERMARK))
            out.append(Piece(p, s, e, wm))
            at = e
        if at < end:
            out.append(Piece(p, at, end, FIRST_WATERMARK))
    return out


def counted_from(records: Sequence[BatchRecord], oldest: int) -> dict[int, int]:
    """Where the aggregation began counting in each partition: batch 0's slices when
    its record is retained (``oldest``: the oldest retained batch id), else 0 (not
    known: every offset may have been counted)."""
    if oldest != 0 or not records or records[0].slices is None:
        return {}
    return {int(p): int(se[0]) for p, se in records[0].slices.items()}


def gone_counted(
    first: Mapping[int, int], cut: Mapping[int, int], begun: Mapping[int, int]
) -> dict[int, int]:
    """Per partition, how many records retention deleted that the aggregation had
    counted: offsets from where it began (``begun``; 0 when not known) to the oldest
    retained (``first``), up to the ``cut``."""
    return {p: max(0, min(first.get(p, 0), end) - begun.get(p, 0)) for p, end in cut.items()}


def deleted_bound(
    planned: Sequence[tuple[Mapping[str, Sequence[int]], int]],
    first: Mapping[int, int],
    cut: Mapping[int, int],
    begun: Mapping[int, int] | None = None,
) -> int | None:
    """The newest event time a record retention deleted can have, among the records
    the aggregation counted — None when it deleted none (``planned``: the retained
    committed batches' (slices, cumulative ``max_event_ms``), oldest first; ``first``:
    each partition's oldest retained offset; ``cut``: where the newest batch ended).
    A batch's ``max_event_ms`` is the newest event time read up to and including it,
    so the newest retained batch that read a deleted offset bounds them all; when no
    retained batch did, the oldest retained one does (every deleted record was read
    before it). ``begun``: where counting began (:func:`counted_from`); records
    before it were never counted, and their deletion changes nothing."""
    if not any(gone_counted(first, cut, begun or {}).values()) or not planned:
        return None
    reading = [
        newest
        for slices, newest in planned
        if any(
            int(se[0]) < first.get(int(p), 0) and int(se[1]) > int(se[0])
            for p, se in slices.items()
        )
    ]
    return int(reading[-1] if reading else planned[0][1])


def since(
    checkpoint: str | Path,
    spec: Aggregation,
    added: Sequence[str],
    options: Mapping[str, str] | None,
) -> dict[str, int]:
    """``spec.since`` at start: per metric, the bound :func:`deleted_bound` recorded
    when it was backfilled (the newest generation that backfilled it says), and for the
    ``added`` metrics this start backfills, the bound now (``options`` open the source's
    log). Metrics no longer in the spec, or backfilled with nothing deleted, have none."""
    from riverbed.stream import rescale

    held: dict[str, int | None] = {}
    for generation in rescale.generations(checkpoint, spec.state_partitions):
        held.update(dict(generation.since))
    if added and options is not None:
        newest, records, begun = _committed(checkpoint)
        if newest is not None and records:
            first = {p: f for p, (f, _) in retained(options).items()}
            planned = [(r.slices, r.max_event_ms) for r in records if r.slices is not None]
            bound = deleted_bound(planned, first, _cut(records), begun)
            held.update(dict.fromkeys(added, bound))
    return {m: t for m, t in held.items() if t is not None and m in spec.metrics}


def split_pieces(pieces: Sequence[Piece], size: int) -> list[Piece]:
    """``pieces`` cut to at most ``size`` records each (Spark's tasks)."""
    out = []
    for piece in pieces:
        for start in range(piece.start, piece.end, size):
            out.append(replace(piece, start=start, end=min(start + size, piece.end)))
    return out


# -- what is read: from the batch records and the source -------------------------------


def _committed(checkpoint: str | Path) -> tuple[int | None, list[BatchRecord], dict[int, int]]:
    """The newest committed batch, every retained committed record of the log-native
    path (with slices), oldest first, and where counting began (:func:`counted_from`)."""
    batches = open_batches(checkpoint)
    records = [(b, batches.get(b)) for b in batches.ids()]
    done = [(b, r) for b, r in records if r is not None and r.done]
    if not done:
        return None, [], {}
    begun = counted_from([r for _, r in done], done[0][0])
    return done[-1][0], [r for _, r in done if r.slices is not None], begun


def _cut(records: list[BatchRecord]) -> dict[int, int]:
    newest = records[-1]
    assert newest.slices is not None
    return {int(p): int(se[1]) for p, se in newest.slices.items()}


def retained(options: Mapping[str, str]) -> dict[int, tuple[int, int]]:
    """(first retained, end) offset of every partition of the source's topic."""
    from riverbed.spark.source import open_log

    topic_log = open_log(dict(options))
    try:
        return {o.partition: (o.start, o.end) for o in topic_log.offsets(options["topic"])}
    finally:
        topic_log.close()


def estimate(checkpoint: str | Path, options: Mapping[str, str]) -> Replay | None:
    """What backfilling reads from the source (``options`` open its log), or None when
    no batch has run (nothing to backfill)."""
    newest, records, begun = _committed(checkpoint)
    if newest is None or not records:
        return None
    cut = _cut(records)
    first = {p: first for p, (first, _) in retained(options).items()}
    ranges = {p: (min(first.get(p, end), end), end) for p, end in cut.items()}
    gone = sum(gone_counted(first, cut, begun).values())
    rates = [r for r in (input_rate(x) for x in records[-20:]) if r]
    replay_ = Replay(ranges, gone)
    seconds = replay_.records / (sum(rates) / len(rates)) if rates else None
    return replace(replay_, seconds=seconds)


# -- the move -----------------------------------------------------------------------------


def empty_partial(metric: Any) -> Any:
    """A metric's partial over no events."""
    nothing = np.empty(0, dtype=np.float64)
    if isinstance(metric, VALUE_METRICS):
        return metric.partial(nothing, 0, nothing)
    return metric.partial(nothing, 0)


class _Added:
    """The move's :class:`~riverbed.stream.rescale.Change`: each state entry gets the
    added metrics' partials (a removed metric's partial goes); the result rows are
    rewritten before the switch."""

    def __init__(
        self,
        spec: Aggregation,
        shape: str,
        added: tuple[str, ...],
        partials: dict[bytes, dict[str, Any]],
        windows: dict[bytes, dict[str, Any]],
        rows: Callable[[Generation], None],
        bound: int | None,
    ) -> None:
        self.spec, self.backfilled, self.partials, self._rows = shape, added, partials, rows
        self.windows = windows  # (a closed window kept beside panes: its own partials)
        self.since = tuple((n, bound) for n in added)
        self._metrics = spec.metrics
        self._empty = {n: empty_partial(spec.metrics[n]) for n in added}

    def value(self, key: bytes, value: bytes) -> bytes:
        held = msgpack.unpackb(value, raw=False)
        if is_closed_window_key(key):
            found = self.windows.get(window_key_of_closed(key), self._empty)
        else:
            found = self.partials.get(key, self._empty)
        # an added metric's partial is the backfill's even if the entry holds one under
        # its name (a metric removed before, and not written over since)
        out = {n: found[n] if n in self.backfilled else held[n] for n in self._metrics}
        return bytes(msgpack.packb(out, use_bin_type=True))

    def before_switch(self, new: Generation) -> None:
        self._rows(new)


def _tasks(direct: Any, spec: Aggregation) -> Callable[[Piece], tuple[list[Any], list[Any], int]]:
    """A Spark task: the added metrics' partials over one piece (``spec`` holds only
    them) as state holds them, and per window when state holds panes (for the result
    rows: a window takes no event its batch's watermark had closed it to, where its
    panes may), and the records it read."""
    from riverbed.spark.source import LogSlice
    from riverbed.stream.lognative import Side, events

    by_window = replace(spec, state_layout="windows") if spec.pane_ms else None

    def run(piece: Piece) -> tuple[list[Any], list[Any], int]:
        side = Side()
        out: list[Any] = []
        windows: list[Any] = []
        wm = piece.watermark_ms
        for pdf, ts in events(direct, LogSlice(piece.partition, piece.start, piece.end), wm, side):
            out += partials_of(spec, pdf, wm, ts)
            if by_window is not None:
                windows += partials_of(by_window, pdf, wm, ts)
        return out, windows, side.input

    return run


def _rewritten(
    spec: Aggregation,
    added: tuple[str, ...],
    output: str,
    partials: dict[bytes, dict[str, Any]],
    batch_id: int,
    waiting: pd.DataFrame | None,
) -> pa.Table | None:
    """The result table's current rows — with ``waiting``, rows no batch wrote yet
    (a restore's: newer) — with the added metrics' columns (from ``partials``; a window
    with none: over no events), as batch ``batch_id``'s."""
    from riverbed.stream.results import (
        conformed,
        current,
        output_arrow_schema,
        read_table,
        since_values,
    )

    table = read_table(output)
    frames = [] if table is None else [table.to_pandas()]
    if waiting is not None:
        frames.append(waiting)
    if not frames or sum(len(f) for f in frames) == 0:
        return None
    frame = current(pd.concat(frames, ignore_index=True))
    schema = output_arrow_schema(spec)
    if frame.empty:
        return None
    starts = pd.to_datetime(frame["window_start"], utc=True).dt.as_unit("ms").astype("int64")
    columns: dict[str, list[Any]] = {}
    for start, key in zip(starts.tolist(), frame["key"].tolist(), strict=True):
        found = partials.get(window_key(int(start), str(key).encode()))
        for name in added:
            metric = spec.metrics[name]
            value = found[name] if found is not None else empty_partial(metric)
            for suffix, result in metric.result(value).items():
                columns.setdefault(name + suffix, []).append(result)
    for column, values in columns.items():
        frame[column] = values
    for column, since in since_values(spec, starts.to_numpy()).items():
        frame[column] = since  # every since, also the earlier backfills' (held already)
    frame["batch_id"] = batch_id
    have = pa.Table.from_pandas(frame, preserve_index=False)
    return conformed(have.select([n for n in schema.names if n in have.column_names]), schema)


def run(
    spark: Any,
    direct: Any,
    plan: Plan,
    shape: str,
    old: Generation,
    fence: Callable[[], None],
    say: Callable[[str], None] = log.info,
) -> Generation:
    """Backfill ``plan``'s added metrics (see the module doc), moving the state of
    generation ``old`` to the spec's partition count on the way; returns the new
    generation (``old`` when no batch has run: nothing to backfill)."""
    from riverbed.stream import rescale

    engine = direct.engine
    spec: Aggregation = engine.spec
    added = plan.backfilled
    newest, records, begun = _committed(engine.checkpoint)
    if newest is None:
        return old
    cut = _cut(records)
    first = {p: f for p, (f, _) in retained(direct.options).items()}
    pieces = replay(
        [(r.slices, r.watermark_ms) for r in records if r.slices is not None], first, cut
    )
    bound = deleted_bound(
        [(r.slices, r.max_event_ms) for r in records if r.slices is not None], first, cut, begun
    )
    if bound is not None and any(spec.since.get(n) != bound for n in added):
        # retention deleted more since the start read the bound (since()): this run's
        # rows carry the start's; the generation records this one, which the next
        # start reads
        log.warning(
            "retention deleted records of %s's source while it started: %s marked "
            "`_since` up to %d ms (the next start uses it)",
            spec.name,
            ", ".join(added),
            bound,
        )
    work = split_pieces(pieces, max(direct.piece_records, 1))
    only = replace(spec, metrics={n: spec.metrics[n] for n in added})
    began = time.monotonic()
    say(
        f"backfilling {', '.join(added)} of {spec.name}: "
        f"{sum(p.end - p.start for p in work):,} records up to batch {newest}"
    )
    found: list[tuple[list[Any], list[Any], int]] = []
    if work:
        from riverbed.spark import tasks

        tasks.describe(spark, f"riverbed {spec.name} backfill of {', '.join(added)}")
        found = tasks.map_items(spark, work, _tasks(direct, only))
    partials = combined(only, (p for f, _, _ in found for p in f))
    windows = (
        combined(replace(only, state_layout="windows"), (p for _, f, _ in found for p in f))
        if only.pane_ms
        else partials
    )
    read = sum(n for _, _, n in found)
    version = newest + 1

    def rows(new: Generation) -> None:
        if checkpoint_store(engine.checkpoint).exists(backfill_key(new.number)):
            return  # written before a kill: the same rows
        table = _rewritten(spec, added, engine.output, windows, version, waiting)
        if table is not None:
            store_backfilled(engine.checkpoint, new.number, table, fence)

    # rows the old generation's first batch was to write (a restore's) and did not yet:
    # this generation's rows replace them, so they are part of the table rewritten
    due = pending(engine.checkpoint, old)
    waiting = None
    if due is not None and due[0] == version:
        from riverbed.stream.results import with_backfilled

        waiting = with_backfilled(engine.checkpoint, old.number, pd.DataFrame())
    change = _Added(spec, shape, added, partials, windows, rows, bound)
    new = rescale.move(
        engine.checkpoint,
        engine.state,
        spec.name,
        spec.sessions,
        old,
        spec.state_partitions,
        fence,
        say,
        version=version,
        change=change,
    )
    say(
        f"backfilled {', '.join(added)} of {spec.name} from {read:,} records "
        f"({len(partials):,} windows and keys) in {time.monotonic() - began:.1f} s"
    )
    return new


# -- the rows the first batch after it writes ---------------------------------------------


def pending(checkpoint: str | Path, generation: Generation) -> tuple[int, int] | None:
    """(the batch that still has to write the result rows a backfill rewrote — or a
    restore from a savepoint brought, :mod:`riverbed.stream.savepoints` — when
    ``generation`` was made, the generation), or None: none has to — no such rows, or
    that batch is committed."""
    if generation.number == 0:
        return None
    if not checkpoint_store(checkpoint).exists(backfill_key(generation.number)):
        return None
    record = open_batches(checkpoint).get(generation.from_version)
    if record is not None and record.done:
        return None
    return generation.from_version, generation.number
