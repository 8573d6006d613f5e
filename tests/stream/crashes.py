"""The kill loops of the stream chaos tests: start a driver, let it get a batch in
flight, SIGKILL its whole process group (Spark's JVM included).

A kill must land while the driver works, on a fast host and on a slow one. So the
moments are paced by the driver's own progress, not by the wall clock: the killed
drivers run until stopped (no ``--once``), each start is given a backlog of its own
(``before_start``), and the kill waits for a batch of that backlog to be planned — its
batch record exists, the batch is in flight — before a short random moment."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def backlogs(events: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    """``events`` cut into ``n`` consecutive slices of (nearly) equal size, in their
    order: one backlog for each start of a driver (and the last for the final run)."""
    bounds = [len(events) * i // n for i in range(n + 1)]
    return [events.iloc[a:b] for a, b in itertools.pairwise(bounds)]


def newest_batch(batches: Path) -> int:
    """The newest batch id recorded in a checkpoint's batch records (-1 for none).
    Counting the records would not do: the purge deletes old ones while the driver
    runs."""
    ids = [int(p.stem) for p in batches.glob("*.json") if p.stem.isdigit()]
    return max(ids, default=-1)


def kill_mid_batch(
    command: list[str],
    env: dict[str, str],
    batches: Path,
    *,
    kills: int,
    rng: random.Random,
    ahead: tuple[int, int] = (1, 3),
    within: tuple[float, float] = (0.0, 0.15),
    before_start: Callable[[int], None] | None = None,
    before_kill: Callable[[int], None] | None = None,
    logs: Path,
    timeout: float = 180.0,
) -> list[int]:
    """Start ``command`` — a driver that runs until stopped — ``kills`` times. Each
    time: call ``before_start(k)`` (give this start a backlog: more batches than
    ``ahead`` reaches), start the driver, wait until the batch ``a`` batches past the
    newest recorded before this start is planned (``a`` drawn from ``ahead``), wait a
    random moment in ``within`` seconds (inside that batch or the next: the backlog
    keeps them coming), call ``before_kill(k)``, and SIGKILL the driver's process
    group. A driver that exits on its own, or plans no such batch within ``timeout``
    seconds, fails the test with its output (each start's is kept in ``logs``).
    Returns the batch id each kill aimed at."""
    aimed: list[int] = []
    for k in range(kills):
        if before_start is not None:
            before_start(k)
        target = newest_batch(batches) + rng.randint(*ahead)
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"killed-driver-{k}.log"
        with open(log, "wb") as out:
            driver = subprocess.Popen(
                command, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + timeout
            while newest_batch(batches) < target:
                if driver.poll() is not None:
                    raise AssertionError(
                        f"start {k}: the driver exited on its own (code {driver.returncode}) "
                        f"before batch {target}:\n{log.read_text()[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    os.killpg(driver.pid, signal.SIGKILL)
                    driver.wait()
                    raise AssertionError(
                        f"start {k}: batch {target} was not planned within {timeout:.0f} s "
                        f"(newest: {newest_batch(batches)}):\n{log.read_text()[-3000:]}"
                    )
                time.sleep(0.01)  # polls a directory listing: no event to wait on
            time.sleep(rng.uniform(*within))
            if before_kill is not None:
                before_kill(k)
            if driver.poll() is not None:
                raise AssertionError(
                    f"start {k}: the driver exited on its own (code {driver.returncode}):\n"
                    f"{log.read_text()[-3000:]}"
                )
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        aimed.append(target)
    return aimed


def stream_run_killed_then_drained(
    spec: Path,
    env: dict[str, str],
    batches: Path,
    *,
    records: int,
    kills: int,
    seed: int,
    release: Callable[[int], None],
    logs: Path,
    before_drain: Callable[[], None] | None = None,
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """``riverbed stream run SPEC`` (batches of ``records``, a 3 s lease) SIGKILLed mid-
    batch ``kills`` times (:func:`kill_mid_batch`, ``release(k)`` giving start ``k`` its
    backlog), then ``release(kills)``, ``before_drain()`` and a ``--once`` drain, which
    must exit 0. Returns the command (its first three words start the CLI's other
    commands) and the drain's result."""
    import sys

    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
               "--max-records-per-batch", str(records), "--ttl", "3"]  # fmt: skip
    aimed = kill_mid_batch(command, env, batches, kills=kills, rng=random.Random(seed),
                           before_start=release, logs=logs)  # fmt: skip
    assert len(aimed) == kills
    release(kills)
    if before_drain is not None:
        before_drain()
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return command, finished
