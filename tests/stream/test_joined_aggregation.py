"""An aggregation over a join's rows in the join's own driver (riverbed.stream.
joinedagg): orders joined with their payments, then the paid amount per amount band and
half hour of the order — restarted between backlogs, on the driver's threads and as
Spark jobs; the results equal pandas' batch join and group-by of the events read back."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from riverbed.stream import Aggregation, Count, Joined, Sum, Tumbling
from riverbed.stream.batchlog import open_batches
from riverbed.stream.chain import upstream_range
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.doors import Topic
from riverbed.stream.errors import StreamValueError
from riverbed.stream.joinquery import read_joined
from riverbed.stream.joins import Join
from tests.stream.conftest import T0
from tests.stream.test_stream_join import (
    ORDERS,
    PAYMENTS,
    oracle,
    orders_and_payments,
    send,
)

pytestmark = pytest.mark.spark


def paid_join(jobs: dict[str, str]) -> Join:
    return Join(
        name="paid", left=Topic("orders", options={"schema": ORDERS, **jobs}),
        right=Topic("payments", options={"schema": PAYMENTS, **jobs}),
        on="order_id", time="ts", how="left", within=("10m", "1h"), watermark="2h",
        state_partitions=3,
    )  # fmt: skip


def banded() -> Aggregation:
    """Per band of the order's amount and quarter hour of its time: what was paid, and
    the joined rows (an unpaid order's row too: a left join's)."""
    return Aggregation(
        name="paid_by_band", key="band", time="ts", window=Tumbling("15m"), watermark="2h",
        columns={"band": "CAST(amount AS BIGINT) % 5"}, output="final",
        metrics={"paid": Sum("paid"), "rows": Count()}, state_partitions=2,
    )  # fmt: skip


def drain(spark: Any, tmp_path: Path, log_url: str, jobs: dict[str, str]) -> Any:
    query = start(
        spark, banded(), Joined(paid_join(jobs)), checkpoint=tmp_path / "cp",
        output=tmp_path / "out", log_url=log_url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination()
    return query


def expected(orders: pd.DataFrame, payments: pd.DataFrame) -> pd.DataFrame:
    rows = oracle(paid_join({}), orders, payments)
    rows = rows.assign(
        band=(rows["amount"].astype("int64") % 5).astype(str),
        window_start=rows["ts"].dt.floor("15min"),
    )
    out = rows.groupby(["window_start", "band"]).agg(
        paid=("paid", lambda s: s.sum(min_count=1)), rows=("order_id", "size")
    )
    return out.reset_index().sort_values(["window_start", "band"]).reset_index(drop=True)


@pytest.mark.parametrize("in_driver", [True, False])
def test_an_aggregation_over_a_join_in_one_driver_equals_the_batch_join_and_group_by(
    spark: Any, tmp_path: Path, in_driver: bool
) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    jobs = {} if in_driver else {"driverBatchRecords": "0"}
    orders, payments = orders_and_payments(600, seed=5)
    cuts = [0, 200, 400, 600]
    for a, b in itertools.pairwise(cuts):  # a backlog, a start for each
        send(log_url, "orders", orders.iloc[a:b], 3)
        lo, hi = orders["ts"].iloc[a], orders["ts"].iloc[b - 1]
        upto = payments["ts"] <= hi
        since = payments["ts"] > lo if a else True
        send(log_url, "payments", payments[since & upto], 2)
        query = drain(spark, tmp_path, log_url, jobs)
        ran = len(spark.sparkContext.statusTracker().getJobIdsForGroup(query._group))
        assert (ran == 0) == in_driver
    # far-later events on both sides: every order's interval and window closes
    rest = payments[payments["ts"] > orders["ts"].iloc[-1]]
    late = pd.DataFrame({"order_id": [10**6], "amount": [0.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "payments", pd.concat([rest, late.rename(columns={"amount": "paid"})]), 2)
    send(log_url, "orders", late, 3)
    drain(spark, tmp_path, log_url, jobs)

    want = expected(orders, payments)
    got = read_results(tmp_path / "out")
    got = got[got["window_start"] < T0 + pd.Timedelta("3d")].reset_index(drop=True)
    assert len(want) > 30
    assert got["key"].tolist() == want["band"].tolist()
    assert got["window_start"].tolist() == want["window_start"].tolist()
    assert got["rows"].tolist() == want["rows"].tolist()
    np.testing.assert_allclose(got["paid"].astype(float), want["paid"].astype(float))
    # the join's rows are kept inside the aggregation's checkpoint, each once
    joined = read_joined(tmp_path / "cp" / "join-rows")
    assert len(joined[joined["order_id"] < 10**6]) == int(want["rows"].sum())
    # the aggregation's batches read every finished join batch once, in order
    aggregated = open_batches(tmp_path / "cp")
    ranges = [upstream_range(aggregated.get(i))[1:] for i in aggregated.ids()]
    assert all(r[1] >= r[0] for r in ranges)
    assert [r[0] for r in ranges[1:]] == [r[1] for r in ranges[:-1]]
    join_batches = open_batches(tmp_path / "cp" / "join")
    assert ranges[-1][1] == join_batches.ids()[-1] + 1
    newest = aggregated.get(aggregated.ids()[-1])
    assert newest.done and newest.totals["late"] == 0 and newest.totals["malformed"] == 0


def test_an_aggregation_over_a_join_refuses_what_cannot_run(spark: Any, tmp_path: Path) -> None:
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(20, seed=1)
    send(log_url, "orders", orders, 3)
    send(log_url, "payments", payments, 2)
    join = paid_join({})

    def begin(spec: Aggregation, source: Any) -> None:
        start(
            spark, spec, source, checkpoint=tmp_path / "cp", output=tmp_path / "out",
            log_url=log_url, trigger={"availableNow": True},
        ).awaitTermination()  # fmt: skip

    spec = banded()
    with pytest.raises(StreamValueError, match=r"reads column\(s\) \['tip'\].*order_id"):
        begin(Aggregation(**{**_fields(spec), "metrics": {"t": Sum("tip")}}), Joined(join))
    with pytest.raises(StreamValueError, match="leave topic out"):
        begin(spec, Joined(Join(**{**_fields(join), "topic": "rows"})))
    with pytest.raises(StreamValueError, match="Joined takes a Join"):
        begin(spec, Joined("paid"))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def _fields(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def test_a_failed_aggregation_batch_stops_the_query_and_the_restart_finishes_it_once(
    spark: Any, tmp_path: Path
) -> None:
    """An aggregation batch that fails (its output's directory is a file) stops the
    query with its error — nothing hidden, the join not run on without it — and the
    next start runs it again, every result once."""
    log_url = f"file://{tmp_path / 'log'}"
    orders, payments = orders_and_payments(400, seed=8)
    late = pd.DataFrame({"order_id": [10**6], "amount": [0.0], "ts": [T0 + pd.Timedelta("3d")]})
    send(log_url, "orders", pd.concat([orders, late]), 3)
    send(log_url, "payments", pd.concat([payments, late.rename(columns={"amount": "paid"})]), 2)
    blocked = tmp_path / "out" / "batch_id=2"  # a file where the batch's directory goes
    blocked.parent.mkdir(parents=True)
    blocked.write_text("in the way")

    def run() -> Any:
        query = start(
            spark, banded(), Joined(paid_join({}), max_records=60), checkpoint=tmp_path / "cp",
            output=tmp_path / "out", log_url=log_url, trigger={"availableNow": True},
        )  # fmt: skip
        assert query.wait(300)
        return query

    failed = run()
    assert "batch_id=2" in str(failed.exception())
    aggregated = open_batches(tmp_path / "cp")
    assert aggregated.ids()[-1] == 2 and not aggregated.get(2).done
    join_batches = open_batches(tmp_path / "cp" / "join")
    # the join stopped at the batches the failed one reads, not run on to its end
    assert join_batches.ids()[-1] < upstream_range(aggregated.get(2))[2]
    blocked.unlink()
    assert run().exception() is None

    want = expected(orders, payments)
    got = read_results(tmp_path / "out")
    got = got[got["window_start"] < T0 + pd.Timedelta("3d")].reset_index(drop=True)
    assert len(want) > 20 and got["rows"].tolist() == want["rows"].tolist()
    assert got["key"].tolist() == want["band"].tolist()
    np.testing.assert_allclose(got["paid"].astype(float), want["paid"].astype(float))
