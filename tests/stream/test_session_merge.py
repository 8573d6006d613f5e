"""Session windows merged into state batch by batch (riverbed.stream.engine's
``_merge_sessions`` over RocksDB) equal the sessions of every on-time event so far, for
any events, watermarks, outputs and ``keep_closed``: ``final`` emits each closed session
once, ``update`` rows and tombstones applied in order give the current sessions, and the
state holds the sessions not yet expired — one state partition's merges, without
Spark."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.state import StateConfig, StateProvider
from riverbed.stream import Aggregation, Count, Session, Sum
from riverbed.stream.engine import EngineConfig, merge_partition, partials_of
from riverbed.stream.rows import rows_from_state
from tests.stream.conftest import batches_of_events, events_frame

S = 1000  # ms
T0 = 1_000_000 * S
GAP = 10 * S

Row = tuple[str, int, int, int, float]  # key, start, end (ms), count, sum


def sessions_of(events: list[tuple[str, int, int]]) -> set[Row]:
    """The model: per key, the maximal runs of events each at most the gap after the
    one before — ``[first, last + gap]``."""
    out: set[Row] = set()
    for key in {k for k, _, _ in events}:
        mine = sorted((t, a) for k, t, a in events if k == key)
        run = [mine[0]]
        for t, a in mine[1:]:
            if t - run[-1][0] > GAP:
                out.add(_row(key, run))
                run = []
            run.append((t, a))
        out.add(_row(key, run))
    return out


def _row(key: str, run: list[tuple[int, int]]) -> Row:
    return (key, run[0][0], run[-1][0] + GAP, len(run), float(sum(a for _, a in run)))


def _rows(frame: pd.DataFrame) -> list[tuple[Row, bool]]:
    out = []
    for r in frame.to_dict("records"):
        deleted = bool(r.get("deleted", False))
        start = int(r["window_start"].value // 1_000_000)
        end = 0 if deleted else int(r["window_end"].value // 1_000_000)
        n = 0 if deleted else int(r["n"])
        spent = 0.0 if deleted else float(r["spent"])
        out.append(((r["key"], start, end, n, spent), deleted))
    return out


@settings(max_examples=100, deadline=None)
@given(
    # each batch moves the watermark 0-30 s
    batches=batches_of_events(st.integers(0, 30), max_batches=8),
    output=st.sampled_from(["final", "update"]),
    keep_closed=st.sampled_from(["0s", "7s", "30s"]),
)
def test_merged_sessions_are_the_sessions_of_every_on_time_event(
    batches: list[tuple[list[tuple[str, int, int]], int]], output: str, keep_closed: str
) -> None:
    spec = Aggregation(
        name="visits", key="user", time="ts", window=Session("10s"), watermark="0s",
        output=output, keep_closed=keep_closed,
        metrics={"n": Count(), "spent": Sum("amount")},
    )  # fmt: skip
    keep_ms = spec.keep_closed_ms
    on_time: list[tuple[str, int, int]] = []
    emitted: list[Row] = []
    table: dict[tuple[str, int], Row] = {}
    previous = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = EngineConfig(
            spec, StateConfig(local_dir=root / "l", durable=root / "d"),
            str(root / "cp"), str(root / "out"),
        )  # fmt: skip
        for batch_id, (events, advance_s) in enumerate(batches):
            watermark = max(previous, T0) + advance_s * S
            stamped = [(k, T0 + t * S, a) for k, t, a in events]
            pdf = events_frame(stamped)
            on_time += [e for e in stamped if e[1] >= watermark]  # windows.late
            rows = merge_partition(
                cfg, 0, batch_id, watermark, previous, partials_of(spec, pdf, watermark)
            )
            for row, deleted in _rows(rows):
                if deleted:
                    del table[row[:2]]
                else:
                    emitted.append(row)
                    table[row[:2]] = row
            truth = sessions_of(on_time) if on_time else set()
            store = StateProvider(cfg.state).load(cfg.namespace, 0, version=batch_id + 1)
            try:
                held = _rows(rows_from_state(spec, dict(store.scan()), batch_id))
            finally:
                store.abort()
            # state: every session not yet expired (closed longer than keep_closed)
            assert {r for r, _ in held} == {r for r in truth if r[2] >= watermark - keep_ms}
            if output == "final":  # each closed session once, when closed
                assert sorted(emitted) == sorted(r for r in truth if r[2] < watermark)
            else:  # the rows and tombstones so far: the current sessions
                assert set(table.values()) == truth
            previous = watermark
