"""A pandas oracle of a time-range job's per-row metrics (tests and the demo check by it).

It is written from pandas' own window functions, independently of the Spark code:
``rolling(W, on=time)`` for time windows, ``rolling(N)`` on the (time, other columns)
order for row windows, ``expanding()`` for cumulative values. Rows at the same instant
see each other in riverbed (SQL's RANGE frame), while pandas gives the full value only to
the last of them; the oracle copies that last value to its peers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from riverbed.timerange.spec import Custom, TimeRangeSpec

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["pandas_rows"]

_PANDAS = {"stddev": "std"}  # every other aggregate has its own name in pandas


def pandas_rows(job: TimeRangeSpec, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (the input rows of the whole range) with the job's metric columns."""
    import pandas as pd

    keys = list(job.keys)
    others = sorted(c for c in frame.columns if c not in keys and c != job.time)
    df = frame.sort_values([*keys, job.time, *others], na_position="first", kind="stable")
    parts = [_one_key(job, g.reset_index(drop=True)) for _, g in df.groupby(keys, sort=True)]
    if not parts:
        names = [n for m in job.metrics if not isinstance(m, Custom) for _, n in m.names()]
        return df.reset_index(drop=True).assign(**dict.fromkeys(names, float("nan")))
    return pd.concat(parts, ignore_index=True)


def _one_key(job: TimeRangeSpec, g: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    t = g[job.time]
    for r in job.rolling:
        window = g.rolling(
            pd.Timedelta(microseconds=r.window_us), on=job.time, min_periods=r.min_periods
        )[r.column]
        for agg, name in r.names():
            g[name] = getattr(window, _PANDAS.get(agg, agg))().to_numpy()
            g[name] = g.groupby(t, sort=False)[name].transform("last")
    for rw in job.rows:
        periods = rw.n if rw.min_periods is None else rw.min_periods
        window = g[rw.column].rolling(rw.n, min_periods=periods)
        for agg, name in rw.names():
            g[name] = getattr(window, _PANDAS.get(agg, agg))().to_numpy()
    for c in job.cumulative:
        for agg, name in c.names():
            window = g[c.column].expanding(min_periods=1)
            g[name] = getattr(window, _PANDAS.get(agg, agg))().to_numpy()
            g[name] = g.groupby(t, sort=False)[name].transform("last")
    return g
