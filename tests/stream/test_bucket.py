"""An aggregation whose checkpoints are in a bucket (the tests' real S3 server): lose
every local directory between runs and lose nothing.

The log-native path with checkpoint, state and result table in ``s3://…``; the local
state directory is a cache, deleted between runs, and a driver on a fresh directory
carries on exactly where the bucket says. Run as a user does, too: ``riverbed stream
run --checkpoints s3://…`` and ``riverbed query --checkpoints s3://…``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.cli.main import main
from riverbed.state import StateConfig
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.layout import checkpoint_store
from tests.stream.conftest import make_events, write_events
from tests.stream.test_cli import SPEC
from tests.stream.test_engine import SCHEMA
from tests.stream.test_lognative import check, spec

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def run_once(spark: Any, s3_url: str, log_url: str, local: Path) -> pd.DataFrame:
    query = start(
        spark,
        spec(3),
        {"topic": "events", "log": log_url, "schema": SCHEMA, "maxRecordsPerBatch": 600},
        checkpoint=f"{s3_url}/flags",
        output=f"{s3_url}/output/flags",
        state=StateConfig(local_dir=local, durable=f"{s3_url}/state", snapshot_every=2),
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return read_results(f"{s3_url}/output/flags")


def test_a_driver_on_an_empty_disk_carries_on_from_the_bucket(
    spark: Any, s3_url: str, log_url: str, tmp_path: Path
) -> None:
    first = make_events(1800, hours=3, seed=1)
    write_events(log_url, first, partitions=3, key_field="flag")
    check(run_once(spark, s3_url, log_url, tmp_path / "machine-a"), first)

    # the machine is gone: its local state with it; more events arrive meanwhile
    shutil.rmtree(tmp_path / "machine-a")
    more = make_events(1200, hours=3, seed=2)
    write_events(log_url, more, partitions=3, key_field="flag")
    got = run_once(spark, s3_url, log_url, tmp_path / "machine-b")
    check(got, pd.concat([first, more], ignore_index=True))

    batches = open_batches(f"{s3_url}/flags")
    ids = batches.ids()
    records = [batches.get(b) for b in ids]
    assert all(r is not None and r.done for r in records)
    assert sum(r.input or 0 for r in records if r) == 3000  # every event once, no batch twice
    store = checkpoint_store(s3_url)
    kinds = {_kind(i.key) for i in store.list()}
    assert {"flags/riverbed/batches", "flags/riverbed/commits", "flags/riverbed/spec.json"} <= kinds
    assert {"output/flags", "state/flags"} <= kinds
    assert not any(p.is_dir() for p in tmp_path.glob("s3*")), "a bucket URL used as a path"


def test_a_dataframe_source_keeps_sparks_own_logs_in_the_bucket(
    spark: Any, s3_url: str, log_url: str, tmp_path: Path
) -> None:
    """The DataFrame path: Spark writes its offset and commit logs to the bucket through
    Hadoop's s3a://; a driver on an empty disk carries on from them, every event once.
    What a driver killed during its first offset-log write left is cleared first."""
    from tests.stream.test_engine import source

    checkpoint = f"{s3_url}/flags"
    store = checkpoint_store(checkpoint)
    store.put("spark/offsets/.0.0c1f2e.tmp", b"v1\n{}")  # killed before S3A's rename

    def run(local: Path) -> pd.DataFrame:
        query = start(
            spark,
            spec(3),
            source(spark, log_url, max_records=700),
            checkpoint=checkpoint,
            output=f"{s3_url}/output/flags",
            state=StateConfig(local_dir=local, durable=f"{s3_url}/state", snapshot_every=2),
            log_url=log_url,
            trigger={"availableNow": True},
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        return read_results(f"{s3_url}/output/flags")

    first = make_events(1500, hours=3, seed=3)
    write_events(log_url, first, partitions=3, key_field="flag")
    check(run(tmp_path / "machine-a"), first)
    spark_logs = {i.key for i in store.list("spark/")}
    assert "spark/offsets/.0.0c1f2e.tmp" not in spark_logs
    assert {"spark/offsets/0", "spark/commits/0", "spark/metadata"} <= spark_logs

    shutil.rmtree(tmp_path / "machine-a")  # the machine is gone
    more = make_events(900, hours=3, seed=4)
    write_events(log_url, more, partitions=3, key_field="flag")
    check(run(tmp_path / "machine-b"), pd.concat([first, more], ignore_index=True))
    batches = open_batches(checkpoint)
    records = [batches.get(b) for b in batches.ids()]
    assert all(r is not None and r.done for r in records)
    assert sum(r.input or 0 for r in records if r) == 2400  # every event once
    # Spark's logs and riverbed's records agree on which batches ran
    committed = {int(k.rsplit("/", 1)[1]) for k in (i.key for i in store.list("spark/commits/"))
                 if k.rsplit("/", 1)[1].isdigit()}  # fmt: skip
    assert committed == set(batches.ids())
    # the keys reached S3A through the session's Hadoop settings, never Spark's own
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert not any(secret in value for _, value in spark.sparkContext.getConf().getAll())


def test_stream_run_and_query_with_checkpoints_in_a_bucket(
    s3_url: str,
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    log_url = f"file://{tmp_path / 'log'}"
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(home),
        "RIVERBED_LOG": log_url,
        # the control plane outlives the driver's machine, as etcd would
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
        "RIVERBED_SPARK_MASTER": "local[2]",
    }
    write_events(log_url, make_events(900, hours=2), partitions=3)
    spec_file = tmp_path / "flags.py"
    spec_file.write_text(SPEC)
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec_file)]
    run = subprocess.run(
        [
            *command,
            "--once",
            "--max-records-per-batch",
            "300",
            "--checkpoints",
            s3_url,
            "--retain-versions",
            "2",
            "--snapshot-every",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    said = "".join(run.stderr.split())  # rich may fold the long URL
    assert f"resultsin{s3_url}/output/flags" in said
    assert "batch 2: 300 records, 0 late, 0 malformed" in run.stderr
    secret = env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in run.stderr + run.stdout
    shutil.rmtree(home / "state")  # the local cache: not needed to read results
    # retention: only what the newest 2 batches need is kept, in the bucket too
    store = checkpoint_store(s3_url)
    commits = [i.key for i in store.list("flags/riverbed/commits/")]
    # batches 0-2 of 300 events and 3 without input (the watermark the last ones set)
    assert [k.rsplit("/", 1)[1] for k in commits] == [f"{b:012d}.json" for b in (2, 3)]
    changelogs = {i.key.rsplit("/", 1)[1] for i in store.list("state/flags/0/changelog/")}
    assert f"{1:020d}.rbcl" not in changelogs and f"{4:020d}.rbcl" in changelogs

    monkeypatch.setenv("RIVERBED_HOME", str(home))
    monkeypatch.setenv("RIVERBED_LOG", log_url)
    assert main(["query", "flags", "--checkpoints", s3_url, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["events"] for r in rows) == 900
    assert main(["stream", "status", str(spec_file), "--checkpoints", s3_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["batches"], status["input_records"]) == (4, 900)
    assert set(status["lag"].values()) == {0}
    # by name, as the console's read model answers it: from the bucket alone
    assert main(["stream", "status", "flags", "--checkpoints", s3_url, "--json"]) == 0
    by_name = json.loads(capsys.readouterr().out)
    # the term the driver was elected with (a control-plane revision: it only grows)
    elected = int(re.search(r"active driver for flags \(term (\d+)\)", run.stderr)[1])
    assert (by_name["batches"], by_name["input_records"], by_name["term"]) == (4, 900, elected)
    assert [row["batch"] for row in by_name["ledger"]] == [3, 2]  # retention kept two
    assert by_name["ledger"][0]["done"] and by_name["ledger"][0]["offsets"]
    assert main(["state", "ls", "--checkpoints", s3_url, "--json"]) == 0
    assert "flags" in capsys.readouterr().out

    # a second run on a fresh home finds everything committed: nothing to do, nothing redone
    again = subprocess.run(
        [*command, "--once", "--checkpoints", s3_url],
        env={**env, "RIVERBED_HOME": str(tmp_path / "fresh")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "batches up to 3 are committed; next is 4" in again.stderr
    assert "batch 4:" not in again.stderr

    # a control plane that is not the one the aggregation ran with is refused, by name
    other = subprocess.run(
        [*command, "--once", "--checkpoints", s3_url],
        env={**env, "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'new-control.db'}"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert other.returncode != 0
    assert "was last written by term" in other.stderr and "Traceback" not in other.stderr


def _kind(key: str) -> str:
    """A bucket key's kind: its first two or three segments."""
    parts = key.split("/")
    if parts[0] in ("output", "state"):
        return "/".join(parts[:2])
    return "/".join(parts[:3])
