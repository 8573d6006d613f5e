"""A real Apache Kafka broker for tests and benchmarks: Kafka 4.x in KRaft mode (broker
and controller in one JVM, no ZooKeeper), on 127.0.0.1, keeping its log under its data
directory across restarts.

Its jars come from Maven Central (``make jars``: ``scripts/jars/kafka-broker.pom.xml`` into
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
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Self

from riverbed.spark import TEST_JVM_OPTIONS
from riverbed.testing.servers import (
    ServerError,
    _require,
    _Server,
    _wait_until,
    free_port,
    jar_dir,
)

__all__ = ["KafkaCluster", "KafkaServer", "kafka_jars"]

ENV = "RIVERBED_KAFKA_JARS"


def kafka_jars() -> Path:
    """The broker's jar directory; :class:`ServerError` naming the fix when it is empty."""
    return jar_dir(ENV, "kafka", "kafka_2.13-*.jar", "Apache Kafka")


def new_cluster_id() -> str:
    """A KRaft cluster id (16 random bytes, URL-safe base64, as ``kafka-storage.sh
    random-uuid`` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaServer(_Server):
    """One KRaft node under ``data`` (a fresh temporary directory unless one is given).
    :meth:`restart` keeps its topics; :meth:`pause`/:meth:`resume` SIGSTOP and SIGCONT
    it. On its own it is a one-node cluster; :class:`KafkaCluster` makes nodes of a
    bigger one."""

    def __init__(self, data: Path | None = None, *, heap: str = "512m") -> None:
        self._own = data is None
        self.data = Path(data) if data is not None else Path(tempfile.mkdtemp(prefix="rb-kafka-"))
        self.heap = heap
        self.port = 0
        self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after = 0.0  # seconds from launch to answering metadata requests
        self._began = 0.0
        # what a node of a KafkaCluster shares with the others (one node: itself)
        self.node_id = 1
        self.voters = ""  # controller.quorum.voters; "" = this node alone
        self.cluster_id = ""  # the id every node's log is formatted with; "" = a new one
        self.replicas = 1  # replication of Kafka's own topics (offsets, transactions)
        self.brokers = 1  # how many brokers a ready cluster reports

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _properties(self) -> Path:
        path = self.data / "server.properties"
        replicas, in_sync = str(self.replicas), str(max(1, self.replicas - 1))
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data / "log"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,  # acks=all survives one node lost of three
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # tests produce records stamped with fixed dates, long past: a test broker
            # keeps them unless a topic sets its own retention, which it then applies
            # within seconds (by default the first check is 30 s after the start, then
            # one every 5 minutes)
            "log.retention.ms": "-1",
            "log.initial.task.delay.ms": "1000",
            "log.retention.check.interval.ms": "2000",
            # values of up to 16 MiB (the hostile-input suite's 10 MB strings)
            "message.max.bytes": str(16 << 20),
            "replica.fetch.max.bytes": str(16 << 20),
        }
        if self.brokers > 1:
            # a lost node of a cluster is noticed in ~3 s (default 9 s): leaders move on
            # sooner. Not for one node: a broker SIGSTOPped longer than this (the tests'
            # stalled broker, 6 s) would be fenced by its own controller on waking, and
            # its partitions be unknown until it registers again
            settings["broker.session.timeout.ms"] = "3000"
            settings["broker.heartbeat.interval.ms"] = "500"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        java = _require("java", "openjdk-17-jre-headless")
        return [
            java,
            f"-Xmx{self.heap}",
            *TEST_JVM_OPTIONS.split(),  # starts faster; a test broker never gets hot
            "-Djava.awt.headless=true",
            "-cp",
            f"{kafka_jars()}/*",
            main,
            *args,
        ]

    def start(self) -> Self:
        self.launch()
        self.wait()
        return self

    def launch(self) -> None:
        """Format the log directory the first time, and start the JVM; :meth:`wait`
        until it answers (a node of a bigger cluster answers once a quorum is up)."""
        self.data.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port, self.controller_port = free_port(), free_port()
        props = self._properties()
        if not (self.data / "log" / "meta.properties").exists():
            cluster = self.cluster_id or new_cluster_id()
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
        self._began = time.monotonic()
        with open(self.data / "broker.log", "ab") as log:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(props)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout: float = 60) -> None:
        log_path = self.data / "broker.log"
        _wait_until(self._answers, timeout, f"Kafka broker on {self.bootstrap}", log_path)
        self.ready_after = time.monotonic() - self._began

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
        return len(meta.brokers) >= self.brokers

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1, replicas: int = 1) -> None:
        """Create a topic and wait until the broker serves it."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self.admin()  # alive until the answer: its futures die with it
        (future,) = admin.create_topics([NewTopic(name, partitions, replicas)]).values()
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


class KafkaCluster(_Server):
    """``n`` KRaft nodes (each broker and controller; a quorum of all ``n``) on
    127.0.0.1, Kafka's own topics and new topics replicated ``n`` times with
    ``min.insync.replicas`` = n - 1: with three, a producer with ``acks=all`` and a
    transaction go on while any one node is down. :meth:`kill` and :meth:`start_node`
    take one node down and bring it back with its data."""

    def __init__(self, n: int = 3, data: Path | None = None, *, heap: str = "384m") -> None:
        self._own = data is None
        self.data = Path(data) if data is not None else Path(tempfile.mkdtemp(prefix="rb-kafka-"))
        self.nodes = [KafkaServer(self.data / f"node{i + 1}", heap=heap) for i in range(n)]
        cluster_id = new_cluster_id()
        for i, node in enumerate(self.nodes):
            node.port, node.controller_port = free_port(), free_port()
            node.node_id, node.cluster_id = i + 1, cluster_id
            node.replicas = node.brokers = n
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        for node in self.nodes:
            node.voters = voters

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> Self:
        for node in self.nodes:  # all at once: none answers before a quorum is up
            node.launch()
        for node in self.nodes:
            node.wait(120)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node._halt()
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (0-based): a lost machine, its data kept."""
        self.nodes[i].kill()

    def start_node(self, i: int) -> None:
        """Bring node ``i`` back on its ports with its data; return once it answers
        and the cluster reports all its brokers again."""
        self.nodes[i].launch()
        self.nodes[i].wait(120)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """A topic replicated on every node; returns once the brokers serve it."""
        self.nodes[0].create_topic(name, partitions, replicas=len(self.nodes))
