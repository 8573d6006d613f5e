"""A driver SIGKILLed at any moment of its start-up — before, during and after the
JVM, the election, the query start and Spark's first checkpoint writes — restarts
cleanly, and the final result is exactly once.

Ten kills at random moments in the first seconds of each start, on both paths a
driver can take: ``riverbed stream run`` (riverbed's trigger loop over a topic) and
a Structured Streaming query over a DataFrame (Spark's own checkpoint, whose first
offset-log entry a kill can leave half-written).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from riverbed.stream.dataframe import read_results
from riverbed.windows import Tumbling
from tests.stream.conftest import make_events, write_events
from tests.stream.crashes import backlogs
from tests.stream.test_engine import oracle

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="startup", key="flag", time="ts", window=Tumbling("1h"), watermark="3h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)
"""

DATAFRAME_DRIVER = """
import sys
from pathlib import Path
from riverbed.spark import session
from riverbed.stream import register
from riverbed.stream.dataframe import start
from dataclasses import replace
from riverbed.config import load_config

sys.path.insert(0, str(Path(sys.argv[1]).parent))
from spec import aggregation

home = Path(sys.argv[2])
spark = session(replace(load_config().spark, master="local[2]"))  # with the tests' settings
register(spark)
df = (spark.readStream.format("riverbed").option("topic", "events")
      .option("log", f"file://{home / 'log'}")
      .option("schema", "user_id long, flag string, amount double, ts timestamp")
      .option("maxRecordsPerBatch", 3000).load())
# the killed starts run until stopped; the final one drains what is there and ends
once = sys.argv[3:] == ["--once"]
trigger = {"availableNow": True} if once else {"processingTime": "0.5 seconds"}
query = start(spark, aggregation, df, checkpoint=home / "ckpt", output=home / "out",
              log_url=f"file://{home / 'log'}", trigger=trigger)
query.awaitTermination()
if query.exception() is not None:
    raise SystemExit(f"query failed: {query.exception()}")
"""

KILLS = 10


@pytest.mark.parametrize("path", ["stream run", "dataframe"])
def test_a_driver_killed_ten_times_during_start_up_restarts_cleanly(
    tmp_path: Path, subprocess_env: dict[str, str], path: str
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    events = make_events(9_000, hours=6, seed=11)
    slices = backlogs(events, KILLS + 1)  # each start finds work of its own to begin
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    if path == "stream run":
        command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec)]
        command += ["--max-records-per-batch", "1500", "--ttl", "2"]
        output = home / "output" / "startup"
    else:
        driver = tmp_path / "driver.py"
        driver.write_text(DATAFRAME_DRIVER)
        command = [sys.executable, str(driver), str(spec), str(home)]
        output = home / "out"
    rng = random.Random(28)
    for kill in range(KILLS):
        write_events(f"file://{home / 'log'}", slices[kill], partitions=3)
        log = tmp_path / f"start-{kill}.log"
        with open(log, "wb") as out:
            # runs until stopped (no --once): the kill lands whenever it comes
            proc = subprocess.Popen(
                command, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
            )
            moment = rng.uniform(0.0, 7.0)  # the JVM, the election, the query's start
            try:
                proc.wait(moment)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # a start never ends by itself: one that did failed, on a checkpoint its
        # predecessor's kill left behind
        assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    write_events(f"file://{home / 'log'}", slices[KILLS], partitions=3)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
    assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" not in finished.stderr

    got = read_results(output)
    want = oracle(events, Tumbling("1h"))[["window_start", "key", "events", "users"]]
    merged = want.merge(
        got, on=["window_start", "key"], suffixes=("_oracle", ""), how="outer", indicator=True
    )
    assert (merged["_merge"] == "both").all()
    assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"
    assert (merged["users"] == merged["users_oracle"]).all()
