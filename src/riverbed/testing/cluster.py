"""riverbed's cluster on a test bed's hosts: every part a real server.

Layout (what a three-machine deployment runs, docs/cluster.md):

* **on every host** ``hN``: an etcd member (client ``:2379``, peer ``:2380``), a Spark
  standalone worker, a log server on the diskless topics (``:8815``), and — for a
  standby Spark master — a ZooKeeper member (``:2181``, quorum ``:2888``/``:3888``);
* **on the first host**: the Spark standalone master (``:7077``); with ``standby=``,
  a second master on that host, the two elected through ZooKeeper
  (``spark.deploy.recoveryMode=ZOOKEEPER``, Spark's own high availability): workers and
  drivers are given both (``spark://h1:7077,h2:7077``) and follow the leader;
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

from riverbed.spark import TEST_JVM_CONF, TEST_JVM_OPTIONS
from riverbed.spark.discovery import master_page
from riverbed.testing.s3 import CephS3Server
from riverbed.testing.servers import PostgresServer, ServerError, etcd_argv, etcd_healthy
from riverbed.testing.testbed import Service, TestBed, TestBedError

__all__ = ["ETCD_CLIENT", "LOG_PORT", "SPARK_PORT", "Cluster"]

ETCD_CLIENT, ETCD_PEER = 2379, 2380
SPARK_PORT, SPARK_UI, WORKER_UI = 7077, 8080, 8081
ZK_CLIENT, ZK_QUORUM, ZK_ELECTION = 2181, 2888, 3888
# ZooKeeper's session timeout is how soon a standby master sees the active one is gone:
# Spark's Curator asks 60 s, a ZooKeeper server grants at most maxSessionTimeout
ZK_TICK_MS, ZK_SESSION_MAX_MS = 250, 4000
# with a standby master: how soon a master gives up on a silent worker (Spark: 60 s) —
# a recovering master waits this long for a worker lost with the old master's host
WORKER_TIMEOUT_S = 10
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


def master_summary(host: str, page: dict[str, Any]) -> list[str]:
    """Lines of a standalone master's JSON ``page``: its status, each worker's cores
    in use, each application's cores and state (one line when it did not answer)."""
    if not page:
        return [f"Spark master on {host}: does not answer"]
    lines = [
        f"Spark master on {host}: {page.get('status', '?')}, "
        f"{page.get('coresused', '?')} of {page.get('cores', '?')} cores in use"
    ]
    for w in page.get("workers", []):
        lines.append(
            f"  worker {w.get('host', '?')}:{w.get('port', '?')} {w.get('state', '?')}: "
            f"{w.get('coresused', '?')} of {w.get('cores', '?')} cores in use"
        )
    for kind in ("activeapps", "completedapps"):
        for a in page.get(kind, []):
            lines.append(
                f"  {'app' if kind == 'activeapps' else 'ended app'} {a.get('name', '?')} "
                f"({a.get('id', '?')}) {a.get('state', '?')}: {a.get('cores', '?')} cores"
            )
    return lines


