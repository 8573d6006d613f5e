"""Malformed values at the first offset of every partition, among the events and as the
last record, through a SIGKILLed driver, on every kind of topic: the driver starts (the
co-location check reads the partitions' first records and skips what it cannot decode),
is killed mid-batch, starts again, and the results equal pandas over the well-formed
events, each malformed record counted once.

Before the fix, one undecodable value among a partition's first 100 records made every
start — and so every restart and standby — fail with ``record value is not JSON``."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from riverbed.stream.batchlog import open_batches
from riverbed.stream.layout import Checkpoint
from tests.stream.conftest import make_events
from tests.stream.crashes import kill_mid_batch
from tests.stream.test_hostile_input import PARTITIONS, Bed, _assert_equal, layout, open_bed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling

source = {source}
aggregation = Aggregation(
    name="badstart", key="flag", time="ts", window=Tumbling("1h"), watermark="100h",
    metrics={{"events": Count(), "users": Distinct("user_id"), "total": Sum("amount"),
              "top": Max("amount")}},
    state_partitions={partitions},
)
"""
SCHEMA = "user_id long, flag string, amount double, ts timestamp"


@pytest.fixture(
    params=[
        "file",
        "flight",
        pytest.param("diskless", marks=pytest.mark.s3),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ]
)
def bed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Bed]:
    log = f"file://{tmp_path / 'home' / 'log'}"  # the home's log: riverbed run's default
    with open_bed(request.param, log, request, tmp_path, monkeypatch) as b:
        yield b


def test_malformed_values_first_among_and_last_survive_a_killed_driver(
    bed: Bed, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    import os

    home = tmp_path / "home"
    env = {**subprocess_env, **os.environ, "RIVERBED_HOME": str(home)}
    env |= {"RIVERBED_SPARK_MASTER": "local[2]", "PYTHONUNBUFFERED": "1"}
    if bed.kafka is not None:
        source = {"kafka": {"bootstrap": bed.kafka.bootstrap, "topic": bed.topic, "schema": SCHEMA}}
    else:
        source = {"topic": bed.topic, "log": bed.url, "schema": SCHEMA}
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC.format(source=repr(source), partitions=PARTITIONS))
    events = make_events(3000, hours=6, seed=23)
    bed.create()
    parts = layout(events, [])  # malformed first, among the events (none), and last
    middle = {p: [(None, b'{"user_id": "seven"}', {})] for p in range(PARTITIONS)}
    first_half = {p: records[: len(records) // 2] for p, records in parts.items()}
    second_half = {p: records[len(records) // 2 :] for p, records in parts.items()}
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec)]
    command += ["--max-records-per-batch", "300", "--ttl", "3"]
    batches = Checkpoint(home / "checkpoints" / "badstart").batches

    def release(k: int) -> None:  # the first half and the malformed values among
        bed.append(first_half)
        bed.append(middle)

    aimed = kill_mid_batch(
        command, env, batches, kills=1, rng=random.Random(3), before_start=release,
        logs=tmp_path / "logs",
    )  # fmt: skip
    assert len(aimed) == 1
    bed.append(second_half)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False, timeout=600
    )
    assert finished.returncode == 0, (finished.stdout + finished.stderr)[-3000:]
    assert "not JSON" not in finished.stderr  # said of no start, nor of the restart

    _assert_equal(home / "output" / "badstart", events)
    log = open_batches(home / "checkpoints" / "badstart")
    records = [r for r in (log.get(b) for b in log.ids()) if r is not None]
    assert records[-1].done and records[-1].totals is not None
    assert records[-1].totals["malformed"] == 2 * PARTITIONS + 1  # each counted once
    assert {r.co_located for r in records} == {True}
