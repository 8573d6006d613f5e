"""The kill loop of the stream chaos tests: start a driver, let it get a batch in
flight, SIGKILL its whole process group (Spark's JVM included) at a random moment."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def kill_while_batches_run(
    command: list[str],
    env: dict[str, str],
    batches: Path,
    *,
    kills: int,
    rng: random.Random,
    delay: tuple[float, float],
    before_kill: Callable[[int], None] | None = None,
    must_run: bool = False,
) -> int:
    """Start ``command`` ``kills`` times. Each time wait (up to 120 s) for the
    checkpoint's batch records directory ``batches`` to exist — the JVM is up and a batch
    is in flight — then a random moment in ``delay`` seconds, call ``before_kill(k)``,
    and SIGKILL the driver's process group. A driver that finished first is not killed
    (an AssertionError when ``must_run``). Returns how many kills landed."""
    landed = 0
    for k in range(kills):
        driver = subprocess.Popen(
            command,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not batches.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(rng.uniform(*delay))
        if before_kill is not None:
            before_kill(k)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            landed += 1
        elif must_run:
            raise AssertionError(f"the driver exited on its own (code {driver.returncode})")
        driver.wait()
    return landed
