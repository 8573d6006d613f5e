"""A hopping or sliding window's state held as panes (riverbed.stream.panes) gives
exactly what state held as windows gives: batch by batch, the rows emitted and the
rows its state answers (``read_live``), for any events, watermarks, outputs and
``keep_closed`` — one state partition's merges, without Spark."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.state import StateConfig, StateProvider
from riverbed.stream import Aggregation, Count, Distinct, Hopping, Max, Sliding, Sum, Tumbling
from riverbed.stream.engine import EngineConfig, merge_partition, partials_of
from riverbed.stream.rows import rows_from_state
from tests.stream.conftest import batches_of_events, events_frame

S = 1000  # ms
T0 = 1_000_000 * S


def _run(spec: Aggregation, root: Path, batches: list[tuple[list[tuple[str, int, int]], int]]):
    """Each batch's (key, event s, amount) events at its watermark (s), as the engine
    runs them (partials at the batch's watermark); per batch, the rows it emitted and
    the rows its committed state answers."""
    cfg = EngineConfig(
        spec, StateConfig(local_dir=root / "l", durable=root / "d"),
        str(root / "cp"), str(root / "out"),
    )  # fmt: skip
    previous, out = 0, []
    for batch_id, (events, watermark_s) in enumerate(batches):
        watermark = max(previous, T0 + watermark_s * S)
        pdf = events_frame([(k, T0 + t * S, a) for k, t, a in events])
        partials = partials_of(spec, pdf, watermark)
        emitted = merge_partition(cfg, 0, batch_id, watermark, previous, partials)
        store = StateProvider(cfg.state).load(cfg.namespace, 0, version=batch_id + 1)
        try:
            held = rows_from_state(spec, dict(store.scan()), batch_id, watermark)
        finally:
            store.abort()
        out.append((_rows(emitted), _rows(held)))
        previous = watermark
    return out


def _rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    columns = ["key", "window_start", "window_end", "n", "spent", "top", "users"]
    columns = [c for c in columns if c in frame.columns]
    return sorted(frame[columns].itertuples(index=False, name=None))


EVERY = {  # a window's value merged metric by metric (panes.windows)
    "n": Count(), "spent": Sum("amount"), "top": Max("amount"),
    "users": Distinct("amount", mode="exact"),
}  # fmt: skip
REDUCED = {"n": Count(), "top": Max("amount")}  # in numpy (panes._reduced)


@settings(max_examples=80, deadline=None)
@given(
    batches=batches_of_events(st.integers(0, 140), max_batches=6),
    window=st.sampled_from([Hopping("20s", "5s"), Hopping("10s", "5s"), Sliding("30s", "10s")]),
    output=st.sampled_from(["final", "update"]),
    keep_closed=st.sampled_from(["0s", "7s", "30s"]),
    metrics=st.sampled_from([EVERY, REDUCED]),
)
def test_panes_emit_and_hold_what_windows_do(
    batches: list[tuple[list[tuple[str, int, int]], int]],
    window: Any,
    output: str,
    keep_closed: str,
    metrics: dict[str, Any],
) -> None:
    spec = Aggregation(
        name="hops", key="user", time="ts", window=window, watermark="0s", output=output,
        keep_closed=keep_closed, metrics=metrics,
    )  # fmt: skip
    got = {}
    for layout in ("panes", "windows"):
        with tempfile.TemporaryDirectory() as tmp:
            laid = dataclasses.replace(spec, state_layout=layout)
            got[layout] = _run(laid, Path(tmp), batches)
    assert got["panes"] == got["windows"]


def test_a_closed_window_of_panes_is_kept_as_emitted_then_dropped(tmp_path: Path) -> None:
    """The worked case: an event in a pane after one of the pane's windows closed
    counts in the open ones only — the closed one is held as it was emitted."""
    spec = Aggregation(
        name="hops", key="user", time="ts", window=Hopping("10s", "5s"), watermark="0s",
        output="final", keep_closed="10s", metrics=EVERY,
    )  # fmt: skip
    got = _run(
        spec,
        tmp_path,
        [
            ([("a", 1, 1), ("a", 7, 2), ("b", 12, 3)], 0),
            ([], 10),  # [-5, 5) and [0, 10) closed
            ([("a", 13, 4)], 15),  # [5, 15) closed: a's event at 13 is late for it
            ([], 30),
        ],
    )

    def row(key: str, start: int, n: int, spent: float, top: float) -> tuple[Any, ...]:
        at = pd.Timestamp(T0 + start * S, unit="ms", tz="UTC")
        return (key, at, at + pd.Timedelta(seconds=10), n, spent, top, n)

    a0, a5, a10 = row("a", 0, 2, 3.0, 2.0), row("a", 5, 1, 2.0, 2.0), row("a", 10, 1, 4.0, 4.0)
    b5, b10 = row("b", 5, 1, 3.0, 3.0), row("b", 10, 1, 3.0, 3.0)
    am5 = row("a", -5, 1, 1.0, 1.0)
    assert got == [
        ([], sorted([am5, a0, a5, b5, b10])),
        (sorted([am5, a0]), sorted([am5, a0, a5, b5, b10])),
        (sorted([a5, b5]), sorted([a0, a5, b5, a10, b10])),
        (sorted([a10, b10]), []),
    ]


def test_the_layout_is_the_checkpoints_and_not_part_of_the_specs_identity() -> None:
    """A shape records panes (format 2: a riverbed before panes refuses it) and not
    windows (as an older riverbed wrote it); a new version of an aggregation is the same
    spec under either layout."""
    from riverbed.stream.changes import shape, shape_hash
    from riverbed.stream.versions import _spec_hash

    spec = Aggregation(
        name="hops", key="user", time="ts", window=Hopping("20s", "5s"), metrics={"n": Count()}
    )
    panes, windows = (
        shape(dataclasses.replace(spec, state_layout=x)) for x in ("panes", "windows")
    )
    assert panes["state_layout"] == "panes" and panes["version"] == 2
    assert "state_layout" not in windows and windows["version"] == 1
    assert shape_hash(panes) != shape_hash(windows)
    assert _spec_hash(panes, "hops") == _spec_hash(windows, "hops")
    tumbling = shape(dataclasses.replace(spec, window=Tumbling("5s")))
    assert "state_layout" not in tumbling and tumbling["version"] == 1
