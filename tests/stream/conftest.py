from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import strategies as st

import riverbed.log

T0 = datetime(2026, 11, 21, tzinfo=UTC)

Event = tuple[str, int, int]  # key, time (s), amount: one partition's merges (test_panes...)


def batches_of_events(
    watermark: st.SearchStrategy[int], max_batches: int
) -> st.SearchStrategy[list[tuple[list[Event], int]]]:
    """Batches of a few events of keys ``a``-``c`` in 0-120 s, each batch with a
    watermark drawn from ``watermark`` (what it means is the test's)."""
    events = st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 120), st.integers(0, 9)), max_size=12
    )
    return st.lists(st.tuples(events, watermark), min_size=1, max_size=max_batches)


def events_frame(events: list[Event]) -> pd.DataFrame:
    """(key, time in ms, amount) events as the engine reads them: ``user``, ``ts``,
    ``amount``."""
    return pd.DataFrame(
        {
            "user": pd.Series([k for k, _, _ in events], dtype="string"),
            "ts": pd.to_datetime([t for _, t, _ in events], unit="ms", utc=True),
            "amount": pd.Series([a for _, _, a in events], dtype="float64"),
        }
    )


def make_events(n: int, hours: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ts = T0 + pd.to_timedelta(np.sort(rng.integers(0, hours * 3_600_000, n)), unit="ms")
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, 400, n),
            "flag": [f"f{i}" for i in rng.zipf(1.6, n) % 7],
            "amount": rng.integers(1, 100, n).astype(float),
            "ts": ts,
        }
    )


def hourly(events: pd.DataFrame) -> pd.DataFrame:
    """The oracle of an hourly aggregation of :func:`make_events`' events by flag, every
    metric the tests use, indexed by (window_start, key)."""
    events = events.assign(window_start=events["ts"].dt.floor("1h"))
    got = events.groupby(["window_start", "flag"]).agg(
        events=("user_id", "size"),
        users=("user_id", "nunique"),
        spent=("amount", "sum"),
        total=("amount", "sum"),
        top=("amount", "max"),
    )
    return got.rename_axis(["window_start", "key"]).sort_index()


def write_events(
    url: str, events: pd.DataFrame, partitions: int = 3, key_field: str = "flag"
) -> None:
    log = riverbed.log.open(url)
    if "events" not in log.topics():
        log.create_topic("events", partitions)
    log.producer("events").send_batch(
        [
            {"user_id": int(u), "flag": f, "amount": a, "ts": t.isoformat()}
            for u, f, a, t in events[["user_id", "flag", "amount", "ts"]].itertuples(index=False)
        ],
        key_field=key_field,
    )
    log.close()


@pytest.fixture
def log_url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'log'}"
