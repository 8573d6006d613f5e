"""`riverbed topic|produce|consume|group` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, RIVERBED_HOME=str(home))
    for name in ("RIVERBED_LOG", "RIVERBED_CONTROL"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_topic_produce_consume_group(tmp_path: Path) -> None:
    assert (
        run(
            tmp_path,
            "topic",
            "create",
            "clicks",
            "--partitions",
            "3",
            "--retention",
            "7d",
            "--retention-bytes",
            "1G",
        ).returncode
        == 0
    )
    lines = "".join(json.dumps({"user": f"u{i % 7}", "i": i}) + "\n" for i in range(120))
    produced = run(tmp_path, "produce", "clicks", "--key-field", "user", "--json", stdin=lines)
    assert json.loads(produced.stdout) == {"topic": "clicks", "records": 120}
    described = json.loads(run(tmp_path, "topic", "describe", "clicks", "--json").stdout)
    assert described["retention_ms"] == 7 * 86_400_000
    assert sum(o["end"] for o in described["offsets"]) == 120
    consumed = run(
        tmp_path,
        "consume",
        "clicks",
        "--group",
        "g",
        "--from-beginning",
        "--max",
        "50",
        "--ttl",
        "2",
    )
    first = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(first) == 50
    rest = run(tmp_path, "consume", "clicks", "--group", "g", "--timeout", "1", "--ttl", "2")
    second = [json.loads(line) for line in rest.stdout.splitlines()]
    coords = {(r["partition"], r["offset"]) for r in first + second}
    assert len(first) + len(second) == 120 and len(coords) == 120  # committed, no repeats
    group = json.loads(run(tmp_path, "group", "describe", "g", "--json").stdout)
    assert sum(p["lag"] for p in group["partitions"]) == 0
    assert run(tmp_path, "group", "list").stdout.split() == ["g"]
    before = json.loads(run(tmp_path, "topic", "describe", "clicks", "--json").stdout)
    ends = [o["end"] for o in before["offsets"]]
    altered = run(tmp_path, "topic", "alter", "clicks", "--partitions", "5")
    assert altered.returncode == 0 and "→ 5 partitions" in altered.stdout
    starts = " ".join(f"{p}:{e}" for p, e in enumerate(ends))
    assert f"placed by 5 from offsets {starts} on" in altered.stdout
    described = json.loads(run(tmp_path, "topic", "describe", "clicks", "--json").stdout)
    assert len(described["offsets"]) == 5
    assert described["epochs"] == [{"partitions": 5, "starts": ends}]
    assert f"from offsets {starts}" in run(tmp_path, "topic", "describe", "clicks").stdout
    again = run(tmp_path, "topic", "add-partitions", "clicks", "--partitions", "5")
    assert again.returncode == 0 and "nothing changed" in again.stdout


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    run(tmp_path, "topic", "create", "t", "--partitions", "1")
    bad = run(tmp_path, "produce", "t", stdin='{"ok": 1}\n{bad\n')
    assert bad.returncode == 1 and "line 2 is not JSON" in bad.stderr
    assert "the 1 records before it were produced" in bad.stderr
    missing = run(tmp_path, "consume", "nope", "--group", "g")
    assert missing.returncode == 1 and "riverbed topic create nope" in missing.stderr
    exists = run(tmp_path, "topic", "create", "t", "--partitions", "1")
    assert exists.returncode == 1 and "already exists" in exists.stderr
    shrink = run(tmp_path, "topic", "alter", "t", "--partitions", "0")
    assert shrink.returncode != 0 and "never removed" in shrink.stderr
    for out in (bad, missing, exists, shrink):
        assert "Traceback" not in out.stderr
