"""``pip install riverbed`` outside the repository: the wheel ``python -m build`` makes,
installed with its dependencies into a fresh virtualenv, run from a folder that is not
the checkout — the demo, then ``riverbed setup jars`` and an aggregation of Avro values
from Kafka through Spark's own connectors, with its checkpoint in a bucket (S3A)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from riverbed.locations import output_url
from riverbed.spark import TEST_CONF
from riverbed.stream.dataframe import read_results
from riverbed.testing import KafkaServer
from tests.stream.conftest import make_events
from tests.stream.test_kafka_source import AVRO

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
import json
from riverbed.stream import Aggregation, Count, Distinct, Sum, Tumbling

AVRO = {avro}
source = {{"kafka": {{"bootstrap": "{bootstrap}", "topic": "{topic}", "format": "avro",
                      "schema": json.dumps(AVRO)}}}}
aggregation = Aggregation(
    name="installed", key="flag", time="ts", window=Tumbling("1h"), watermark="100h",
    metrics={{"users": Distinct("user_id"), "events": Count(), "total": Sum("amount")}},
    state_partitions=2,
)
"""


def _run(command: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{command[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel, built by ``python -m build`` from a copy of what the package is made of
    (so the build leaves nothing in the checkout)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)],
        env=dict(os.environ), cwd=tmp_path, timeout=600,
    )  # fmt: skip
    wheels = list(dist.glob("riverbed-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _produce_avro(bootstrap: str, topic: str, events: pd.DataFrame) -> None:
    import fastavro
    from confluent_kafka import Producer

    parsed = fastavro.parse_schema(AVRO)
    producer = Producer({"bootstrap.servers": bootstrap})
    epoch_ms = events["ts"].astype("int64") // 1_000_000
    rows = zip(events["user_id"], events["flag"], events["amount"], epoch_ms, strict=True)
    for i, (u, f, a, ms) in enumerate(rows):
        out = io.BytesIO()
        fastavro.schemaless_writer(
            out, parsed, {"user_id": int(u), "flag": f, "amount": float(a), "ts": int(ms)}
        )
        producer.produce(topic, key=f, value=out.getvalue(), partition=i % 3)
    assert producer.flush(30) == 0


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_runs_the_demo_and_kafka_into_a_bucket(
    kafka_server: KafkaServer, kafka_topic: str, s3_url: str, tmp_path: Path
) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(venv)], env=dict(os.environ), cwd=tmp_path, timeout=300)
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        env=dict(os.environ), cwd=tmp_path, timeout=900,
    )  # fmt: skip

    elsewhere = tmp_path / "project"  # a user's folder: no checkout, no repository venv
    elsewhere.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RIVERBED_", "PYTHON", "VIRTUAL_ENV", "PYSPARK"))
    }
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "RIVERBED_HOME": str(elsewhere / ".riverbed"),
        "RIVERBED_SPARK_CONF": json.dumps(TEST_CONF),  # the tests' quick Spark settings
    }
    riverbed = str(venv / "bin" / "riverbed")
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import riverbed; print(riverbed.__file__)"],
        env=env, cwd=elsewhere, timeout=60,
    )  # fmt: skip
    assert where.strip().startswith(str(venv)), where  # the installed package, not the checkout

    demo = _run([riverbed, "demo", "--events", "40000"], env=env, cwd=elsewhere, timeout=600)
    assert "exact distinct users: IDENTICAL" in demo, demo[-2000:]

    jars = _run([riverbed, "setup", "jars"], env=env, cwd=elsewhere, timeout=900)
    assert f"jar cache {venv / 'jars'}" in jars, jars
    assert list((venv / "jars").glob("hadoop-aws-*.jar")), jars

    kafka_server.create_topic(kafka_topic, partitions=3)
    events = make_events(3000, hours=5, seed=23)
    _produce_avro(kafka_server.bootstrap, kafka_topic, events)
    spec = elsewhere / "clicks.py"
    spec.write_text(
        SPEC.format(avro=repr(AVRO), bootstrap=kafka_server.bootstrap, topic=kafka_topic)
    )
    env["RIVERBED_CHECKPOINTS"] = s3_url  # Spark's offsets and commits through S3A
    _run(
        [riverbed, "stream", "run", str(spec), "--once", "--max-records-per-batch", "1000"],
        env=env, cwd=elsewhere, timeout=900,
    )  # fmt: skip

    got = read_results(output_url(s3_url, "installed"))
    want = (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"), total=("amount", "sum"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    merged = want.merge(got, on=["window_start", "key"], suffixes=("_oracle", ""))
    assert len(merged) == len(want) == len(got)
    assert (merged["events"] == merged["events_oracle"]).all()
    assert (merged["users"] == merged["users_oracle"]).all()
    assert ((merged["total"] - merged["total_oracle"]).abs() < 1e-6).all()
