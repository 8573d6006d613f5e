"""Queryable state: Arrow batches across partitions, live, and the `riverbed state` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from riverbed.state import StateConfig, StateProvider
from riverbed.state.query import SCHEMA, read_state, read_table


def fill(provider: StateProvider) -> None:
    for part in range(3):
        for v in range(1, 4):
            store = provider.load("agg", part)
            store.put(f"h{v}|p{part}".encode(), str(v * 10 + part).encode())
            store.commit()


def test_reads_every_partition_at_a_version_while_a_writer_holds_one(
    provider: StateProvider,
) -> None:
    fill(provider)
    held = provider.load("agg", 1)  # a running task holds partition 1
    held.put(b"uncommitted", b"x")
    try:
        table = read_table(provider, "agg")
        assert table.schema == SCHEMA
        rows = sorted((r["partition"], r["key"], r["value"]) for r in table.to_pylist())
        assert len(rows) == 9 and (1, b"h3|p1", b"31") in rows
        assert b"uncommitted" not in {r[1] for r in rows}
        old = read_table(provider, "agg", version=2)
        assert set(old.column("version").to_pylist()) == {2}
        assert old.num_rows == 6
    finally:
        held.abort()
    batches = list(read_state(provider, "agg", batch_rows=2, partitions=[0]))
    assert [b.num_rows for b in batches] == [2, 1]


def test_state_cli_lists_describes_and_dumps(tmp_path: Path) -> None:
    home = tmp_path / "home"
    provider = StateProvider(
        StateConfig(
            local_dir=home / "state", durable=home / "checkpoints" / "state", snapshot_every=2
        )
    )
    fill(provider)
    env = dict(os.environ, RIVERBED_HOME=str(home))
    env.pop("RIVERBED_CHECKPOINTS", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "riverbed.cli.main", "state", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )

    ls = [json.loads(line) for line in run("ls", "--json").stdout.splitlines()]
    assert ls == [{"namespace": "agg", "partitions": 3, "latest_version": 3}]
    described = [json.loads(line) for line in run("describe", "agg", "--json").stdout.splitlines()]
    assert [d["snapshots"] for d in described] == [[2], [2], [2]]
    dumped = run("dump", "agg", "--version", "1", "--json")
    keys = sorted(json.loads(line)["key"] for line in dumped.stdout.splitlines())
    assert keys == ["h1|p0", "h1|p1", "h1|p2"]
    missing = run("dump", "nope")
    assert missing.returncode == 1 and "no state namespace 'nope'" in missing.stderr
    assert "Traceback" not in missing.stderr