class Cluster:
    """The servers of riverbed's cluster on ``bed`` (see the module docstring)."""

    def __init__(self, bed: TestBed) -> None:
        self.bed = bed
        self.s3: CephS3Server | None = None
        self.postgres: PostgresServer | None = None
        self.token = ""
        self.zookeeper: list[str] = []  # the hosts of the ensemble
        self.masters: list[str] = []  # the Spark masters' hosts, the first one first

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
            # the Spark sessions of the host's own processes (a jobs worker's, a time-range
            # driver's, each on a local master) in the test bed's JVMs, as its masters',
            # workers' and the cluster's drivers' (driver_conf, which a driver of the
            # cluster gets instead): C2 and G1 took 1.7-1.9x the CPU in these short JVMs
            "RIVERBED_SPARK_CONF": json.dumps(TEST_JVM_CONF),
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
            # masters and workers: small daemons of a short test (a C1 JVM starts and
            # runs them on less CPU, as the tests' drivers and executors)
            "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS,
        }

    def start_spark(
        self,
        master: str = "h1",
        workers: list[str] | None = None,
        cores: int = 1,
        memory: str = "2g",
        standby: str | None = None,
        control: str | None = None,
    ) -> str:
        """The standalone master on ``master`` (and, with ``standby``, a second one
        there, elected through the ZooKeeper ensemble :meth:`start_zookeeper` started)
        and a worker on each host; the masters' URL. With ``control``, beside each
        master a ``riverbed control spark-master`` announcing it there (drivers given
        the master ``riverbed`` find them: :mod:`riverbed.spark.discovery`)."""
        self.masters = [master] if standby is None else [master, standby]
        if standby is not None and not self.zookeeper:
            raise ServerError("start_zookeeper() before a standby Spark master")
        url = self.spark_master_url()
        for m in self.masters:
            extra = [] if standby is None else ["--properties-file", str(self._spark_ha_conf(m))]
            self.bed.spawn(
                m,
                "spark-master",
                [
                    str(spark_home() / "bin" / "spark-class"),
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    self.address(m),
                    "--port",
                    str(SPARK_PORT),
                    "--webui-port",
                    str(SPARK_UI),
                    *extra,
                ],
                env=self.spark_env(m),
                kind="spark-master",
            )
            if control is not None:
                announcer = [
                    sys.executable, "-m", "riverbed.cli.main", "control", "--url", control,
                    "spark-master", self.spark_master_url(m),
                    "--ui", f"http://{self.address(m)}:{SPARK_UI}", "--ttl", "5",
                ]  # fmt: skip
                env = {**self.spark_env(m), "PYTHONUNBUFFERED": "1"}
                self.bed.spawn(m, "spark-master-presence", announcer, env=env, kind="presence")
            if m == master:  # the first one leads: the other waits as the standby
                self._wait(lambda: self.master_status(master) == "ALIVE", 90, "the Spark master")
        for h in workers or self.hosts:
            self.start_spark_worker(h, url, cores, memory)
        self.wait_spark_workers(master, len(workers or self.hosts))
        return url

    def _spark_ha_conf(self, host: str) -> Path:
        """Spark's high availability through ZooKeeper: the properties file of the
        master on ``host``. It talks to its own host's ZooKeeper member only: Spark's
        masters give up leadership (and exit) the moment their ZooKeeper connection
        is suspended, so a master connected to another host's member was lost with
        that member's partition (measured: the cut of h3 took the leader on h1 with
        it). ``spark.worker.timeout``: :data:`WORKER_TIMEOUT_S`, the workers' too."""
        conf = self.bed.root / "conf" / f"spark-ha-{host}.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        own = host in self.zookeeper
        conf.write_text(
            "spark.deploy.recoveryMode ZOOKEEPER\n"
            "spark.deploy.zookeeper.url "
            f"{f'{self.address(host)}:{ZK_CLIENT}' if own else self.zookeeper_url()}\n"
            "spark.deploy.zookeeper.dir /riverbed-spark\n"
            f"spark.worker.timeout {WORKER_TIMEOUT_S}\n"
        )
        return conf

    def spark_master_url(self, master: str | None = None) -> str:
        """``spark://`` of ``master``, else of every master started (the standby too:
        workers and drivers find the leader among them)."""
        hosts = [master] if master else self.masters or ["h1"]
        return "spark://" + ",".join(f"{self.address(h)}:{SPARK_PORT}" for h in hosts)

    def _master_page(self, host: str) -> dict[str, Any]:
        """The master on ``host``'s JSON page ({} when it does not answer)."""
        return master_page(f"http://{self.address(host)}:{SPARK_UI}") or {}

    def master_status(self, host: str) -> str | None:
        """ALIVE (leading), STANDBY, RECOVERING …, or None when it does not answer."""
        status = self._master_page(host).get("status")
        return str(status) if status else None

    def active_master(self) -> str | None:
        """The host of the leading Spark master, if one leads."""
        return next((m for m in self.masters if self.master_status(m) == "ALIVE"), None)

    def spark_summary(self) -> list[str]:
        """What each Spark master says of its workers and applications (a failed
        scenario's evidence: which cores were free, which application waited)."""
        return [line for m in self.masters for line in master_summary(m, self._master_page(m))]

    def spark_apps(self, master: str) -> list[dict[str, Any]]:
        """The applications ``master`` runs (its JSON page)."""
        apps: list[dict[str, Any]] = self._master_page(master).get("activeapps", [])
        return apps

    # ------------------------------------------------------------------ zookeeper
    def start_zookeeper(self, hosts: list[str] | None = None, leader: str | None = None) -> str:
        """A ZooKeeper ensemble, a member on each host (ZooKeeper 3.9 from PySpark's own
        jars); its connect string once a quorum serves. A member's data goes with its
        host; restarted empty, it syncs from the leader (the wrapper writes its
        ``myid`` again). ``leader``'s member is made the ensemble's leader: it gets the
        highest id and starts with one other (of equal data, the highest id wins the
        election), the rest join them — a scenario that cuts a host off chooses which
        member's loss forces an election (one suspends every Spark master's session)."""
        hosts = list(hosts or self.hosts)
        if leader is not None:  # the leader last: the highest id
            hosts = [h for h in hosts if h != leader] + [leader]
        self.zookeeper = hosts
        conf = self.bed.root / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        servers = "".join(
            f"server.{i}={self.address(h)}:{ZK_QUORUM}:{ZK_ELECTION}\n"
            for i, h in enumerate(hosts, 1)
        )
        jars = f"{spark_home() / 'jars'}/*"
        first = hosts[-2:] if leader is not None and len(hosts) > 2 else hosts
        members = {h: i for i, h in enumerate(hosts, 1)}
        for h in [*first, *(h for h in hosts if h not in first)]:
            i = members[h]
            cfg = conf / f"zookeeper-{h}.cfg"
            cfg.write_text(
                f"tickTime={ZK_TICK_MS}\ninitLimit=40\nsyncLimit=20\n"
                "dataDir=zookeeper\n"  # under the host's data directory (its cwd)
                f"clientPortAddress={self.address(h)}\nclientPort={ZK_CLIENT}\n"
                f"maxSessionTimeout={ZK_SESSION_MAX_MS}\nminSessionTimeout={ZK_TICK_MS * 2}\n"
                "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n" + servers
            )
            script = (
                f"mkdir -p zookeeper && echo {i} > zookeeper/myid && exec java -Xmx128m "
                f"-cp '{jars}' org.apache.zookeeper.server.quorum.QuorumPeerMain '{cfg}'"
            )
            self.bed.spawn(h, "zookeeper", ["sh", "-c", script], kind="zookeeper")
            if h == first[-1]:  # the first ones elected their leader before the others
                self.wait_zookeeper(first)
        self.wait_zookeeper(hosts)
        if leader is not None and self.zookeeper_mode(leader) != "leader":
            raise ServerError(f"ZooKeeper on {leader} did not become the ensemble's leader")
        return self.zookeeper_url()

    def zookeeper_url(self) -> str:
        return ",".join(f"{self.address(h)}:{ZK_CLIENT}" for h in self.zookeeper)

    def zookeeper_mode(self, host: str) -> str | None:
        """``leader``, ``follower``, or None (not serving: no quorum, or not up)."""
        import socket

        try:
            with socket.create_connection((self.address(host), ZK_CLIENT), timeout=2) as s:
                s.sendall(b"srvr")
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
        except OSError:
            return None
        for line in answer.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def wait_zookeeper(self, hosts: list[str] | None = None, timeout: float = 90) -> None:
        """Until every one of ``hosts`` (default: the ensemble, if any) serves in the
        quorum."""
        hosts = hosts or self.zookeeper
        if not hosts:
            return
        self._wait(
            lambda: all(self.zookeeper_mode(h) in ("leader", "follower") for h in hosts),
            timeout,
            f"ZooKeeper on {' '.join(hosts)}",
        )

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
                *(["--properties-file", str(self._worker_conf())] if len(self.masters) > 1 else []),
            ],
            env=self.spark_env(host),
            kind="spark-worker",
        )

    def _worker_conf(self) -> Path:
        """The workers' side of the masters' ``spark.worker.timeout``: a worker
        heartbeats every quarter of its own setting — with Spark's 60 s every 15 s, and
        a master expecting one within 10 s removed workers (and told their applications
        their executors were lost) every other heartbeat."""
        conf = self.bed.root / "conf" / "spark-worker.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(f"spark.worker.timeout {WORKER_TIMEOUT_S}\n")
        return conf

    def spark_workers(self, master: str = "h1") -> list[dict[str, Any]]:
        """``master``'s view of its workers (its JSON page)."""
        workers: list[dict[str, Any]] = self._master_page(master).get("workers", [])
        return workers

    def wait_spark_workers(self, master: str, count: int, timeout: float = 90) -> None:
        self._wait(
            lambda: sum(w.get("state") == "ALIVE" for w in self.spark_workers(master)) >= count,
            timeout,
            f"{count} Spark workers",
        )

    def driver_conf(self, host: str) -> dict[str, str]:
        """Spark settings of a driver running on ``host`` against the cluster (every
        master: with a standby, the driver follows the leader)."""
        return {
            "spark.master": self.spark_master_url(),
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
            # the test bed's JVMs, as its masters' and workers' (SPARK_DAEMON_JAVA_OPTS)
            **TEST_JVM_CONF,
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
