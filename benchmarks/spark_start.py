"""How long a Spark driver takes from nothing to its first results, with and without
riverbed's class-data archive of Spark's JVM classes (:mod:`riverbed.spark.cds`).

Each run is a fresh Python process that starts a ``local[2]`` session with riverbed's
settings, runs a first SQL job, then a first Python task (the first Python worker), as
every riverbed driver, worker chunk and demo does. Runs alternate between the archive
and ``RIVERBED_SPARK_CDS=off`` (the JVM loading every class itself: the baseline), so
the machine's drift hits both; prints the medians of each phase and their ratio.

Usage::

    .venv/bin/python -m riverbed.spark.cds            # build the archive (make does)
    .venv/bin/python benchmarks/spark_start.py [--runs 3]
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
import json, time
began = time.monotonic()
from riverbed.spark import session
from riverbed.config import SparkConfig
spark = session(SparkConfig(master="local[2]"), test=True)
t1 = time.monotonic()
spark.range(10).count()
t2 = time.monotonic()
spark.createDataFrame([(1,)], "a long").rdd.map(lambda r: r).count()
t3 = time.monotonic()
print(json.dumps({"session": t1 - began, "first job": t2 - t1, "first Python task": t3 - t2,
                  "total": t3 - began}))
"""


def probe(env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    path = archive()
    if path is None or not path.is_file():
        sys.exit(f"no archive at {path}: build it first (python -m riverbed.spark.cds)")
    runs: dict[str, list[dict[str, float]]] = {"archive": [], "no archive": []}
    for _ in range(args.runs):
        runs["no archive"].append(probe({**os.environ, ENV: "off"}))
        runs["archive"].append(probe({**os.environ, ENV: str(path)}))
    print(f"median of {args.runs} fresh drivers, local[2] ({path.name}):")
    print(f"  {'phase':<18} {'no archive':>10} {'archive':>10} {'ratio':>7}")
    for phase in ("session", "first job", "first Python task", "total"):
        off = statistics.median(r[phase] for r in runs["no archive"])
        on = statistics.median(r[phase] for r in runs["archive"])
        print(f"  {phase:<18} {off:>9.1f}s {on:>9.1f}s {on / off:>6.2f}x")


if __name__ == "__main__":
    main()
