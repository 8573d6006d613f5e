"""``keep_closed``: a closed window or session stays in state that long past the
watermark (``read_live`` answers it), is emitted once (``output="final"``), and is
dropped after — one state partition's merges, batch by batch, without Spark."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from riverbed.state import StateConfig, StateProvider
from riverbed.stream import Aggregation, Count, Session, Sum, Tumbling
from riverbed.stream.engine import EngineConfig, merge_partition, partials_of
from riverbed.stream.rows import rows_from_state

S = 1000  # ms


def _run(spec: Aggregation, tmp_path: Path, batches: list[tuple[list[tuple[str, int]], int]]):
    """Each batch's (key, event ms) events merged at its watermark; per batch, the rows
    it emitted and the rows its committed state holds, as (key, start s, end s, count)."""
    cfg = EngineConfig(
        spec, StateConfig(local_dir=tmp_path / "l", durable=tmp_path / "d"),
        str(tmp_path / "cp"), str(tmp_path / "out"),
    )  # fmt: skip
    previous, out = 0, []
    for batch_id, (events, watermark) in enumerate(batches):
        pdf = pd.DataFrame(
            {
                "user": pd.Series([k for k, _ in events], dtype="string"),
                "ts": pd.to_datetime([t for _, t in events], unit="ms", utc=True),
                "amount": [1.0] * len(events),
            }
        )
        emitted = merge_partition(
            cfg, 0, batch_id, watermark, previous, partials_of(spec, pdf, previous)
        )
        store = StateProvider(cfg.state).load(cfg.namespace, 0, version=batch_id + 1)
        try:
            held = rows_from_state(spec, dict(store.scan()), batch_id)
        finally:
            store.abort()
        out.append((_tuples(emitted), _tuples(held)))
        previous = watermark
    return out


def _tuples(rows: pd.DataFrame) -> list[tuple[str, int, int, int]]:
    if "deleted" in rows:
        rows = rows[~rows["deleted"].fillna(False).astype(bool)]
    epoch = pd.Timestamp(0, tz="UTC")
    starts = (pd.to_datetime(rows["window_start"], utc=True) - epoch) // pd.Timedelta("1s")
    ends = (pd.to_datetime(rows["window_end"], utc=True) - epoch) // pd.Timedelta("1s")
    return sorted(
        zip(
            rows["key"], starts.tolist(), ends.tolist(), rows["n"].astype(int).tolist(), strict=True
        )
    )


def test_a_closed_session_is_emitted_once_kept_for_keep_closed_then_dropped(tmp_path):
    spec = Aggregation(
        name="sess", key="user", time="ts", window=Session("10s"), watermark="0s",
        output="final", keep_closed="30s", metrics={"n": Count(), "spent": Sum("amount")},
    )  # fmt: skip
    a1, b = ("a", 1000, 1015, 2), ("b", 1100, 1110, 1)
    a2 = ("a", 1030, 1040, 1)
    got = _run(
        spec,
        tmp_path,
        [
            ([("a", 1000 * S), ("a", 1005 * S), ("b", 1100 * S)], 0),
            ([], 1020 * S),  # a1 ends at 1015: closed, kept until the watermark passes 1045
            ([("a", 1030 * S)], 1040 * S),  # a2 opens (it ends at 1040: not closed yet)
            ([], 1045 * S),  # a2 closed; a1 kept to the last ms
            ([], 1046 * S),  # a1 dropped, a2 kept: one key, its two sessions apart
            ([], 1200 * S),  # b closed and past keep_closed in the same batch; a2 dropped
        ],
    )
    assert got == [
        ([], [a1, b]),
        ([a1], [a1, b]),
        ([], [a1, a2, b]),
        ([a2], [a1, a2, b]),
        ([], [a2, b]),
        ([b], []),
    ]


def test_a_closed_window_is_emitted_once_kept_for_keep_closed_then_dropped(tmp_path):
    spec = Aggregation(
        name="tumble", key="user", time="ts", window=Tumbling("10s"), watermark="0s",
        output="final", keep_closed="20s", metrics={"n": Count()},
    )  # fmt: skip
    w1, w2 = ("a", 1000, 1010, 2), ("b", 1020, 1030, 1)
    got = _run(
        spec,
        tmp_path,
        [
            ([("a", 1001 * S), ("a", 1009 * S), ("b", 1025 * S)], 0),
            ([], 1010 * S),  # [1000, 1010) closed: emitted, kept until 1030
            ([], 1029 * S),
            ([], 1030 * S),  # [1000, 1010) dropped; [1020, 1030) closed
            ([], 1050 * S),  # [1020, 1030) dropped
        ],
    )
    assert got == [([], [w1, w2]), ([w1], [w1, w2]), ([], [w1, w2]), ([w2], [w2]), ([], [])]
