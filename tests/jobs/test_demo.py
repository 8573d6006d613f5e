"""``riverbed demo jobs`` as a new user runs it: real processes, two SIGKILLs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_jobs_demo_publishes_every_chunk_once_through_both_crashes(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "RIVERBED_HOME": str(tmp_path / "home"), "COLUMNS": "140"}
    out = subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", "demo", "jobs", "--days", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "SIGKILL worker-" in text and "SIGKILL orchestrator-" in text
    assert "each day's usage published exactly once: yes" in text
    assert "orchestrator failover: yes" in text
    assert "lost (worker-" in text  # the killed worker's attempt, then a second one
    published = sorted((tmp_path / "home" / "demo-jobs" / "jobs" / "output").glob("*/chunk=*"))
    assert len(published) == 4  # 2 daily chunks, 1 features, 1 report: one dir each
