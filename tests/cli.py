"""Run the ``riverbed`` command as a user would: a fresh process, output captured."""

from __future__ import annotations

import subprocess
import sys


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
