"""Warming a standby's executors, so a takeover's first batch does not start them.

A standby driver starts its SparkSession before it waits for the lease, but a session
is not yet a warm cluster: its executors register seconds later (a JVM each, on a
loaded 2-core test host up to ~20 s), and each one's first task forks a Python worker
and imports riverbed's task modules (pyarrow, pandas, rocksdict: seconds more). Measured
on the test bed before this: the first batch after a takeover ran 14-21 s, most of it
that start-up, paid while the stream stood still. :func:`warm_up` pays it while
standing by instead: it waits for the executors the session asked for (``spark.cores.
max`` / ``spark.executor.cores``; a local master has its own) and runs a task on each
core that imports what a batch's tasks import.

The pure cores are :func:`expected_executors` and :func:`shortfall` (what a standby
says when too few executors came); the rest is I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

GROUP = "riverbed-warm-up"  # the Spark job group of the warm-up job
WAIT_S = 120.0  # how long the executors are waited for (then whatever registered)
WARM = "executors warm"  # how the standby's line says it is ready (the cluster demo waits for it)
FAILED = "warming up the executors failed"  # how it says it stays cold (and the demo stops)
ENDED = "this standby's Spark application ended while it warmed up"  # its master removed it
POLL_S = 0.25  # Spark tells no one when an executor registers: asked this often


def expected_executors(conf: dict[str, str]) -> int | None:
    """How many executors a session with Spark settings ``conf`` asks a cluster for
    (``spark.cores.max`` / ``spark.executor.cores``), or None when it does not say
    (no cap: as many as the cluster has; a local master: none)."""
    master = conf.get("spark.master", "")
    if not master or master.startswith("local"):
        return None
    try:
        cores = int(conf["spark.cores.max"])
        per = int(conf.get("spark.executor.cores", "1"))
    except (KeyError, ValueError):
        return None
    if cores < 1 or per < 1:
        return None
    return max(1, cores // per)


def shortfall(registered: int, expected: int, waited_s: float) -> str:
    """What a standby says when fewer executors than it asked for registered in
    ``waited_s`` (a cluster without free cores for it: the reason a standby would stay
    cold, said where its operator looks, not only in Spark's own log)."""
    if registered <= 0:
        return (
            f"no executor of the {expected} this standby asks for registered in "
            f"{waited_s:.0f} s (has the cluster a free core for it? its master's page "
            "says): the warm-up waits for one, and a takeover before starts them itself"
        )
    return (
        f"{registered} of the {expected} executors this standby asks for registered in "
        f"{waited_s:.0f} s: warming those (a takeover starts the rest)"
    )


def _import_task_modules(index: int) -> int:
    """Run on an executor: import what a batch's tasks import (1: a task that did)."""
    import riverbed.state.rocksdb
    import riverbed.stream.lognative  # noqa: F401 - imported to be warm, not used

    del index
    return 1


def warm_up(spark: Any, wait_s: float = WAIT_S, say: Callable[[str], None] | None = None) -> int:
    """Wait (up to ``wait_s``) for the executors the session asked for, then run one
    task per core importing riverbed's task modules; returns how many did (over Spark
    Connect: one task a core, without waiting for executors — the server has them).
    ``say`` is told when fewer executors than asked for registered in time."""
    from riverbed.spark import is_connect, tasks

    if is_connect(spark):
        tasks.tag(spark, GROUP, "")
        n = tasks.parallelism(spark)
        return int(sum(tasks.map_items(spark, list(range(n)), _import_task_modules)))
    sc = spark.sparkContext
    expected = expected_executors(dict(sc.getConf().getAll()))
    if expected is not None:
        deadline = time.monotonic() + wait_s

        def registered() -> int:  # the driver's own block manager is in the list too
            return int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1

        while registered() < expected:
            if time.monotonic() >= deadline:
                if say is not None:
                    say(shortfall(registered(), expected, wait_s))
                break
            time.sleep(POLL_S)
    n = max(1, sc.defaultParallelism)
    sc.setJobGroup(GROUP, "riverbed: warming up the executors of a standby driver")
    return int(sum(sc.parallelize(range(n), n).map(_import_task_modules).collect()))


def _ended(spark: Any) -> bool:
    """Whether ``spark`` has ended (:func:`riverbed.spark.lazy.ended`; no answer: no)."""
    from riverbed.spark.lazy import ended

    try:
        return ended(spark)
    except Exception:  # what cannot be asked has not said it stopped
        return False


def warm_up_in_background(
    spark: Any, on_warm: Callable[[str], None] | None = None
) -> threading.Thread:
    """:func:`warm_up` on a daemon thread (a standby's campaign goes on meanwhile);
    ``on_warm`` is told when it is done, and what kept it from being (too few executors
    in time, a failure: a standby that stays cold says why where its operator reads).
    A failure is never raised: a cold start is slower, not wrong."""
    from riverbed.spark.lazy import stopping

    def tell(line: str, level: int = logging.WARNING) -> None:  # (level: told no one)
        if on_warm is not None:
            on_warm(line)
        else:
            log.log(level, line)

    def run() -> None:
        began = time.monotonic()
        try:
            tasks = warm_up(spark, say=tell)
        except Exception as exc:  # a stopped session, a lost executor: only slower
            if stopping(spark):  # the driver is ending: the stop's doing, not news
                log.info("the warm-up ended with its session: %s", exc)
                return
            if _ended(spark):  # its master removed the application under it
                tell(f"{ENDED}: a takeover starts a new one (Spark's log says why)")
                return
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            tell(f"{FAILED} ({first[:300]}): a takeover starts them itself, slower, not wrong")
            return
        tell(
            f"{WARM} in {time.monotonic() - began:.1f} s: riverbed's task modules imported "
            f"on every core ({tasks})",
            logging.INFO,
        )

    thread = threading.Thread(target=run, name="riverbed warm-up", daemon=True)
    thread.start()
    return thread


__all__ = [
    "ENDED",
    "FAILED",
    "GROUP",
    "WARM",
    "expected_executors",
    "shortfall",
    "warm_up",
    "warm_up_in_background",
]
