"""Drivers on different machines (directories) sharing only a bucket and a control
plane: a paused driver is replaced, and when it resumes none of its objects becomes
current. And the bucket going away for 30 s mid-stream stalls the driver; it does not
kill it, and nothing is lost."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from riverbed.stream.batchlog import open_batches
from riverbed.stream.fencing import recorded_driver
from riverbed.stream.layout import checkpoint_store, output_url
from riverbed.testing.s3 import CephS3Server
from tests.jobs.cluster import until
from tests.stream.conftest import make_events, write_events
from tests.stream.test_standby import (
    SPEC,
    TTL,
    assert_fenced,
    later_events,
    standby_line,
)
from tests.stream.test_standby import oracle as standby_oracle

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.s3]


class Cluster:
    """Two machine directories, one bucket, one control plane, one source log."""

    def __init__(self, tmp_path: Path, s3_url: str, env: dict[str, str], events: int) -> None:
        self.root = tmp_path
        self.url = s3_url
        self.env = {
            **env,
            "RIVERBED_CHECKPOINTS": s3_url,
            "RIVERBED_LOG": f"file://{tmp_path / 'log'}",
            "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
            "RIVERBED_SPARK_MASTER": "local[1]",
        }
        self.events = make_events(events, hours=6, seed=11)
        write_events(self.env["RIVERBED_LOG"], self.events, partitions=2)
        self.spec = tmp_path / "spec.py"
        self.spec.write_text(SPEC)
        self.procs: list[subprocess.Popen[str]] = []

    def driver(self, machine: str, *extra: str) -> subprocess.Popen[str]:
        """A driver on ``machine``: with ``--once`` unless ``extra`` says otherwise."""
        command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(self.spec)]
        limits = ["--max-records-per-batch", "150", "--ttl", str(TTL)]
        process = subprocess.Popen(
            [*command, *(extra or ["--once"]), *limits],
            env={**self.env, "RIVERBED_HOME": str(self.root / machine)},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(process)
        return process

    def produce(self, n: int, after_hours: int) -> None:
        """:func:`later_events` appended to the topic and the oracle."""
        more = later_events(n, after_hours)
        write_events(self.env["RIVERBED_LOG"], more, partitions=2)
        self.events = pd.concat([self.events, more], ignore_index=True)

    def term(self) -> int | None:
        record = recorded_driver(f"{self.url}/duo")
        return None if record is None else int(record["term"])

    def committed(self) -> dict[int, Any]:
        batches = open_batches(f"{self.url}/duo")
        return {b: r for b in batches.ids() if (r := batches.get(b)) is not None and r.done}

    def fingerprint(self) -> dict[str, str]:
        """Every object in the bucket under the test's prefix, by content."""
        store = checkpoint_store(self.url)
        return {i.key: hashlib.sha1(store.get(i.key)).hexdigest() for i in store.list()}

    def check(self) -> None:
        from riverbed.stream.dataframe import read_results

        got = read_results(output_url(self.url, "duo"))
        merged = standby_oracle(self.events).merge(
            got, on=["window_start", "key"], suffixes=("_oracle", ""), how="outer", indicator=True
        )
        assert (merged["_merge"] == "both").all()
        assert (merged["users"] == merged["users_oracle"]).all()
        assert (merged["events"] == merged["events_oracle"]).all(), "double or missing counts"

    def close(self) -> None:
        for process in self.procs:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def cluster(tmp_path: Path, s3_url: str, subprocess_env: dict[str, str]) -> Any:
    c = Cluster(tmp_path, s3_url, {**subprocess_env, **_aws(os.environ)}, 9_000)
    yield c
    c.close()


def _aws(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("AWS_")}


def test_a_paused_driver_resumed_after_a_takeover_makes_nothing_current(cluster: Cluster) -> None:
    # the first driver runs until stopped (its backlog, in small batches in the driver,
    # could be done before the standby is up) and ends when it loses its lead
    a = cluster.driver("machine-a", "--no-standby")
    until(lambda: cluster.term() is not None, 180, "the first driver's term")
    b = cluster.driver("machine-b")  # its Spark starts while the first one runs batches
    line = standby_line(b)
    assert a.poll() is None, "the first driver ended before the standby was up"
    assert "standby for duo" in line, line
    until(lambda: len(cluster.committed()) >= 2, 180, "the first driver's batches")
    first = cluster.term()
    os.killpg(a.pid, signal.SIGSTOP)  # Python and JVM: a zombie holding an old term
    cluster.produce(1_500, after_hours=6)  # the standby's backlog has these whatever A did
    try:
        until(lambda: cluster.term() != first, TTL + 60, "the standby's takeover")
        _, err = b.communicate(timeout=300)
        assert b.returncode == 0, err[-2000:]
        second = cluster.term()
        assert first is not None and second is not None and second > first
        done = cluster.committed()
        terms = [done[b_].term for b_ in sorted(done)]
        assert terms == sorted(terms) and terms[-1] == second, "two drivers interleaved"
        cluster.check()
        before = cluster.fingerprint()
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    assert_fenced(a)
    assert cluster.fingerprint() == before, "an object of the resumed zombie became current"
    cluster.check()


def test_the_bucket_gone_for_30_seconds_stalls_the_driver_and_loses_nothing(
    cluster: Cluster, s3_server: CephS3Server
) -> None:
    a = cluster.driver("machine-a")
    until(lambda: len(cluster.committed()) >= 2, 180, "the first batches")
    s3_server.stop_gateway()
    # mid-stream: the driver was not done (30 batches of 300), and is still not once the
    # bucket is back
    assert a.poll() is None, "the driver finished before the outage"

    try:
        time.sleep(30)
        assert a.poll() is None, "the driver exited while the bucket was away"
    finally:
        s3_server.start_gateway()
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    secret = cluster.env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in err
    done = cluster.committed()
    assert sum(r.input or 0 for r in done.values()) == 9_000
    assert sorted(done) == list(range(len(done)))
    cluster.check()
