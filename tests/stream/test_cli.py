"""`riverbed stream run` with a results topic, and `riverbed query` from the result table
and live from state, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import riverbed.log
from riverbed.cli.main import main
from tests.stream.conftest import make_events, write_events

pytestmark = pytest.mark.spark

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)
"""


def test_run_query_results_and_live_state(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    write_events(f"file://{home / 'log'}", make_events(900, hours=2), partitions=3)
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC)
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once"]
    run = subprocess.run(
        [*command, "--max-records-per-batch", "300", "--topic", "flags.results"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "batch 2: 300 records, 0 late, 0 malformed" in run.stderr

    monkeypatch.setenv("RIVERBED_HOME", str(home))
    assert main(["query", "flags", "--json"]) == 0
    table = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["events"] for r in table) == 900
    assert main(["query", str(spec), "--from-state", "--json"]) == 0
    live = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["key"], r["users"]) for r in live] == [(r["key"], r["users"]) for r in table]
    assert main(["query", str(spec), "--from-state", "--batch", "0", "--json"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(r["events"] for r in first) == 300

    log = riverbed.log.open(f"file://{home / 'log'}")
    published = [r.value for p in range(3) for r in log.read("flags.results", p, 0, 10_000)]
    assert {r["batch_id"] for r in published} == {0, 1, 2}

    assert main(["stream", "status", str(spec), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["batches"], status["input_records"], status["late"]) == (3, 900, 0)
    assert set(status["lag"].values()) == {0} and status["state_bytes"] > 0
    assert set(status["last_batch_ms"]) == {"offsets", "state_job", "outputs"}
    assert status["input_rate"] > 0
    assert main(["stream", "status", str(spec)]) == 0
    assert "last batch: offsets" in capsys.readouterr().out

    # mistakes are named, with the fix
    assert main(["query", "flags", "--from-state"]) == 1
    assert "pass its spec file" in capsys.readouterr().err
    assert main(["query", "flags", "--batch", "1"]) == 1
    assert "add --from-state" in capsys.readouterr().err
