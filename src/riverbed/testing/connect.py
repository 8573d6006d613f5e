"""A real Spark Connect server for tests: PySpark's own ``SparkConnectServer`` (the class
``sbin/start-connect-server.sh`` runs; its jar ships in PySpark's jars), a ``local[2]``
Spark on 127.0.0.1, listening on a free loopback port. Clients reach it at
:attr:`ConnectServer.url` (``sc://127.0.0.1:<port>``); its Python workers (a data
source's, a ``foreachBatch`` function's) run this interpreter, so they import riverbed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

from riverbed.config import child_environment
from riverbed.spark import BASE_CONF, TEST_CONF
from riverbed.spark.jars import jars, pyspark_jars
from riverbed.testing.servers import ServerError, _Server, _wait_until, free_port

CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectServer(_Server):
    """One Spark Connect server, stopped (its whole process group) on exit."""

    def __init__(
        self,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
        python: str | None = None,
    ) -> None:
        """``python``: what the server runs its Python workers with (this interpreter by
        default; a test's wrapper around it, e.g. one that holds a worker's start)."""
        self.master = master
        self.conf = conf or {}
        self.python = python or sys.executable
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="rb-connect-"))
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.port = free_port()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            # the tests' own session's settings (no UI, 2 shuffle partitions, no adaptive
            # planning, a C1 JVM): a test's jobs are small and many, as on a classic one
            **BASE_CONF,
            **TEST_CONF,
            **self.conf,
        }
        found = jars()  # the jar cache (riverbed setup jars), as riverbed's sessions have it
        if found:
            path = ":".join(str(p) for p in found)
            conf.setdefault("spark.driver.extraClassPath", path)
        command = [str(pyspark_jars().parent / "bin" / "spark-submit"), "--class", CLASS,
                   "--master", self.master]  # fmt: skip
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        env = child_environment(
            {
                "PYSPARK_PYTHON": self.python,
                "SPARK_HOME": str(pyspark_jars().parent),
                "SPARK_LOG_DIR": str(self.dir),
            }
        )
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_until(self._listening, 180, f"the Spark Connect server on port {self.port}", self.log)
        return self

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(
                f"the Spark Connect server exited ({self.proc.returncode}):\n"
                + self.log.read_text(errors="replace")[-2000:]
            )
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None


__all__ = ["ConnectServer"]
