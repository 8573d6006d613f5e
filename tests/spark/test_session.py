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


def test_spark_keeps_its_scratch_files_under_the_runs_temporary_directory(
    spark: Any, _spark_scratch: Any
) -> None:
    """A shuffle writes block files; they land in the run's scratch directory (which
    pytest removes with old runs), not in /tmp where killed JVMs would leave them; and
    the JVM's temporary directory is there too."""
    df = spark.range(0, 1000, numPartitions=4)
    assert df.groupBy((df.id % 7).alias("k")).count().count() == 7
    made = [p.name for p in _spark_scratch.iterdir()]
    assert any(name.startswith("blockmgr-") for name in made), made
    assert any(name.startswith("spark-") for name in made), made
    system = spark.sparkContext._jvm.java.lang.System
    assert system.getProperty("java.io.tmpdir") == str(_spark_scratch)  # artifacts-* too


def test_session_settings(spark: Any) -> None:
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.master == "local[2,2]"


def test_accumulator_server_errors_go_to_fd2_not_the_terminal(
    spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dropped JVM connection makes PySpark's accumulator thread print a traceback;
    the CLI's terminal is sys.stderr, the noise log is fd 2 (sys.__stderr__)."""
    import io
    import socket
    import time

    from pyspark.accumulators import _start_update_server

    fd2 = io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", fd2)
    # a server of the same class as the session's (which is busy with its JVM's
    # connection: it serves one at a time)
    server = _start_update_server("t0ken", False)
    try:
        address: Any = server.server_address
        with socket.create_connection(address):
            pass  # hang up without the token: the handler fails
        deadline = time.monotonic() + 10
        while "accumulator server" not in fd2.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
    assert "Traceback" in fd2.getvalue()
    assert "Traceback" not in capsys.readouterr().err
