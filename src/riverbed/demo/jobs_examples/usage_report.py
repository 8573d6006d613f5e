"""The usage report: totals per week and the top customers (one chunk for all days)."""

from __future__ import annotations

import pandas as pd

from riverbed.jobs import Dependency, Job
from riverbed.jobs.context import Context


def main(ctx: Context, work_ids: list[int]) -> None:
    first, last = min(work_ids), max(work_ids)
    weeks = [
        pd.read_parquet(path)
        for path in ctx.published_files("customer_features", "week=*.parquet").values()
    ]
    features = pd.concat(weeks)
    features = features[(features.first_day >= first) & (features.last_day <= last)]
    per_customer = features.groupby("customer")["units"].sum().sort_values(ascending=False)
    report = {
        "days": [first, last],
        "customers": int(per_customer.size),
        "units": int(per_customer.sum()),
        "weeks": [
            {"first_day": int(f), "units": int(u)}
            for f, u in features.groupby("first_day")["units"].sum().items()
        ],
        "top": [{"customer": c, "units": int(u)} for c, u in per_customer.head(5).items()],
    }
    ctx.output.write_json("report.json", report)


job = Job(main=main, dependencies=[Dependency("customer_features", max_lag="1h")])
