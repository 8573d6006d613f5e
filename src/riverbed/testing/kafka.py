"""A real Apache Kafka broker for tests and benchmarks: Kafka 4.x in KRaft mode (broker
and controller in one JVM, no ZooKeeper), on 127.0.0.1, keeping its log under its data
directory across restarts.

Its jars come from Maven Central (``make jars``: ``scripts/jars/kafka/pom.xml`` into
``.venv/kafka``, or ``RIVERBED_KAFKA_JARS``); nothing is downloaded here. Ready in ~10 s
on this machine (measured by :attr:`KafkaServer.ready_after`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Self

from riverbed.testing.servers import ServerError, _Server, _wait_until, free_port

__all__ = ["KafkaServer", "kafka_jars"]

ENV = "RIVERBED_KAFKA_JARS"


def kafka_jars() -> Path:
    """The broker's jar directory; :class:`ServerError` naming the fix when it is empty."""
    chosen = os.environ.get(ENV, "")
    directory = Path(chosen) if chosen else Path(sys.prefix) / "kafka"
    if not any(directory.glob("kafka_2.13-*.jar")):
        raise ServerError(
            f"no Kafka broker jars in {directory}: run `make jars` (Maven fetches Apache "
            f"Kafka from Maven Central), or set {ENV} to a directory that has them"
        )
    return directory


class KafkaServer(_Server):
    """One KRaft node under ``data`` (a fresh temporary directory unless one is given).
    :meth:`restart` keeps its topics; :meth:`pause`/:meth:`resume` SIGSTOP and SIGCONT
    it."""

    def __init__(self, data: Path | None = None, *, heap: str = "512m") -> None:
        self._own = data is None
        self.data = Path(data) if data is not None else Path(tempfile.mkdtemp(prefix="rb-kafka-"))
        self.heap = heap
        self.port = 0
        self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after = 0.0  # seconds from launch to answering metadata requests

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _properties(self) -> Path:
        path = self.data / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data / "log"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ServerError(
                "'java' is not installed; the Kafka broker needs Java 17 "
                "(apt-get install -y openjdk-17-jre-headless)"
            )
        return [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",  # starts faster; a test broker never gets hot
            "-Djava.awt.headless=true",
            "-cp",
            f"{kafka_jars()}/*",
            main,
            *args,
        ]

    def start(self) -> Self:
        self.data.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port, self.controller_port = free_port(), free_port()
        props = self._properties()
        if not (self.data / "log" / "meta.properties").exists():
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(props)
                ),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if formatted.returncode != 0:
                raise ServerError(f"formatting Kafka's log failed:\n{formatted.stderr[-2000:]}")
        log_path = self.data / "broker.log"
        began = time.monotonic()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(props)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_until(self._answers, 60, f"Kafka broker on {self.bootstrap}", log_path)
        self.ready_after = time.monotonic() - began
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(
                f"the Kafka broker exited with {self.proc.returncode}; "
                f"see {self.data / 'broker.log'}"
            )
        from confluent_kafka.admin import AdminClient

        try:
            meta = AdminClient(
                {"bootstrap.servers": self.bootstrap, "log_level": 2}  # quiet while it starts
            ).list_topics(timeout=1)
        except Exception:  # not up yet
            return False
        return bool(meta.brokers)

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic and wait until the broker serves it."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self.admin()  # alive until the answer: its futures die with it
        (future,) = admin.create_topics([NewTopic(name, partitions, 1)]).values()
        future.result(timeout=30)

    def _halt(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 30 s), keeping its data."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Stop for good: the broker, and the data directory if this server made it."""
        self._halt()
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start again on the same ports and data (topics and records kept)."""
        self._halt()
        self.start()

    def kill(self) -> None:
        """SIGKILL the broker (a crash); :meth:`start` brings it back with its data."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGCONT)
