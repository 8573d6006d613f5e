"""A class-data archive of the Spark driver's JVM classes, for faster Spark starts.

A Spark driver JVM loads and verifies some 15,000 classes before its first job; on a
slow machine that is most of a session's start. The JVM can map them from an archive
instead (application class-data sharing, JDK 13+): ``make`` builds one once per
virtualenv (``python -m riverbed.spark.cds``, 2-3 min on 2 slow cores), by running a
small but representative Spark workload with ``-XX:ArchiveClassesAtExit``, and
:func:`riverbed.spark.session` starts every driver with ``-XX:SharedArchiveFile``.
Measured with ``benchmarks/spark_start.py``; see docs/benchmarks.md.

The JVM checks the archive itself (its own build, the class path) and ignores one that
does not fit, silently: the CDS log lines are switched off. ``RIVERBED_SPARK_CDS`` names
another archive, or ``off`` to use none.
"""

from __future__ import annotations

import os
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

from riverbed.config import child_environment, inherited
from riverbed.spark import SparkUnavailableError

__all__ = ["archive", "build", "java_options"]

ENV = "RIVERBED_SPARK_CDS"
# CDS reports a mismatched or unreadable archive on stdout; riverbed's terminal and
# the tests' quiet checks must not see that (the JVM then simply loads classes itself).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

WORKLOAD = """
import pandas as pd
from riverbed.config import SparkConfig
from riverbed.spark import session
spark = session(SparkConfig(master="local[2]", app_name="riverbed-cds", conf={
    "spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=" + $path + " " + $quiet,
    "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}))
# what riverbed's drivers do first: DataFrames from pandas (Arrow), SQL with a shuffle and
# a window, a Python task, Parquet both ways, results back to pandas
frame = spark.createDataFrame(pd.DataFrame({"k": [1, 2, 1], "v": [1.0, 2.0, 3.0]}))
frame.createOrReplaceTempView("t")
spark.sql("SELECT k, sum(v) OVER (PARTITION BY k ORDER BY v) AS s FROM t").toPandas()
frame.groupBy("k").count().collect()
frame.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
frame.write.mode("overwrite").parquet($scratch)
spark.read.parquet($scratch).toPandas()
spark.range(1000).selectExpr("id % 7 AS k").distinct().count()
spark.stop()
"""


def archive() -> Path | None:
    """The archive sessions use, or None (``RIVERBED_SPARK_CDS=off``)."""
    chosen = inherited(ENV)
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    import hashlib

    import pyspark

    from riverbed.spark.jars import jars

    # next to the PySpark it was built from: a new PySpark is a new virtualenv's or a new
    # name; so is another set of jars ahead of Spark's on the class path, or the same jars
    # fetched again (an archive maps only where the class path it was built with is a
    # prefix of the JVM's, each jar of the same size and modification time)
    extra = ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars())
    suffix = f"-{hashlib.sha256(extra.encode()).hexdigest()[:8]}" if extra else ""
    return Path(sys.prefix) / f"riverbed-spark-{pyspark.__version__}{suffix}.jsa"


def java_options() -> str:
    """The driver JVM options that map the archive, or "" when there is none."""
    path = archive()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def build(path: Path, timeout: float = 900.0) -> float:
    """Build the archive at ``path`` (replacing one there); returns the seconds taken.

    The JVM writes the archive when it exits, which is after the Python process that
    started it is gone; so the workload runs in a session of its own, and the archive is
    moved into place once no process of that session is left."""
    from riverbed.processes import kill_session, session_members

    began = time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    scratch = path.with_name(f".{path.name}.scratch")
    partial.unlink(missing_ok=True)
    code = string.Template(WORKLOAD).substitute(
        path=repr(str(partial)), quiet=repr(QUIET), scratch=repr(str(scratch))
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=child_environment({ENV: "off"}),  # dumping on top of an archive in use fails
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise SparkUnavailableError(f"the Spark workload failed: {err.strip()[-2000:]}")
        deadline = time.monotonic() + 120
        while session_members(proc.pid):  # the JVM, writing the archive as it exits
            if time.monotonic() > deadline:
                raise SparkUnavailableError("the Spark JVM did not exit within 120 s of its driver")
            time.sleep(0.2)
    finally:
        kill_session(proc.pid, timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)
    if not partial.is_file() or partial.stat().st_size == 0:
        raise SparkUnavailableError(f"the JVM wrote no archive at {partial}")
    os.replace(partial, path)
    return time.monotonic() - began


def main(force: bool = False) -> int:
    """``python -m riverbed.spark.cds [--force]`` (``riverbed setup spark-archive``):
    build the archive unless it is there."""
    path = archive()
    if path is None:
        print(f"{ENV}=off: no class-data archive")  # noqa: T201
        return 0
    if path.is_file() and not force:
        return 0
    print(  # noqa: T201
        f"==> building a class-data archive of Spark's JVM classes (faster Spark starts; "
        f"once, 2-3 minutes) → {path}",
        flush=True,
    )
    try:
        seconds = build(path)
    except (SparkUnavailableError, OSError, subprocess.TimeoutExpired) as exc:
        # not fatal: Spark starts without it, only slower
        print(f"    skipped, Spark will start without it: {exc}", file=sys.stderr)  # noqa: T201
        return 0
    print(f"    built in {seconds:.0f} s ({path.stat().st_size / 2**20:.0f} MiB)")  # noqa: T201
    for old in path.parent.glob("riverbed-spark-*.jsa"):  # built for jars or a PySpark gone
        if old != path:
            old.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(force="--force" in sys.argv[1:]))
