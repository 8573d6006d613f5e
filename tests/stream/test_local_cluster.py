"""Several executor processes (Spark's local-cluster master): each executor keeps its own
local state databases, so a state partition scheduled on another executor than last
time is rebuilt there from the durable checkpoint. The driver and the executors reach
the topic only through a log server (``flight://``), as a cluster on other machines
would. Results must still equal the oracle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from riverbed.stream.dataframe import read_results
from riverbed.testing import log_server_process
from tests.stream.conftest import make_events, write_events

# A local cluster (a master, two executor JVMs) and three queries: a scenario, with the
# scenarios' hang guard (tests/conftest.py's SCENARIO_HANG_GUARD)
pytestmark = [pytest.mark.spark, pytest.mark.slow]

PATHS = ("dataframe", "shuffled", "colocated")

DRIVER = """
import sys
PATHS = ("dataframe", "shuffled", "colocated")
from pathlib import Path
from dataclasses import replace
from riverbed.config import load_config
from riverbed.spark import session
from riverbed.state import StateConfig
from riverbed.stream import Aggregation, Count, Distinct, Tumbling, register, start

root, log_url = Path(sys.argv[1]), sys.argv[2]
# No locality wait: with the default 3 s, every short state task waits for the executor
# that holds its shuffle input, so all of them can land on one executor.
config = load_config().spark  # the tests' settings (RIVERBED_SPARK_CONF), then these
spark = session(replace(config, master="local-cluster[2,1,1024]", app_name="riverbed-lc",
                        conf={**config.conf, "spark.executor.memory": "512m",
                              "spark.sql.shuffle.partitions": "4",
                              "spark.locality.wait": "0"}))
# Executors register a few seconds after the driver starts; a batch planned before the
# second one is up runs entirely on the first.
import time
deadline = time.monotonic() + 120
while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:  # driver + 2
    assert time.monotonic() < deadline, "local-cluster executors did not register in 120 s"
    time.sleep(0.2)
# Warm a Python worker on both executors (pandas and pyarrow imported): a cold one takes
# seconds for its first task, and meanwhile the warm executor takes every state task.
def warm(rows):
    import pandas, pyarrow  # noqa: F401
    yield 1
spark.sparkContext.parallelize(range(8), 8).mapPartitions(warm).collect()
register(spark)
options = {"topic": "events", "log": log_url, "maxRecordsPerBatch": "800",
           "schema": "user_id long, flag string, amount double, ts timestamp"}
# One cluster, three queries (a cluster start costs ~25 s): "dataframe": events through
# Spark; "shuffled": the log-native path with 4 state partitions over a 3-partition topic;
# "colocated": 3 state partitions, one per log partition
for path in PATHS:
    source = (spark.readStream.format("riverbed").options(**options).load()
              if path == "dataframe" else options)
    spec = Aggregation(name=f"lc_{path}", key="flag", time="ts", window=Tumbling("1h"),
                       watermark="9h", metrics={"users": Distinct("user_id"), "events": Count()},
                       state_partitions=3 if path == "colocated" else 4)
    # A relative local_dir resolves in each executor's own work directory.
    state = StateConfig(local_dir=Path("executor-state"), durable=root / path / "durable",
                        snapshot_every=3)
    query = start(spark, spec, source, checkpoint=root / path / "ckpt",
                  output=root / path / "out", state=state, trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None, query.exception()
import os, pyspark
# local-cluster executors work under $SPARK_HOME/work/<application id>/<executor>/
print(os.path.join(os.path.dirname(pyspark.__file__), "work", spark.sparkContext.applicationId))
spark.stop()
"""


def test_state_moves_between_executors_and_results_stay_exact(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    events = make_events(3200, hours=6, seed=9)  # 4 batches of 800 per query
    write_events(f"file://{tmp_path / 'log'}", events)
    with log_server_process(tmp_path / "log") as log_url:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, str(tmp_path), log_url],
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    app_dir = Path(done.stdout.strip().splitlines()[-1])
    want = (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    try:
        spread = {}
        for path in PATHS:
            # each executor kept its own local databases: partitions it had not held
            # before were rebuilt from the durable checkpoint
            spread[path] = len(
                {
                    p.relative_to(app_dir).parts[0]
                    for p in app_dir.rglob(f"executor-state/lc_{path}/*/CURRENT")
                }
            )
            if path != "dataframe":
                records = (tmp_path / path / "ckpt").rglob("batches/*.json")
                plans = {r["co_located"] for r in map(_record, records)}
                assert plans == {path == "colocated"}, path
            got = read_results(tmp_path / path / "out")
            merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
            assert len(merged) == len(want) == len(got), path
            assert (merged["users"] == merged["users_oracle"]).all(), path
            assert (merged["events"] == merged["events_oracle"]).all(), path
        # Spark decides where tasks run: on a loaded machine one query's state tasks can
        # all land on one executor; state must have moved between executors in this run
        assert max(spread.values()) >= 2, f"state work never spread over both: {spread}"
    finally:
        shutil.rmtree(app_dir, ignore_errors=True)


def _record(path: Path) -> dict[str, object]:
    import json

    record: dict[str, object] = json.loads(path.read_text())
    return record
