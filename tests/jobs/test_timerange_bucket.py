"""A time-range job whose output is in a bucket (the tests' Ceph RGW): a driver that
knows nothing of the first one's run resumes from the bucket — carried state included —
and the result equals one pass; then status and reset, as a user runs them.

(SIGKILL at random points and the SIGSTOPped zombie run on a local output in
test_timerange_processes.py; the bucket changes only where the files go, which
test_timerange_output.py holds to one contract on disk, memory and the bucket.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from riverbed.control import connect
from riverbed.jobs.timerange import Driver, ParquetInput, load_spec
from riverbed.parquetbytes import read_parquet_bytes
from riverbed.storage import open_store
from riverbed.tables import PARTITION, partition_table
from riverbed.timerange.compute import one_pass
from riverbed.timerange.errors import MissingInputError, SpecError
from riverbed.timerange.plan import parse_time
from tests.jobs.test_timerange_processes import setup, spec_text
from tests.jobs.test_timerange_spark import assert_same

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]

__all__ = ["setup"]  # the fixture, shared with the on-disk process tests

CHUNKS = 6  # 30-minute chunks: the first three hours of the fixture's input


def test_a_job_in_a_bucket_resumes_elsewhere_from_the_bucket_and_equals_one_pass(
    setup: dict[str, Any], s3_url: str, spark: Any
) -> None:
    s = setup
    # no output= in the spec: it follows the checkpoints into the bucket; its datasets
    # are published to tables in the bucket too
    tables = {
        "rows": f"delta:{s3_url}/lake",
        "windows_30m": f"iceberg:sqlite:///{s['tmp'] / 'catalog.db'}#rb.w@{s3_url}/warehouse",
    }
    s["spec"].write_text(spec_text(str(s["tmp"] / "in"), "", tables))
    cp = connect(s["env"]["RIVERBED_CONTROL"])
    end = "2026-01-01T03:00"
    first = Driver(load_spec(s["spec"], s3_url), cp, lambda: spark, ttl=5)
    assert first.output.location == f"{s3_url}/output/sensors"
    first.run("2026-01-01", "2026-01-01T01:00")  # two chunks, then this "machine" is gone
    assert not list(s["tmp"].glob("**/chunk=*")), "the output was meant to be in the bucket"

    # Another driver: a new spec load, a new client, nothing of the first's in memory.
    second = Driver(load_spec(s["spec"], s3_url), cp, lambda: spark, ttl=5)
    progress = second.run("2026-01-01", end)
    assert progress.done == CHUNKS

    store = open_store(f"{s3_url}/output/sensors")
    parts = [i.key for i in store.list("rows/")]
    assert len(parts) == CHUNKS and all(k.endswith("/part.parquet") for k in parts)
    assert store.list("_riverbed/staging/") == []
    got = pd.concat(read_parquet_bytes(store.get(k)).to_pandas() for k in parts)
    whole = one_pass(spark, second.job, parse_time("2026-01-01"), parse_time(end))
    assert whole.rows is not None
    assert_same(got, whole.rows.toPandas(), exact=True)  # cumulative values carried over
    published = [kv.version for kv in cp.get_prefix(b"riverbed/timerange/sensors/chunks/")]
    assert published == [1] * CHUNKS, "a chunk was published more than once"
    lake = partition_table(tables["rows"], "sensors")
    assert_same(lake.read().to_pandas().drop(columns=PARTITION), got, exact=True)
    windows = partition_table(tables["windows_30m"], "sensors").read()
    assert windows.num_rows == sum(
        read_parquet_bytes(store.get(i.key)).num_rows for i in store.list("windows_30m/")
    )

    env = {**s["env"], **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "riverbed.cli.main", "timerange", *args],
            env=env,
            cwd=s["tmp"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert secret not in done.stdout + done.stderr
        return done

    info = json.loads(cli("status", str(s["spec"]), "--json", "--checkpoints", s3_url).stdout)
    assert (info["chunks_done"], info["rows"], info["output"]) == (
        CHUNKS,
        len(got),
        f"{s3_url}/output/sensors",
    )
    reset = cli("reset", str(s["spec"]), "--output", "--checkpoints", s3_url)
    assert f"{s3_url}/output/sensors deleted and 2 table(s) dropped" in reset.stdout
    assert store.list("") == [] and open_store(f"{s3_url}/lake").list("") == []


def test_a_job_reads_its_hourly_input_from_the_bucket_through_s3a(
    setup: dict[str, Any], s3_url: str, spark: Any
) -> None:
    """``ParquetInput("s3://…", partition="hour")``: riverbed lists the hour folders in
    the bucket, Spark reads them through Hadoop's s3a://; the result equals one pass over
    the same files on disk, and a missing hour is named with its bucket path."""
    s = setup
    local = s["tmp"] / "in"
    store = open_store(f"{s3_url}/in")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(local).as_posix(), path.read_bytes())
    s["spec"].write_text(spec_text(f"{s3_url}/in", ""))
    cp = connect(s["env"]["RIVERBED_CONTROL"])
    driver = Driver(load_spec(s["spec"], s3_url), cp, lambda: spark, ttl=5)
    assert driver.run("2026-01-01", "2026-01-01T02:00").done == 4
    on_disk = replace(driver.job, input=ParquetInput(str(local), partition="hour"))
    whole = one_pass(spark, on_disk, parse_time("2026-01-01"), parse_time("2026-01-01T02:00"))
    assert whole.rows is not None
    assert_same(driver.output.read("rows").to_pandas(), whole.rows.toPandas(), exact=True)

    store.delete_many([i.key for i in store.list("hour=2026-01-01T02/")])
    later = Driver(load_spec(s["spec"], s3_url), cp, lambda: spark, ttl=5)
    with pytest.raises(MissingInputError, match=r"s3a://\S+/in/hour=2026-01-01T02 does not"):
        later.run("2026-01-01T02:00", "2026-01-01T03:00")
    with pytest.raises(SpecError, match=r"must be a directory .* or a bucket"):
        ParquetInput("memory://x/in")
