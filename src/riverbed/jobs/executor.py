"""The child process that runs chunks for a worker, one at a time, kept warm.

A worker keeps up to ``concurrency`` executors. Each is a spawned process in its own
process group that receives a chunk over a pipe, runs ``main(ctx, work_ids,
**kwargs)`` with stdout/stderr going to the attempt's log file, and answers
``{"ok": True, "output": bool}`` or ``{"ok": False, "error": traceback}``. Cancelling
or timing out a chunk kills the executor's process group (a Spark executor's JVM dies
with its driver's stdin) and the worker starts a fresh one.

Spark jobs get one SparkSession per executor, created on the first Spark chunk and
kept across chunks, so only the first pays the JVM start; each chunk runs in its own
job group.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from riverbed.config import Config, SparkConfig, load_config
from riverbed.jobs.context import ChunkOutput, Context, staging_dir
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.spec import Catalog
from riverbed.processes import kill_session

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _redirected(log_path: Path) -> Iterator[None]:
    """Send fds 1 and 2 (the job's prints, and its subprocesses') to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(fd)
        os.close(saved[0])
        os.close(saved[1])


def chunk_spark(config: Config | None, master: str | None) -> SparkConfig:
    """The Spark settings a chunk's session starts with: the configuration's
    (``[spark]`` of riverbed.toml, ``RIVERBED_SPARK_CONF``; read here when not given),
    on ``master`` when the worker was given one."""
    spark = (config if config is not None else load_config()).spark
    return replace(spark, master=master) if master else spark


class ChunkRunner:
    """Runs chunks in this process (an executor child, or the development runner)."""

    def __init__(
        self,
        jobs_dir: Path,
        home: Path,
        spark_config: SparkConfig | None,
        checkpoints: str | None = None,
        config: Config | None = None,
    ) -> None:
        self.config = config
        self.jobs_dir = jobs_dir
        self.home = home
        self.publication = open_publication(home, checkpoints)
        self.spark_config = spark_config
        self.catalog = Catalog(jobs_dir)
        self._spark: Any = None
        self._bound: dict[str, str | None] = {}  # each job's table, as last recorded

    def spark(self) -> Any:
        if self._spark is None:
            from riverbed.spark import session

            self._spark = session(self.spark_config)
        return self._spark

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one claimed chunk; never raises (the answer says what happened)."""
        chunk_id, attempt = int(req["id"]), int(req["attempt"])
        try:
            loaded = self.catalog.get(req["job"])
            if req.get("code_version") and loaded.code_version != req["code_version"]:
                self.catalog = Catalog(self.jobs_dir)  # the module changed: import it again
                for name in [n for n in sys.modules if n == f"riverbed_jobs_{req['job']}"]:
                    del sys.modules[name]
                loaded = self.catalog.get(req["job"])
            if self._bound.get(req["job"], "") != loaded.spec.table:  # once per change
                self.publication.bind_table(req["job"], loaded.spec.table)
                self._bound[req["job"]] = loaded.spec.table
            ctx = Context(
                chunk_id=chunk_id,
                attempt=attempt,
                job=req["job"],
                work_ids=list(req["work_ids"]),
                kwargs=dict(req["kwargs"]),
                master=req.get("master"),
                output=ChunkOutput(staging_dir(self.home, chunk_id, attempt)),
                home=self.home,
                publication=self.publication,
                spec_path=loaded.path,
                code_version=loaded.code_version,
                config=self.config,
            )
            if loaded.spec.kind == "spark":
                ctx._spark = self.spark()
                ctx._spark.sparkContext.setJobGroup(
                    f"riverbed-chunk-{chunk_id}-{attempt}",
                    f"riverbed job {req['job']} chunk {chunk_id} attempt {attempt}",
                    interruptOnCancel=True,
                )
            loaded.spec.main(ctx, list(req["work_ids"]), **dict(req["kwargs"]))
            return {"ok": True, "output": ctx.output.used, "version": loaded.code_version}
        except BaseException as exc:  # the job's failure is data for the queue
            if isinstance(exc, KeyboardInterrupt):
                raise
            return {"ok": False, "error": traceback.format_exc()}


def _stop_with_the_worker() -> None:
    """When the worker that spawned this executor dies (SIGKILL, OOM), stop at once:
    the chunk's claim dies with the worker's lease and another attempt reruns it, so
    finishing it here is wasted and could only be fenced. One log line, no traceback;
    the job's own children (a Spark JVM, PySpark's daemon) go with the session."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        log.warning(
            "executor %s: its worker (pid %s) is gone; stopping its chunk and exiting",
            os.getpid(),
            parent.pid,
        )
        for handler in logging.getLogger("riverbed").handlers:
            handler.flush()
        with contextlib.suppress(OSError):
            kill_session(os.getsid(0), timeout=10)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="riverbed-executor-watch", daemon=True).start()


def executor_main(
    conn: Connection,
    jobs_dir: str,
    home: str,
    spark_master: str | None,
    checkpoints: str | None = None,
    config: Config | None = None,
) -> None:
    """Entry point of an executor child (spawned by the worker), with the worker's
    settings (else read here, as any entry point reads them)."""
    with contextlib.suppress(OSError):
        # its own session: cancel and timeout kill the whole session, the job's own
        # children included (a Spark JVM and PySpark's daemon, which leaves the group)
        os.setsid()
    # ctx.log (and riverbed's own INFO lines) go to fd 2: the attempt's log file.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("riverbed").addHandler(handler)
    logging.getLogger("riverbed").setLevel(logging.INFO)
    _stop_with_the_worker()
    if config is None:
        config = load_config()
    spark_config = chunk_spark(config, spark_master)
    runner = ChunkRunner(Path(jobs_dir), Path(home), spark_config, checkpoints, config)
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return  # the worker closed the pipe, or died: nothing to answer
        if req is None:
            return
        with _redirected(Path(req["log"])):
            answer = runner.run(req)
            if not answer["ok"]:
                print(answer["error"], file=sys.stderr)  # noqa: T201 - into the attempt's log
        try:
            conn.send(answer)
        except OSError:  # BrokenPipeError, ConnectionResetError: the worker is gone
            log.warning("executor %s: its worker is gone; the answer is dropped", os.getpid())
            return
