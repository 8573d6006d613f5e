"""A tour of riverbed on a Kafka topic: distinct users per flag per hour, exactly once.

    .venv/bin/python examples/kafka_clicks.py [--events 200000]

What it does, as you would on your own Kafka cluster:

1. starts a one-node Kafka broker on a free loopback port (the tests' KRaft broker,
   which `make demo`/`make test` fetch into .venv/kafka) in a temporary directory;
2. produces clicks as JSON values keyed by flag with confluent-kafka — librdkafka's
   default partitioner places a key by its CRC-32, so with 4 partitions and
   ``state_partitions=4`` riverbed reads the topic *co-located*: each Kafka partition in
   the task that holds its state partition, no shuffle (docs/kafka.md);
3. writes a spec file and runs the CLI on it: ``riverbed stream run spec.py --once``,
   then produces more and runs again (it goes on from its checkpoint, exactly once),
   ``riverbed stream status`` (lag per Kafka partition) and ``riverbed query``;
4. checks every window and flag of the result table against pandas over the clicks.

Everything lives in a temporary directory and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from riverbed.stream import read_results
from riverbed.stream.batchlog import open_batches
from riverbed.testing import KafkaServer

SPEC = """\
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {{"kafka": {{
    "bootstrap": "{bootstrap}",
    "topic": "clicks",
    "schema": "user_id long, flag string, ts timestamp",
    "options": {{"maxOffsetsPerTrigger": "50000"}},
}}}}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="100h",
    metrics={{"users": Distinct("user_id"), "clicks": Count()}},
    state_partitions=4,  # = the topic's partitions: read co-located
)
"""


def clicks(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2026-11-20", tz="UTC")
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, n // 4, n),
            "flag": [f"flag-{i}" for i in rng.zipf(1.5, n) % 20],
            "ts": start + pd.to_timedelta(np.sort(rng.integers(0, 6 * 3600_000, n)), unit="ms"),
        }
    )


def produce(bootstrap: str, events: pd.DataFrame) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    stamps = events["ts"].dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for user, flag, at in zip(events["user_id"], events["flag"], stamps, strict=True):
        value = json.dumps({"user_id": int(user), "flag": flag, "ts": at})
        while True:
            try:
                producer.produce("clicks", key=flag, value=value)  # the default partitioner
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0, "the broker did not take every click"


def riverbed(home: Path, *args: str) -> str:
    """Run the ``riverbed`` CLI as a user would; its output, echoed."""
    print(f"\n$ riverbed {' '.join(args)}", flush=True)
    env = {**os.environ, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    done = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", *args],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
    )
    # stdout, and the driver's own lines of what it did (Spark's log lines left out)
    mine = [line for line in done.stderr.splitlines() if re.match(r"(batch \d+|riverbed)", line)]
    print("\n".join([done.stdout.rstrip(), *mine]).strip("\n"), flush=True)
    if done.returncode != 0:
        sys.exit(f"riverbed {args[0]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="clicks in all")
    args = parser.parse_args()
    first, more = clicks(args.events * 3 // 4, 1), clicks(args.events - args.events * 3 // 4, 2)
    with tempfile.TemporaryDirectory(prefix="riverbed-kafka-") as tmp:
        home = Path(tmp)
        print("starting a one-node Kafka broker on loopback ...", flush=True)
        with KafkaServer(home / "kafka") as kafka:
            kafka.create_topic("clicks", partitions=4)
            began = time.monotonic()
            produce(kafka.bootstrap, first)
            print(f"produced {len(first):,} clicks in {time.monotonic() - began:.1f} s")
            spec = home / "spec.py"
            spec.write_text(SPEC.format(bootstrap=kafka.bootstrap))
            riverbed(home, "stream", "run", str(spec), "--once")
            produce(kafka.bootstrap, more)
            print(f"\nproduced {len(more):,} more clicks")
            riverbed(home, "stream", "status", str(spec))
            riverbed(home, "stream", "run", str(spec), "--once")
            riverbed(home, "stream", "status", str(spec))
            riverbed(home, "query", "flags", "--key", "flag-1")
            events = pd.concat([first, more], ignore_index=True)
            want = (
                events.assign(window_start=events["ts"].dt.floor("1h"))
                .groupby(["window_start", "flag"])
                .agg(users=("user_id", "nunique"), clicks=("user_id", "size"))
                .reset_index()
                .rename(columns={"flag": "key"})
            )
            batches = open_batches(home / "checkpoints" / "flags")
            plans = {batches.get(b).co_located for b in batches.ids()}  # type: ignore[union-attr]
            print(f"\nbatches read co-located (no shuffle): {plans == {True}}")
            got = read_results(home / "output" / "flags")
            keys = ["window_start", "key"]
            merged = want.merge(got[[*keys, "users", "clicks"]], on=keys, how="outer")
            same = len(merged) == len(want) == len(got) and (
                (merged["users_x"] == merged["users_y"]).all()
                and (merged["clicks_x"] == merged["clicks_y"]).all()
            )
            print(
                f"\n{len(got)} windows x flags, {int(got['clicks'].sum()):,} clicks counted of "
                f"{len(events):,} produced: "
                + ("IDENTICAL to pandas" if same else "DIFFERENT from pandas")
            )
            if not same:
                sys.exit(1)


if __name__ == "__main__":
    main()
