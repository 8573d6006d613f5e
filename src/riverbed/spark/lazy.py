"""A Spark session that starts when a Spark job first needs it.

A log-native driver runs a small batch in its own process (a local master,
:func:`riverbed.stream.lognative.in_driver`): one whose batches are all small never
needs Spark's JVM — a ``riverbed stream run --once`` over a small backlog, the usual
run of a cron'd aggregation. :class:`DeferredSession` stands in for the session until
something asks it for what only a running Spark has (a job, the SparkContext, the
status tracker), then starts it once and is it from then on. What riverbed asks of a
session without running a job it answers from its configuration:

* the master (only local masters are deferred: a cluster's driver is where its
  executors register, and its standby keeps it warm — ``stream run`` starts it then);
* the parallelism Spark's local scheduler would give (``spark.default.parallelism``,
  else ``local[N]``'s N, ``local[*]``'s cores, ``local``'s 1): how a batch's partitions
  are grouped into its tasks — the same results whichever it is;
* a thread's job group (:func:`riverbed.spark.tasks.tag`), kept and set in that thread
  the first time it reaches the started session, so a job it starts can be interrupted.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import weakref
from typing import Any

from riverbed.config import SparkConfig
from riverbed.errors import InvalidValueError


class DeferredSession:
    """A local Spark session not started yet (see the module's doc)."""

    def __init__(self, config: SparkConfig) -> None:
        global _LAST
        _LAST = weakref.ref(self)
        self._config = config
        self._started: Any = None
        self._lock = threading.Lock()
        # what each thread asked of the session before it started: set in that thread
        # when it first reaches the started session (Spark keeps them per thread)
        self._groups: dict[int, tuple[str, str]] = {}  # thread ident -> (group, description)
        self._descriptions: dict[int, str | None] = {}  # thread ident -> the next jobs' text

    @property
    def started(self) -> bool:
        return self._started is not None

    @property
    def master(self) -> str:
        return self._config.master

    @property
    def parallelism(self) -> int:
        return local_parallelism(self._config.master, self._config.conf, os.cpu_count() or 1)

    def tag(self, name: str, description: str) -> None:
        """This thread's jobs go to group ``name`` (:func:`riverbed.spark.tasks.tag`)."""
        with self._lock:
            started = self._started
            if started is None:
                self._groups[threading.get_ident()] = (name, description)
                self._descriptions.pop(threading.get_ident(), None)
                return
        started.sparkContext.setJobGroup(name, description, interruptOnCancel=True)

    def describe(self, text: str | None) -> None:
        """This thread's next jobs are described so (:func:`riverbed.spark.tasks.describe`)."""
        with self._lock:
            started = self._started
            if started is None:
                self._descriptions[threading.get_ident()] = text
                return
        started.sparkContext.setJobDescription(text)

    def start(self) -> Any:
        """The session, started now if it was not: the real ``SparkSession``."""
        with self._lock:
            if self._started is None:
                from riverbed.spark import session

                self._started = session(self._config)
            me = threading.get_ident()
            group = self._groups.pop(me, None)
            described = me in self._descriptions
            text = self._descriptions.pop(me, None)
        if group is not None:
            self._started.sparkContext.setJobGroup(*group, interruptOnCancel=True)
        if described:
            self._started.sparkContext.setJobDescription(text)
        return self._started

    def stop(self) -> None:
        """Stop the session if it was started (nothing to stop otherwise)."""
        if self._started is not None:
            self._started.stop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.start(), name)

    def __repr__(self) -> str:
        state = "started" if self.started else "not started"
        return f"<DeferredSession {self._config.master} ({state})>"


def deferred(config: SparkConfig) -> Any:
    """A session for ``config`` that starts when first needed — for a local master; any
    other master's session is started now."""
    from riverbed.spark import session, tasks_in_this_process

    if tasks_in_this_process(config.master):
        return DeferredSession(config)
    return session(config)


def start_now(spark: object) -> None:
    """Start ``spark`` now if it is a deferred session not started yet (a standby's,
    before its wait: it takes over with Spark warm); any other is started already."""
    if isinstance(spark, DeferredSession):
        spark.start()


def ended(spark: object) -> bool:
    """Whether a started classic session's SparkContext has stopped under it: a
    cluster's master removed its application (no master answered its registration,
    its executors failed again and again), and every job it is given fails. A session
    not started yet, or a Spark Connect client, has not."""
    from riverbed.spark import is_connect

    if isinstance(spark, DeferredSession):
        spark = spark._started
        if spark is None:
            return False
    if is_connect(spark):
        return False
    jsc = getattr(getattr(spark, "sparkContext", None), "_jsc", None)
    if jsc is None:  # stopped from Python
        return True
    try:
        return bool(jsc.sc().isStopped())
    except Exception:  # the JVM itself is gone: ended as well
        return True


# the sessions this process is stopping itself (its driver's end): their jobs' failures
# are the stop's, not news (a standby's warm-up says nothing of them)
_STOPPING: weakref.WeakSet[Any] = weakref.WeakSet()


def stop(spark: Any) -> None:
    """Stop ``spark`` as this driver's own end (what :func:`stopping` then says)."""
    _STOPPING.add(spark)
    spark.stop()


def stopping(spark: object) -> bool:
    """Whether this process stopped ``spark`` itself (:func:`stop`)."""
    try:
        return spark in _STOPPING
    except TypeError:  # what cannot be weakly referenced was never added
        return False


def revived(spark: Any, config: SparkConfig) -> Any:
    """``spark``, or — when it has :func:`ended` — a new session for ``config`` (the
    ended one stopped first: PySpark would hand it back otherwise)."""
    if not ended(spark):
        return spark
    with contextlib.suppress(Exception):  # what stopping an ended context can raise
        spark.stop()
    return deferred(config)


# the last deferred session made in this process, for what PySpark asks of "the active
# session" rather than of a session it was given (parsing a DDL it cannot parse without one)
_LAST: weakref.ref[DeferredSession] | None = None


def start_deferred() -> None:
    """Start this process's deferred session, if one waits: PySpark is about to use the
    active session (a schema's DDL that :mod:`riverbed.spark.ddl` does not read)."""
    waiting = _LAST() if _LAST is not None else None
    if waiting is not None:
        waiting.start()


def unstarted(spark: object) -> bool:
    """Whether ``spark`` is a :class:`DeferredSession` that has not started Spark yet."""
    return isinstance(spark, DeferredSession) and not spark.started


_LOCAL = re.compile(r"local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?")


def local_parallelism(master: str, conf: Any, cores: int) -> int:
    """The default parallelism Spark's local scheduler gives ``master`` with ``conf``:
    ``spark.default.parallelism`` when set, else the master's thread count."""
    found = str(conf.get("spark.default.parallelism") or "").strip()
    if found:
        if not found.isdigit() or int(found) < 1:
            raise InvalidValueError(
                f"spark.default.parallelism is {found!r}: give a whole number of tasks, 1 or more"
            )
        return int(found)
    matched = _LOCAL.fullmatch(master.strip())
    if matched is None:
        raise InvalidValueError(f"{master!r} is not a local master (local, local[N], local[*])")
    threads = matched.group(1)
    if threads is None:
        return 1
    return cores if threads == "*" else int(threads)
