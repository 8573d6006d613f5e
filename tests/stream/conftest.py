from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import riverbed.log

T0 = datetime(2026, 11, 21, tzinfo=UTC)


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
