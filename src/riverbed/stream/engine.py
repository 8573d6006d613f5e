"""The aggregation engine: one micro-batch = one ``batch_id`` = one state version.

This module holds the engine's core — the config every task gets
(:class:`EngineConfig`), the pre-aggregation of a batch's events into partials per
(window, key), and the merge of partials into a state partition; the batch records are
:mod:`riverbed.stream.batchlog`, the result table :mod:`riverbed.stream.results`, and how
a batch ends :mod:`riverbed.stream.batch`. For each micro-batch:

1. **batch record** — the watermark this batch uses is derived from earlier batches
   only and recorded before any work (:mod:`~riverbed.stream.batchlog`); a re-run of
   the batch reads it back, so it sees the same watermark;
2. **side outputs** — malformed records (``_error``) go to ``<name>.dlq`` and events
   whose every window is already closed go to ``<name>.late`` (both counted);
3. **pre-aggregate** events vectorized per (window, key) into partials, tagged with
   their state partition (``crc32(key) % state_partitions``), carried as data — never
   Spark's physical partition index;
4. **merge** — one call per state partition (plus a heartbeat so partitions without
   data still expire and emit): load the state as of the previous batch (version
   ``batch_id``), merge, emit, expire closed windows, commit version ``batch_id + 1``;
5. **output** — the emitted rows are ``<output>/batch_id=<id>/``, stored once: a
   re-run's same rows leave the file (a late writer replaces nothing), other rows (a
   rollback's, a backfill's) replace it — never a duplicate
   (:func:`~riverbed.stream.results.store_batch`);
6. **finish** — the batch record gets ``done`` and running totals; every
   ``snapshot_every`` batches the driver purges old state history and batch records,
   so a query that runs for months keeps a bounded checkpoint.

A task retry, a speculative copy or a driver restart re-runs steps 3-5 for the same
``batch_id`` against the same previous version, so the state version and the output
are the same (see :mod:`riverbed.state` for why re-commits are safe).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import pandas as pd

from riverbed.config import adopt, inherited
from riverbed.gcpause import pausing
from riverbed.log import reach_environment
from riverbed.state import StateConfig, StateProvider
from riverbed.state.keys import (
    closed_prefix,
    closed_window_key,
    session_end_key,
    session_ends,
    session_key,
    split_session_end_key,
    window_keys,
    window_prefix,
)
from riverbed.stream import panes, sessions
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.fencing import check_term
from riverbed.stream.grouping import (
    Partial,
    by_window_and_key,
    group_partials,
    pane_partials,
    run_firsts,
    tagged,
)
from riverbed.stream.metrics import values_merger
from riverbed.stream.rescale import partition_of
from riverbed.stream.rows import SessionRow, session_rows, window_rows
from riverbed.windows import Session

if TYPE_CHECKING:
    from riverbed.stream.doors import Sink

log = logging.getLogger(__name__)

PARTIAL_SCHEMA = "state_partition int, window_start long, key string, partials binary"


@dataclass(frozen=True)
class EngineConfig:
    """Everything a task needs; pickled to executors."""

    spec: Aggregation
    state: StateConfig
    checkpoint: str
    output: str
    log_url: str | None = None  # for the .dlq and .late topics
    # where results go besides the result table (riverbed.stream.doors: SqlTable,
    # ResultsTopic), each written per batch by the driver holding the fence
    sinks: tuple[Sink, ...] = ()
    # the RIVERBED_FAULT failpoint (tests), read on the driver: executors may not see it
    fault: str | None = field(default_factory=lambda: inherited("RIVERBED_FAULT") or None)
    term: int | None = None  # the driver's election term; None: not fenced (fencing.py)
    # whose checkpoint holds the term that fences it, when not its own (an aggregation
    # run by another's driver: stream/chain.py)
    fenced_by: str | None = None
    # the lookups' tables: their columns, fixed at start, and the snapshots the batch
    # being run joins with (its plan's, set per batch by the driver; lookups.py)
    lookup_schemas: tuple[Any, ...] = ()
    lookups: tuple[str, ...] = ()
    # the hash of the spec's shape, recorded in every batch it plans (changes.py)
    shape: str | None = None
    # the state namespace of the current generation (rescale.py); None: the name
    state_namespace: str | None = None
    # (the batch that writes them, their generation): the result rows a backfill
    # rewrote, written with that batch's own (backfill.py)
    backfill_rows: tuple[int, int] | None = None
    # how the driver reaches a bucket and the log (AWS_* settings, the log servers'
    # token: secrets, never printed), applied where a task runs and its process has
    # none (see __setstate__)
    reach_env: dict[str, str] = field(default_factory=reach_environment, repr=False)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled where a task runs: Spark's Python workers may have started before
        the driver's bucket settings were set (or on another machine), so the driver's
        fill in what the worker's environment lacks — as Spark ships the driver's
        Hadoop settings for ``s3a://`` to executors."""
        self.__dict__.update(state)
        adopt(state.get("reach_env", {}))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def namespace(self) -> str:
        """The state namespace the engine reads and writes (:mod:`riverbed.stream.rescale`)."""
        return self.state_namespace or self.spec.name

    def fence(self) -> None:
        """Raise DriverFencedError if a newer driver took over (before every write)."""
        check_term(self.fenced_by or self.checkpoint, self.term, self.spec.name)


