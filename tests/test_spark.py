"""riverbed.spark builds working sessions; workers run this interpreter."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_local_job_runs_on_python_workers_with_riverbed_importable(spark: Any) -> None:
    def probe(rows: Any) -> Any:
        import sys as worker_sys

        import riverbed

        for row in rows:
            yield (row.id % 3, worker_sys.executable, riverbed.__version__)

    df = spark.range(0, 1000, numPartitions=4)
    out = df.rdd.mapPartitions(probe).toDF(["bucket", "python", "version"])
    counts = {r["bucket"]: r["count"] for r in out.groupBy("bucket").count().collect()}
    assert counts == {0: 334, 1: 333, 2: 333}
    pythons = {r["python"] for r in out.select("python").distinct().collect()}
    assert pythons == {sys.executable}


def test_session_settings(spark: Any) -> None:
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.master == "local[2,2]"
