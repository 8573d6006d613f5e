"""Run the ``riverbed`` command as a user would: a fresh process, output captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


# what Spark and the JVM print when nobody hides it
NOISE = ("log4j", "WARN ", "NativeCodeLoader", "incubator modules", "at org.apache", "Traceback")


def assert_quiet(stderr: str) -> None:
    """No Spark/Java start-up noise and no stack trace reached the terminal."""
    found = [n for n in NOISE if n in stderr]
    assert not found, f"{found} in the terminal output:\n{stderr[-3000:]}"
