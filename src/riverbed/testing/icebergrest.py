"""A real Iceberg REST catalog for tests: Apache Iceberg's own ``RESTCatalogServer``
(the server of the project's ``iceberg-rest-fixture`` image) in a JVM, a JDBC catalog
on SQLite behind it and a warehouse directory, both under its data directory.

Its jars come from Maven Central (``make jars``: ``scripts/jars/iceberg-rest.pom.xml``
into ``.venv/iceberg-rest``, or ``RIVERBED_ICEBERG_REST_JARS``); nothing is downloaded
here. The server takes its settings from ``CATALOG_*`` environment variables (its own
convention: ``CATALOG_REST_PORT`` is ``rest.port``); it listens on every interface of
this host (it has no host setting), and clients here reach it on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

import httpx

from riverbed.spark import TEST_JVM_OPTIONS
from riverbed.testing.servers import (
    ServerError,
    _require,
    _Server,
    _wait_until,
    free_port,
    jar_dir,
)

__all__ = ["IcebergRestServer", "iceberg_rest_jars"]

ENV = "RIVERBED_ICEBERG_REST_JARS"
MAIN = "org.apache.iceberg.rest.RESTCatalogServer"


def iceberg_rest_jars() -> Path:
    """The server's jar directory; :class:`ServerError` naming the fix when it is empty."""
    return jar_dir(
        ENV, "iceberg-rest", "iceberg-open-api-*-test-fixtures.jar", "Iceberg's REST catalog"
    )


class IcebergRestServer(_Server):
    """One REST catalog under ``data`` (a fresh temporary directory unless given):
    ``uri`` for clients, ``warehouse`` where the tables' files go."""

    def __init__(self, data: Path | None = None, *, heap: str = "256m") -> None:
        self._own = data is None
        self.data = Path(data) if data is not None else Path(tempfile.mkdtemp(prefix="rb-ice-"))
        self.heap = heap
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after = 0.0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> Path:
        return self.data / "warehouse"

    def start(self) -> Self:
        java = _require("java", "openjdk-17-jre-headless")
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = {
            **os.environ,
            "CATALOG_REST_PORT": str(self.port),
            "CATALOG_WAREHOUSE": f"file://{self.warehouse}",
            "CATALOG_URI": f"jdbc:sqlite:file:{self.data / 'catalog.db'}",
        }
        log = self.data / "server.log"
        began = time.monotonic()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [java, f"-Xmx{self.heap}", *TEST_JVM_OPTIONS.split(),
                 "-cp", f"{iceberg_rest_jars()}/*", MAIN],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _wait_until(self._answers, 60, "the Iceberg REST catalog to answer", log)
        self.ready_after = time.monotonic() - began
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(
                f"the Iceberg REST catalog exited ({self.proc.returncode}); see "
                f"{self.data / 'server.log'}"
            )
        try:
            return httpx.get(f"{self.uri}/v1/config", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)
