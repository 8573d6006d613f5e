"""How long a Spark driver takes from nothing to its first results: with and without
riverbed's class-data archive of Spark's JVM classes (:mod:`riverbed.spark.cds`), or
with riverbed's Python worker daemon and PySpark's own (:mod:`riverbed.spark.daemon`), or
with one such daemon for every task and Spark's default of two (``--against
one-daemon``: SQL UDFs' tasks get their own, keyed by SPARK_SIMPLIFIED_TRACEBACK).

Each run is a fresh Python process that starts a ``local[2]`` session with riverbed's
settings, runs a first SQL job, a first Python task (the first Python worker), then a
first task of riverbed's kind (a pandas function over two partitions that uses
riverbed's engine), as every riverbed driver, worker chunk and demo does. Runs
alternate between the two sides — the archive and ``RIVERBED_SPARK_CDS=off`` (the JVM
loading every class itself), or ``spark.python.daemon.module`` riverbed's and
``pyspark.daemon`` — so the machine's drift hits both; prints the medians of each
phase and their ratio.

Usage::

    .venv/bin/python -m riverbed.spark.cds            # build the archive (make does)
    .venv/bin/python benchmarks/spark_start.py [--runs 3] [--against archive|daemon|one-daemon]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from riverbed.spark.cds import ENV, archive

PROBE = """
import json, os, time
began = time.monotonic()
from riverbed.spark import session
from riverbed.config import SparkConfig
conf = {"spark.python.daemon.module": os.environ["DAEMON"]} if "DAEMON" in os.environ else {}
if "SIMPLIFIED" in os.environ:  # Spark's default: a second daemon for SQL UDFs' tasks
    conf["spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"] = "true"
spark = session(SparkConfig(master="local[2]", conf=conf), test=True)
t1 = time.monotonic()
spark.range(10).count()
t2 = time.monotonic()
spark.createDataFrame([(1,)], "a long").rdd.map(lambda r: r).count()
t3 = time.monotonic()

def task(frames):
    from riverbed.stream.engine import event_millis
    for pdf in frames:
        pdf["id"] = event_millis(pdf["id"].astype("datetime64[ms]"))
        yield pdf

spark.range(0, 1000, numPartitions=2).mapInPandas(task, "id long").count()
t4 = time.monotonic()
print(json.dumps({"session": t1 - began, "first job": t2 - t1, "first Python task": t3 - t2,
                  "first riverbed task": t4 - t3, "total": t4 - began}))
"""
PHASES = ("session", "first job", "first Python task", "first riverbed task", "total")


def probe(env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", choices=("archive", "daemon", "one-daemon"), default="archive")
    args = parser.parse_args()
    if args.against == "archive":
        path = archive()
        if path is None or not path.is_file():
            sys.exit(f"no archive at {path}: build it first (python -m riverbed.spark.cds)")
        sides = {"no archive": {ENV: "off"}, "archive": {ENV: str(path)}}
        what = path.name
    elif args.against == "daemon":
        sides = {"pyspark.daemon": {"DAEMON": "pyspark.daemon"}, "riverbed's": {}}
        what = "spark.python.daemon.module"
    else:  # the RDD task and the pandas task: one daemon each, or one for both
        sides = {"two daemons": {"SIMPLIFIED": "1"}, "one daemon": {}}
        what = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
    (base, base_env), (ours, our_env) = sides.items()
    runs: dict[str, list[dict[str, float]]] = {base: [], ours: []}
    for _ in range(args.runs):
        runs[base].append(probe({**os.environ, **base_env}))
        runs[ours].append(probe({**os.environ, **our_env}))
    print(f"median of {args.runs} fresh drivers, local[2] ({what}):")
    print(f"  {'phase':<20} {base:>14} {ours:>14} {'ratio':>7}")
    for phase in PHASES:
        off = statistics.median(r[phase] for r in runs[base])
        on = statistics.median(r[phase] for r in runs[ours])
        print(f"  {phase:<20} {off:>13.2f}s {on:>13.2f}s {on / off:>6.2f}x")


if __name__ == "__main__":
    main()
