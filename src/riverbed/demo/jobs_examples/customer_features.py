"""Per-customer features over a week of daily usage (plain Python, pandas).

Depends on ``usage_daily`` for the same days; with ``max_lag="1h"`` a day whose daily
usage succeeded within the hour is not recomputed.
"""

from __future__ import annotations

import pandas as pd

from riverbed.jobs import Dependency, Job
from riverbed.jobs.context import Context


def main(ctx: Context, work_ids: list[int]) -> None:
    frames = []
    for day in work_ids:
        path = ctx.published("usage_daily", f"day={day}.parquet")
        if path is None:
            raise FileNotFoundError(f"usage_daily has not published day {day}")
        frames.append(pd.read_parquet(path))
    daily = pd.concat(frames)
    features = (
        daily.groupby("customer")
        .agg(
            units=("units", "sum"),
            events=("events", "sum"),
            active_days=("day", "nunique"),
            peak_day_units=("units", "max"),
        )
        .reset_index()
    )
    features["first_day"] = min(work_ids)
    features["last_day"] = max(work_ids)
    ctx.output.write_parquet(f"week={min(work_ids)}.parquet", features)


job = Job(
    main=main,
    chunk_size=7,
    dependencies=[Dependency("usage_daily", max_lag="1h")],
    retries=1,
)
