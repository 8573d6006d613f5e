"""The one place that builds SparkSessions.

Everything riverbed runs on Spark gets its session from :func:`session`, so the
settings that matter are set once:

* ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` default to the running interpreter —
  otherwise Python workers start whatever ``python3`` is first on PATH and miss
  riverbed's packages;
* UTC session time zone (no naive datetimes anywhere);
* the driver JVM maps Spark's classes from a class-data archive when ``make`` built one
  (:mod:`riverbed.spark.cds`: ~40 % off a session's start on 2 slow cores);
* the jar cache (:mod:`riverbed.spark.jars`: Spark's own ``s3a://``, Kafka and Avro
  connectors, filled by ``riverbed setup jars``) is on the class path, and S3A is set
  from the AWS settings chain (:mod:`riverbed.spark.s3a`);
* ``test=True`` adds the fast settings measured for ``local[2]`` test runs (no UI,
  2 shuffle partitions, no AQE, a C1-only serial-GC driver JVM).

The master comes from :class:`~riverbed.config.SparkConfig` (``local[*]`` by default,
``RIVERBED_SPARK_MASTER`` or ``[spark] master`` in riverbed.toml for a cluster;
``riverbed``: the masters the control plane knows, :mod:`riverbed.spark.discovery`).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING

from riverbed.config import SparkConfig
from riverbed.errors import InvalidValueError, RiverbedError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "TEST_CONF",
    "TEST_JVM_CONF",
    "TEST_JVM_OPTIONS",
    "SourceOptionError",
    "SparkUnavailableError",
    "driver_heap_bytes",
    "is_connect",
    "session",
    "tasks_in_this_process",
    "tasks_on_this_machine",
]

# JVMs that live as long as a test: C1 only (C2's compiles never pay back in minutes, and
# take CPU from the other tests) and the serial collector (docs/testing.md)
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# ... for a driver and its executors (a local-cluster's, a test bed's workers'): as small
# and short-lived
TEST_JVM_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
}

TEST_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    **TEST_JVM_CONF,
}

BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",  # riverbed prints its own progress
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Python workers forked with riverbed's task modules imported (riverbed.spark.daemon)
    "spark.python.daemon.module": "riverbed.spark.daemon",
    # One such daemon per executor, not two: Spark keys its daemons by the workers'
    # environment, and a SQL UDF's (a pandas UDF, a Python data source's read) gets
    # SPARK_SIMPLIFIED_TRACEBACK where an RDD task's (the executors' warm-up) does not —
    # a second daemon with riverbed's modules imported and its own idle workers (~1 s of
    # CPU a driver start, docs/testing.md). A task's error keeps its last line, which is
    # what riverbed reports (stream.specjob.root_cause); its traceback keeps PySpark's
    # frames.
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
}


class SparkUnavailableError(RiverbedError):
    """Spark cannot start (usually: no Java)."""


class SourceOptionError(InvalidValueError):
    """A riverbed source option (topic, schema, …) that cannot be used."""


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session: a client of a server elsewhere, with
    no SparkContext, RDDs or JVM of its own (docs/stream.md, "Spark Connect")."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def tasks_on_this_machine(master: str) -> bool:
    """Whether a Spark master runs every task on the driver's machine: ``local``,
    ``local[…]``, and ``local-cluster[…]`` (its executors are processes here), so a
    directory of this machine reaches them all."""
    return master.strip().startswith("local")


def tasks_in_this_process(master: str) -> bool:
    """Whether a Spark master runs tasks beside the driver as this machine's own:
    ``local``/``local[…]`` — not ``local-cluster[…]``, whose executors stand for other
    machines (the tests' and demos' stand-in for a cluster)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def driver_heap_bytes(spark: SparkSession) -> int:
    """The most heap the driver's JVM will use (``spark.driver.memory``; 1 GiB unless set):
    what bounds a result collected to the driver."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    return int(runtime.maxMemory())


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return
    if shutil.which("java") is None:
        raise SparkUnavailableError(
            "Spark needs Java 17 or newer and none was found; install it "
            "(apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME"
        )


def _accumulator_errors_to_fd2() -> None:
    """PySpark's accumulator server thread prints a traceback through ``sys.stderr``
    when the JVM's connection drops (a driver stopping after losing its lead, a JVM
    killed under it). That is Spark noise: send it where the JVM's own output goes
    (fd 2 — the log file when the CLI hides the noise), not to the terminal."""
    import traceback

    from pyspark import accumulators

    def handle_error(self: object, request: object, client_address: object) -> None:
        out = sys.__stderr__
        if out is not None:
            out.write(
                f"accumulator server: connection from {client_address} failed\n"
                + traceback.format_exc()
            )
            out.flush()

    for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
        server = getattr(accumulators, name, None)
        if server is not None:
            server.handle_error = handle_error


def _s3a_conf() -> dict[str, str]:
    """The jar cache's jars and S3A's settings, when ``riverbed setup jars`` filled it
    (the jars must be at the same path where executors run)."""
    from riverbed.spark import s3a
    from riverbed.spark.jars import jars

    found = jars()
    if not found:
        return {}
    # on the JVMs' class path (ahead of Spark's, where the class-data archive built with
    # them expects them), not spark.jars: that would copy 700 MB to every executor
    path = ":".join(str(p) for p in found)
    return {
        "spark.driver.extraClassPath": path,
        "spark.executor.extraClassPath": path,
        **s3a.conf(),
    }


def session(config: SparkConfig | None = None, *, test: bool = False) -> SparkSession:
    """Get or create the SparkSession for ``config``."""
    config = config or SparkConfig()
    _check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    _accumulator_errors_to_fd2()
    master = config.master
    from riverbed.spark.discovery import DISCOVERED, resolve

    if master in DISCOVERED:
        from riverbed.config import load_config

        master = resolve(master, load_config().control)
    if master.startswith("sc://"):  # a Spark Connect server: its own Spark, its settings
        remote: SparkSession = SparkSession.builder.remote(master).getOrCreate()
        remote.conf.set("spark.sql.session.timeZone", "UTC")
        return remote
    builder = SparkSession.builder.master(master).appName(config.app_name)
    conf = {**BASE_CONF, **(TEST_CONF if test else {}), **config.conf}
    from riverbed.spark.cds import java_options  # here: `python -m riverbed.spark.cds`

    options = java_options()
    if options:  # before the caller's own, which may override them
        key = "spark.driver.extraJavaOptions"
        conf[key] = f"{options} {conf.get(key, '')}".strip()
    conf = {**_s3a_conf(), **conf}  # the caller's own settings win
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    if not test:
        spark.sparkContext.setLogLevel("WARN")
    return spark