def state_partition_of(keys: pd.Series, n: int) -> np.ndarray:
    """Each key's state partition, by :func:`riverbed.stream.rescale.partition_of` (the
    one owner of the rule: a rescale moves entries by it)."""
    uniques = keys.unique()
    mapping = {k: partition_of(str(k).encode(), n) for k in uniques}
    out: np.ndarray = keys.map(mapping).to_numpy(dtype=np.int32)
    return out


def event_millis(column: pd.Series) -> np.ndarray:
    """Event times as ms since the epoch, whatever unit pandas holds them in (Spark's
    Arrow path gives ns, pyarrow's to_pandas keeps us); naive times are UTC; integers
    are epoch ms already (the DataFrame path sends them so: years past 2262 too)."""
    if pd.api.types.is_integer_dtype(column.dtype):
        given: np.ndarray = column.to_numpy(dtype=np.int64)
        return given
    if not pd.api.types.is_datetime64_any_dtype(column.dtype):
        column = pd.to_datetime(column, utc=True)  # strings, objects: parse (slow path)
    ms: np.ndarray = column.dt.as_unit("ms").astype("int64").to_numpy()
    return ms


# -- step 3: pre-aggregation -------------------------------------------------------------------


@pausing  # (riverbed.gcpause: per-key objects, none in a cycle)
def partials_of(
    spec: Aggregation, pdf: pd.DataFrame, watermark_ms: int, ts: np.ndarray | None = None
) -> list[Partial]:
    """Per (window, key) partials of one frame of events, vectorized per group. Events
    only count toward windows the watermark has not closed. ``ts``: the frame's event
    times in ms, when the caller has them already. A session's partials carry its end
    (:data:`riverbed.stream.sessions.END`)."""
    if pdf.empty:
        return []
    if ts is None:
        ts = event_millis(pdf[spec.time])
    key = pdf[spec.key_column]
    # group by (window, key) with numpy: sort once, cut where either changes (a pandas
    # groupby costs ~0.2 ms a group, which dominates small batches)
    if isinstance(key.dtype, pd.CategoricalDtype):  # the log-native path's string keys
        codes, names = key.cat.codes.to_numpy(), key.cat.categories.astype(str).to_numpy()
    elif isinstance(key.dtype, np.dtype) and key.dtype.kind in "iu":
        # numpy's integers (not pandas' nullable ones: a NA would factorize to -1 and
        # the rest to floats): the distinct ones as text, not every event's
        codes, distinct = pd.factorize(key.to_numpy())
        names = distinct.astype(str)
    else:
        codes, names = pd.factorize(key.astype(str).to_numpy())
    window = spec.window
    if isinstance(window, Session):
        gap = window.gap_ms
        rows_all = np.flatnonzero(ts >= watermark_ms)  # before it: late (windows.late)
        if not len(rows_all):
            return []
        order, bounds = sessions.cut(ts[rows_all], codes[rows_all], gap)
        rows_all = rows_all[order]
        groups = group_partials(spec, pdf, ts, rows_all, bounds)
        # each session's first and last event, and its key, for all at once (numpy's
        # scalars one session at a time were 13 % of a q11 task)
        edges = np.asarray(bounds, dtype=np.int64)
        firsts, lasts = rows_all[edges[:-1]], rows_all[edges[1:] - 1]
        ends = (ts[lasts] + gap).tolist()
        for partials, end in zip(groups, ends, strict=True):
            partials[sessions.END] = end
        return tagged(ts[firsts], codes[firsts], names, groups)
    size = window.size_ms
    if spec.pane_ms:  # state holds panes: an event's partial is its pane's (panes.py)
        hop = spec.pane_ms
        all_starts = [(ts // hop) * hop]  # (a pane starts where its newest window does)
    else:
        if getattr(window, "hop_ms", size) < size:  # (an older riverbed's state: windows)
            by_panes = pane_partials(spec, pdf, ts, codes, names, watermark_ms)
            if by_panes is not None:
                return by_panes
        all_starts = window.starts(ts)
    window_starts, rows = [], []  # one entry per (event, open window/pane it falls in)
    for starts in all_starts:
        # closed windows take no more; a pane, while a window holding it is open
        open_ = np.flatnonzero(starts + size > watermark_ms)
        if len(open_):
            window_starts.append(starts[open_])
            rows.append(open_)
    if not rows:
        return []
    starts_all, rows_all = np.concatenate(window_starts), np.concatenate(rows)
    key_codes = codes[rows_all]
    order = by_window_and_key(starts_all, key_codes, len(names))
    starts_all, key_codes, rows_all = starts_all[order], key_codes[order], rows_all[order]
    firsts = run_firsts(starts_all, key_codes)
    groups = group_partials(spec, pdf, ts, rows_all, [*firsts.tolist(), len(rows_all)])
    return tagged(starts_all[firsts], key_codes[firsts], names, groups)


def preaggregate(
    spec: Aggregation, watermark_ms: int
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """``mapInPandas`` step: partials as rows, tagged with their state partition."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in frames:
            rows = [
                (start, key, msgpack.packb(partials, use_bin_type=True))
                for start, key, partials in partials_of(spec, pdf, watermark_ms)
            ]
            if not rows:
                continue
            out = pd.DataFrame(rows, columns=["window_start", "key", "partials"])
            out.insert(0, "state_partition", state_partition_of(out["key"], spec.state_partitions))
            yield out

    return run


# -- step 4: merge into state -------------------------------------------------------------------
class InjectedFault(RuntimeError):
    """Raised by the ``RIVERBED_FAULT`` failpoint (tests only)."""


def _failpoint(config: EngineConfig, partition: int, batch_id: int) -> None:
    """``RIVERBED_FAULT=after_commit:<dir>``: in every batch, the first task to commit a
    state partition dies right after the commit, once (a marker file in ``<dir>``
    remembers it), the way a task is lost between its commit and reporting success."""
    if not config.fault or not config.fault.startswith("after_commit:"):
        return
    marker = Path(config.fault.split(":", 1)[1]) / f"{config.spec.name}-{batch_id}"
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    raise InjectedFault(f"injected fault after commit: partition {partition}, batch {batch_id}")


@pausing
def merge_partition(
    config: EngineConfig,
    partition: int,
    batch_id: int,
    watermark_ms: int,
    previous_watermark_ms: int,
    partials: Iterable[Partial],
) -> pd.DataFrame:
    """Merge one batch's partials into state partition ``partition``: load version
    ``batch_id``, merge, emit, expire closed windows, commit ``batch_id + 1``. Returns
    the rows to emit. The partials are :func:`partials_of` the batch's events at
    ``watermark_ms``: a window this batch closes takes none of them."""
    spec = config.spec
    provider = StateProvider(config.state)
    store = provider.load(config.namespace, partition, version=batch_id)
    if spec.sessions:
        try:
            emitted_sessions, removed = _merge_sessions(
                spec, store, watermark_ms, previous_watermark_ms, partials
            )
            config.fence()  # a replaced driver's task must not commit a version
            store.commit(batch_id + 1)
        except BaseException:
            store.abort()
            raise
        _failpoint(config, partition, batch_id)
        return session_rows(spec, emitted_sessions, removed, batch_id)
    assert not isinstance(spec.window, Session)
    size = spec.window.size_ms
    try:
        given = grouped(partials)  # several tasks made them
        keys = sorted(given)
        emitted: dict[bytes, dict[str, Any]] | panes.Windows = {}
        pack = msgpack.Packer(use_bin_type=True).pack  # (packb makes a Packer a call)
        merge = values_merger(spec)
        held = _held_up_to(store, keys)  # past the newest stored key: all new
        batch = {}
        for k, stored in zip(keys[:held], store.get_many(keys[:held]), strict=True):
            value = None if stored is None else msgpack.unpackb(stored, raw=False)
            batch[k] = merge(given[k], value)
        batch.update([(k, merge(given[k], None)) for k in keys[held:]])
        # windows the watermark closed in this batch: start + size <= watermark
        closed_to = watermark_ms - size  # starts <= closed_to are closed
        if spec.pane_ms:  # (read before this batch's puts, like the windows below)
            emitted = _pane_windows(spec, store, batch, keys, watermark_ms, previous_watermark_ms)
        elif spec.output == "update":
            emitted = batch
        elif watermark_ms > previous_watermark_ms:
            lo = max(previous_watermark_ms - size + 1, 0)
            first, end = window_prefix(lo), window_prefix(closed_to + 1)
            # (read before this batch's puts: the stored ones, then the batch's merged)
            closing = {
                k: msgpack.unpackb(blob, raw=False)
                for k, blob in store.scan(start=first, end=end)
                if k not in batch
            }
            for k in keys[bisect.bisect_left(keys, first) : bisect.bisect_left(keys, end)]:
                closing[k] = batch[k]
            emitted = closing
        store.put_many([(k, pack(batch[k])) for k in keys])
        expire_to = closed_to - spec.keep_closed_ms
        if spec.pane_ms:  # a pane serves no window once its newest one closed
            if closed_to >= 0:
                store.delete_range(window_prefix(0), window_prefix(closed_to + 1))
            if expire_to >= 0:  # the closed windows kept (keep_closed)
                store.delete_range(closed_prefix(0), closed_prefix(expire_to + 1))
        elif expire_to >= 0:
            store.delete_range(window_prefix(0), window_prefix(expire_to + 1))
        config.fence()  # a replaced driver's task must not commit a version
        store.commit(batch_id + 1)
    except BaseException:
        store.abort()
        raise
    _failpoint(config, partition, batch_id)
    return window_rows(spec, emitted, batch_id)


def _pane_windows(
    spec: Aggregation,
    store: Any,
    batch: dict[bytes, dict[str, Any]],
    keys: list[bytes],
    watermark_ms: int,
    previous_watermark_ms: int,
) -> dict[bytes, dict[str, Any]] | panes.Windows:
    """The windows a batch emits when state holds panes (riverbed.stream.panes), from
    the stored panes and the batch's merged ones (``batch``, under the sorted
    ``keys``): ``update``, every open window holding a pane the batch changed;
    ``final``, the windows the watermark closed in this batch — which ``keep_closed``
    keeps under their own keys (riverbed.state.keys.closed_window_key): a pane goes
    on taking events after some of its windows closed."""
    size = spec.window.size_ms  # type: ignore[union-attr]
    merge = values_merger(spec)
    closing: dict[bytes, dict[str, Any]] | panes.Windows = {}

    def unpacked(pairs: Iterable[tuple[bytes, bytes | None]]) -> dict[bytes, dict[str, Any]]:
        return {
            k: batch[k] if k in batch else msgpack.unpackb(blob, raw=False)
            for k, blob in pairs
            if blob is not None or k in batch
        }

    lo, closed_to = max(previous_watermark_ms - size + 1, 0), watermark_ms - size
    if watermark_ms > previous_watermark_ms and closed_to >= lo:
        # none of this batch's events is in a window its watermark closes (partials_of
        # leaves them out: late): their panes as stored before it
        first, end = window_prefix(lo), window_prefix(closed_to + size)
        held = {k: msgpack.unpackb(v, raw=False) for k, v in store.scan(start=first, end=end)}
        closing = panes.window_columns(spec, held, merge, lambda s: (s >= lo) & (s <= closed_to))
        if spec.keep_closed_ms > 0 and closing:
            made = closing.as_dict() if isinstance(closing, panes.Windows) else closing
            pack = msgpack.Packer(use_bin_type=True).pack
            store.put_many([(closed_window_key(k), pack(v)) for k, v in made.items()])
    if spec.output == "final":
        return closing
    open_from = watermark_ms - size + 1  # start + size > watermark
    wanted = panes.holding(spec, keys, open_from)
    needed = panes.panes_of(spec, wanted)
    held = unpacked(zip(needed, store.get_many(needed), strict=True))
    made = panes.windows(spec, held, merge, lambda starts: starts >= open_from)
    return {k: v for k, v in made.items() if k in wanted}


def _held_up_to(store: Any, keys: list[bytes]) -> int:
    """How many of ``keys`` (sorted) the store may hold: those up to the greatest key it
    holds in their range (one seek) — events in time order make most of a batch's
    windows new, and a lookup of each costs as much as the rest of its merge."""
    if not keys:
        return 0
    newest = store.last(keys[0], keys[-1] + b"\x00")
    return 0 if newest is None else bisect.bisect_right(keys, newest)


def grouped(partials: Iterable[Partial]) -> dict[bytes, list[dict[str, Any]]]:
    """Partials per (window, key), under their state keys (fixed windows), in the
    order given."""
    out: dict[bytes, list[dict[str, Any]]] = {}
    given = partials if isinstance(partials, list) else list(partials)
    starts = [start for start, _, _ in given]
    state_keys = window_keys(starts, [key.encode() for _, key, _ in given])
    for k, (_, _, partial) in zip(state_keys, given, strict=True):
        if k in out:
            out[k].append(partial)
        else:
            out[k] = [partial]
    return out


def combined(spec: Aggregation, partials: Iterable[Partial]) -> dict[bytes, dict[str, Any]]:
    """Partials merged per (window, key) into values as state keeps them, under their
    state keys (fixed windows)."""
    merge = values_merger(spec)
    return {k: merge(ps, None) for k, ps in grouped(partials).items()}


def _merge_sessions(
    spec: Aggregation,
    store: Any,
    watermark_ms: int,
    previous_watermark_ms: int,
    partials: Iterable[Partial],
) -> tuple[list[SessionRow], list[tuple[str, int]]]:
    """:func:`merge_partition` for session windows (riverbed.stream.sessions; the state
    layout: riverbed.state.keys): merge each key's new sessions into its stored ones,
    emit (``final``: the sessions the watermark closed; ``update``: the ones that
    changed, and the starts of the ones merged away), drop the expired. Returns the
    sessions to emit and the removed (key, start) pairs."""
    incoming: dict[str, list[sessions.Stored]] = {}
    settle = values_merger(spec)  # a partial as state keeps it
    for start, key, partial in partials:
        mine = dict(partial)
        end = int(mine.pop(sessions.END))
        incoming.setdefault(key, []).append((start, end, settle([mine], None)))

    def combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return settle([b], a)  # two sessions' values, in order, as one

    emitted: list[SessionRow] = []
    removed: list[tuple[str, int]] = []
    # each key's sessions as stored after this batch's merge, for the closing and
    # expiry below (nothing else writes a key between: the expiry writes it last)
    held: dict[bytes, list[Any]] = {}
    names = sorted(incoming)
    raw = [k.encode() for k in names]
    for key, user_key, blob in zip(
        names, raw, store.get_many([session_key(k) for k in raw]), strict=True
    ):
        stored = [(s, e, p) for s, e, p in msgpack.unpackb(blob, raw=False)] if blob else []
        merged = sessions.merge(stored, incoming[key], combine)
        for start, end in merged.gone:
            store.delete(session_end_key(end, start, user_key))
        for start, end, _ in merged.changed:
            store.put(session_end_key(end, start, user_key), b"")
        store.put(session_key(user_key), msgpack.packb(merged.sessions, use_bin_type=True))
        held[user_key] = merged.sessions
        if spec.output == "update":
            emitted += [(key, s, e, p) for s, e, p in merged.changed]
            removed += [(key, start) for start in merged.removed]

    def held_by(user_key: bytes) -> list[Any]:
        if user_key not in held:
            blob = store.get(session_key(user_key))
            held[user_key] = msgpack.unpackb(blob, raw=False) if blob else []
        return held[user_key]

    # sessions end before the watermark: closed (windows.late keeps later events out);
    # closed ones are kept keep_closed longer. Without keep_closed both are the index
    # entries before the watermark: one scan (the expiry's below left none earlier)
    final = spec.output == "final" and watermark_ms > previous_watermark_ms
    expire = watermark_ms - spec.keep_closed_ms
    if spec.keep_closed_ms == 0:
        ending = _ending(store, *session_ends(0, watermark_ms))
        closing = ending if final else {}
    else:
        closing = {}
        if final:
            closing = _ending(store, *session_ends(previous_watermark_ms, watermark_ms))
        ending = _ending(store, *session_ends(0, expire))
    for user_key, entries in closing.items():
        starts = {start for end, start in entries if end >= previous_watermark_ms}
        if starts:
            emitted += [
                (user_key.decode(), s, e, p) for s, e, p in held_by(user_key) if s in starts
            ]
    for user_key in ending:
        kept = [s for s in held_by(user_key) if s[1] >= expire]
        if kept:
            store.put(session_key(user_key), msgpack.packb(kept, use_bin_type=True))
        else:
            store.delete(session_key(user_key))
    store.delete_range(*session_ends(0, expire))
    return emitted, removed


def _ending(store: Any, lo: bytes, hi: bytes) -> dict[bytes, list[tuple[int, int]]]:
    """Per key, the (end, start) of its sessions whose index entries are in ``[lo,
    hi)``."""
    found: dict[bytes, list[tuple[int, int]]] = {}
    for k, _ in store.scan(start=lo, end=hi):
        end, start, user_key = split_session_end_key(k)
        if user_key in found:
            found[user_key].append((end, start))
        else:
            found[user_key] = [(end, start)]
    return found


def merger(
    config: EngineConfig, batch_id: int, watermark_ms: int, previous_watermark_ms: int
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """``applyInPandas`` step: one call per state partition (a heartbeat row makes sure
    every partition gets one)."""

    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        rows = pdf.loc[pdf["key"].notna(), ["window_start", "key", "partials"]]
        partials = (
            (int(start), key, msgpack.unpackb(blob, raw=False))
            for start, key, blob in rows.itertuples(index=False)
        )
        partition = int(pdf["state_partition"].iloc[0])
        return merge_partition(
            config, partition, batch_id, watermark_ms, previous_watermark_ms, partials
        )

    return run
