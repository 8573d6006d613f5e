"""riverbed's cluster on a test bed's hosts: every part a real server.

Layout (what a three-machine deployment runs, docs/cluster.md):

* **on every host** ``hN``: an etcd member (client ``:2379``, peer ``:2380``), a Spark
  standalone worker, a log server on the diskless topics (``:8815``);
* **on the first host**: the Spark standalone master (``:7077``);
* **at the gateway** (the bridge's address, outside every host — the managed services
  of a real deployment, which a host's loss does not take): the S3 server and
  PostgreSQL.

Each server on a host is spawned through the bed, so ``kill-host`` takes it with the
host and ``restart-host`` starts it again; an etcd member whose data went with its
host rejoins as a new member (``_rejoin_etcd``, the bed's restart hook for kind
``etcd``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from riverbed.testing.s3 import CephS3Server
from riverbed.testing.servers import PostgresServer, ServerError, etcd_argv, etcd_healthy
from riverbed.testing.testbed import Service, TestBed, TestBedError

__all__ = ["ETCD_CLIENT", "LOG_PORT", "SPARK_PORT", "Cluster"]

ETCD_CLIENT, ETCD_PEER = 2379, 2380
SPARK_PORT, SPARK_UI, WORKER_UI = 7077, 8080, 8081
LOG_PORT = 8815
BUCKET = "riverbed"
GATEWAY_FILE = "gateway.json"  # the gateway's servers, for whoever destroys the bed


def _etcd_call(client_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{client_url}/v3/{path}", json=body, timeout=5)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def _rejoin_etcd(bed: TestBed, svc: Service) -> Service:
    """A member restarted without its data joins again as a new member: remove the old
    one and add it through a live member, then start with ``--initial-cluster-state
    existing`` (etcd refuses a wiped member under its old identity)."""
    peer, client = svc.meta["peer"], svc.meta["client"]
    live = [
        s.meta["client"]
        for s in bed.services()
        if s.kind == "etcd" and s.name == svc.name and s.host != svc.host and bed.alive(s)
    ]
    for url in live:
        try:
            members = _etcd_call(url, "cluster/member/list", {}).get("members", [])
            for m in members:
                if peer in m.get("peerURLs", []):
                    _etcd_call(url, "cluster/member/remove", {"ID": m["ID"]})
            _etcd_call(url, "cluster/member/add", {"peerURLs": [peer]})
            break
        except httpx.HTTPError:
            continue
    else:
        raise TestBedError(f"no live etcd member to rejoin {svc.host}'s through ({client})")
    argv = list(svc.argv)
    argv[argv.index("--initial-cluster-state") + 1] = "existing"
    svc.argv = argv
    return svc


TestBed.restart_hooks["etcd"] = _rejoin_etcd


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class Cluster:
    """The servers of riverbed's cluster on ``bed`` (see the module docstring)."""

    def __init__(self, bed: TestBed) -> None:
        self.bed = bed
        self.s3: CephS3Server | None = None
        self.postgres: PostgresServer | None = None
        self.token = ""

    def address(self, host: str) -> str:
        return self.bed.host(host).address

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.bed.plan.hosts]

    # ------------------------------------------------------------------ etcd
    def start_etcd(self, hosts: list[str] | None = None) -> str:
        """One etcd member per host; the control-plane URL of all of them."""
        hosts = hosts or self.hosts
        peers = {h: f"http://{self.address(h)}:{ETCD_PEER}" for h in hosts}
        initial = ",".join(f"{h}={url}" for h, url in peers.items())
        for h in hosts:
            client = f"http://{self.address(h)}:{ETCD_CLIENT}"
            argv = etcd_argv(
                h,
                Path("etcd"),  # relative: under the host's data directory (the cwd)
                client,
                peers[h],
                initial,
                # across hosts a partition must be noticed, not a slow fsync mistaken
                # for one: etcd's defaults (100 ms / 1 s) scaled to a busy 2-core host
                heartbeat_ms=50,
                election_ms=500,
            )
            self.bed.spawn(h, "etcd", argv, kind="etcd", meta={"peer": peers[h], "client": client})
        self.wait_etcd(hosts)
        return self.etcd_url(hosts)

    def etcd_url(self, hosts: list[str] | None = None) -> str:
        return "etcd://" + ",".join(f"{self.address(h)}:{ETCD_CLIENT}" for h in hosts or self.hosts)

    def wait_etcd(self, hosts: list[str] | None = None, timeout: float = 60) -> None:
        urls = [f"http://{self.address(h)}:{ETCD_CLIENT}" for h in hosts or self.hosts]
        self._wait(lambda: all(etcd_healthy(u, timeout=1) for u in urls), timeout, "etcd")

    # ------------------------------------------------------------------ gateway servers
    def _record_gateway(self, name: str, directory: Path) -> None:
        """Note a gateway server in the bed, so that whoever destroys the bed (``riverbed
        chaos destroy``, after this process died) stops it too."""
        path = self.bed.root / GATEWAY_FILE
        known = json.loads(path.read_text()) if path.exists() else {}
        known[name] = str(directory)
        path.write_text(json.dumps(known))

    @staticmethod
    def stop_gateway(bed: TestBed) -> list[str]:
        """Stop the gateway servers recorded in ``bed`` (the names of those stopped)."""
        path = bed.root / GATEWAY_FILE
        try:
            known: dict[str, str] = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        if "postgres" in known:
            PostgresServer.attach(Path(known["postgres"])).stop()
        if "s3" in known:
            CephS3Server(Path(known["s3"])).stop()
            shutil.rmtree(known["s3"], ignore_errors=True)
        path.unlink(missing_ok=True)
        return sorted(known)

    def start_s3(self) -> dict[str, str]:
        """The S3 server at the gateway, with the bucket; the AWS variables that reach it."""
        self.s3 = CephS3Server(self.bed.root / "gateway" / "s3", address=self.bed.plan.gateway)
        self._record_gateway("s3", self.s3.data)
        self.s3.start()
        self.s3.create_bucket(BUCKET)
        return self.s3.env()

    def start_postgres(self) -> PostgresServer:
        self.postgres = PostgresServer(address=self.bed.plan.gateway)
        self._record_gateway("postgres", self.postgres.directory)
        self.postgres.start()
        return self.postgres

    def process_env(self, host: str, control: str, log_url: str) -> dict[str, str]:
        """What a riverbed process started on ``host`` needs to reach the cluster: the
        gateway's bucket, the control plane, the log servers and their token, Spark's
        settings for the host, and a ``RIVERBED_HOME`` in the host's data directory (lost
        with it). Holds secrets: never print it."""
        return {
            **(self.s3.env() if self.s3 is not None else {}),
            "RIVERBED_HOME": "home",  # relative: the process runs in the host's directory
            "RIVERBED_CONTROL": control,
            "RIVERBED_LOG": log_url,
            "RIVERBED_LOG_TOKEN": self.token,
            "PYTHONUNBUFFERED": "1",
            **self.spark_env(host),
        }

    # ------------------------------------------------------------------ spark
    def spark_env(self, host: str) -> dict[str, str]:
        home = spark_home()
        return {
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": self.address(host),
            "SPARK_LOCAL_HOSTNAME": self.address(host),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.bed.root / "logs" / f"spark-{host}"),
            "SPARK_NO_DAEMONIZE": "1",
        }

    def start_spark(
        self,
        master: str = "h1",
        workers: list[str] | None = None,
        cores: int = 1,
        memory: str = "2g",
    ) -> str:
        """The standalone master on ``master`` and a worker on each host; its URL."""
        home = spark_home()
        url = self.spark_master_url(master)
        self.bed.spawn(
            master,
            "spark-master",
            [
                str(home / "bin" / "spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.address(master),
                "--port",
                str(SPARK_PORT),
                "--webui-port",
                str(SPARK_UI),
            ],
            env=self.spark_env(master),
            kind="spark-master",
        )
        for h in workers or self.hosts:
            self.start_spark_worker(h, url, cores, memory)
        self.wait_spark_workers(master, len(workers or self.hosts))
        return url

    def spark_master_url(self, master: str = "h1") -> str:
        return f"spark://{self.address(master)}:{SPARK_PORT}"

    def start_spark_worker(self, host: str, url: str, cores: int = 1, memory: str = "2g") -> None:
        self.bed.spawn(
            host,
            "spark-worker",
            [
                str(spark_home() / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                self.address(host),
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(WORKER_UI),
                "--work-dir",
                "spark-work",  # under the host's data directory
            ],
            env=self.spark_env(host),
            kind="spark-worker",
        )

    def spark_workers(self, master: str = "h1") -> list[dict[str, Any]]:
        """The master's view of its workers (its JSON page)."""
        try:
            r = httpx.get(f"http://{self.address(master)}:{SPARK_UI}/json/", timeout=2)
            workers: list[dict[str, Any]] = r.json().get("workers", [])
            return workers
        except (httpx.HTTPError, ValueError):
            return []

    def wait_spark_workers(self, master: str, count: int, timeout: float = 90) -> None:
        self._wait(
            lambda: sum(w.get("state") == "ALIVE" for w in self.spark_workers(master)) >= count,
            timeout,
            f"{count} Spark workers",
        )

    def driver_conf(self, host: str, master: str = "h1") -> dict[str, str]:
        """Spark settings of a driver running on ``host`` against the cluster."""
        return {
            "spark.master": self.spark_master_url(master),
            "spark.driver.host": self.address(host),
            "spark.driver.bindAddress": self.address(host),
            "spark.executor.cores": "1",
            "spark.executor.memory": "768m",
            "spark.cores.max": str(len(self.hosts)),
            # an executor on a lost or cut-off host is given up on after 10 s, not
            # Spark's 120 s, and its tasks run again elsewhere: heartbeats every second,
            # checked every second (a 2-core test host's GC pauses stay far below 10 s).
            # Not spark.network.timeout itself: that also closes a connection quiet for
            # that long, and a standalone master that loses its connection to a driver
            # (its host cut off for 20 s) removes the whole application, executors and all
            "spark.storage.blockManagerHeartbeatTimeoutMs": "10s",
            "spark.executor.heartbeatInterval": "1s",
            "spark.network.timeoutInterval": "1s",
        }

    # ------------------------------------------------------------------ log servers
    def start_log_servers(self, control: str, hosts: list[str] | None = None) -> str:
        """A log server per host on diskless topics in the bucket; the clients' URL."""
        if self.s3 is None:
            raise ServerError("start the S3 server before the log servers")
        self.token = self.token or secrets.token_hex(16)
        hosts = hosts or self.hosts
        for h in hosts:
            self.bed.spawn(
                h,
                "log-server",
                [
                    sys.executable,
                    "-m",
                    "riverbed.cli.main",
                    "log",
                    "serve",
                    "--store",
                    f"s3://{BUCKET}/log",
                    "--host",
                    self.address(h),
                    "--port",
                    str(LOG_PORT),
                ],
                env={
                    **self.s3.env(),
                    "RIVERBED_CONTROL": control,
                    "RIVERBED_LOG_TOKEN": self.token,
                    "RIVERBED_HOME": "home",
                },
                kind="log-server",
            )
        url = self.log_url(hosts)
        self._wait(lambda: all(self._answers(h, LOG_PORT) for h in hosts), 60, "log servers")
        return url

    def log_url(self, hosts: list[str] | None = None) -> str:
        return "flight://" + ",".join(f"{self.address(h)}:{LOG_PORT}" for h in hosts or self.hosts)

    # ------------------------------------------------------------------ helpers
    def _answers(self, host: str, port: int) -> bool:
        import socket

        with (
            contextlib.suppress(OSError),
            socket.create_connection((self.address(host), port), timeout=0.5),
        ):
            return True
        return False

    def _wait(self, check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"{s.host}/{s.name}: {s.log}" for s in self.bed.services() if s.log
                )
                raise ServerError(f"{what} did not come up in {timeout:.0f}s; logs:\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop everything: the hosts (the bed) and the gateway's servers."""
        try:
            self.bed.destroy()
        finally:
            self.stop_gateway(self.bed)
