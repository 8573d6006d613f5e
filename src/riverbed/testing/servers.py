"""Real etcd, PostgreSQL and MariaDB servers for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from riverbed.errors import RiverbedError


class ServerError(RiverbedError):
    """A test server could not be started."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_HANDED_OUT: set[int] = set()  # free_port's answers in this process

# "<low>-<high>": the ports free_port draws from in this process and its children. Test
# runners that run several processes side by side (pytest-xdist workers) give each its
# own slice (port_slice), so two of them never choose one port between its check and
# its server's bind.
PORTS_ENV = "RIVERBED_TEST_PORTS"
_PORTS_BELOW_EPHEMERAL = 12000  # how far below the ephemeral range free_port reaches


def port_range(ephemeral_low: int) -> tuple[int, int]:
    """The ports free_port draws from when nothing narrows it: the ~12,000 below the
    kernel's ephemeral range (none below 1024)."""
    ceiling = max(ephemeral_low - 1, 2000)
    return max(1024, ceiling - _PORTS_BELOW_EPHEMERAL), ceiling


def host_port_range() -> tuple[int, int]:
    """:func:`port_range` below this machine's ephemeral range."""
    return port_range(_ephemeral_range()[0])


def port_slice(low: int, high: int, index: int, count: int) -> tuple[int, int]:
    """The ``index``-th of ``count`` disjoint slices of ``low..high`` (inclusive), as
    even as they divide; every slice holds at least one port when there are enough."""
    if not 0 <= index < count:
        raise ServerError(f"no slice {index} of {count}: the index must be in 0..{count - 1}")
    size = high - low + 1
    return low + size * index // count, low + size * (index + 1) // count - 1


def _drawn_range() -> tuple[int, int]:
    text = os.environ.get(PORTS_ENV, "")
    if text:
        try:
            low, high = (int(part) for part in text.split("-"))
        except ValueError:
            raise ServerError(
                f"{PORTS_ENV}={text!r}: expected '<low>-<high>', e.g. 20000-24000"
            ) from None
        if not 1024 <= low <= high <= 65535:
            raise ServerError(f"{PORTS_ENV}={text!r}: expected 1024 <= low <= high <= 65535")
        return low, high
    return host_port_range()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and outside the kernel's ephemeral range,
    and that this process was never given before.

    Ports from ``bind(0)`` come from the ephemeral range, which outgoing connections
    also draw from: between choosing a port and the server binding it, a client socket
    (etcd peers dialing each other, say) could take it. Ports below that range are only
    ever taken by an explicit bind. A port is still free until its server binds it, so
    ports asked for together (a Kafka cluster's nodes, before any starts) could be the
    same one: each is handed out once (a cluster of three once listed one port twice).
    Processes side by side keep apart by drawing from slices of their own
    (:data:`PORTS_ENV`).
    """
    low, high = _drawn_range()
    for _ in range(200):
        port = random.randint(low, high)  # noqa: S311
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise ServerError(f"no free TCP port found in {low}-{high}")


def _require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise ServerError(
            f"'{binary}' is not installed; install Debian's {package} "
            f"(apt-get install -y {package}) or run `make test`, which does it"
        )
    return path


def jar_dir(env: str, default: str, pattern: str, what: str) -> Path:
    """A test server's jar directory — ``env`` when set, else ``<venv>/<default>`` (where
    ``make jars`` puts it) — or :class:`ServerError` naming the fix when it holds no
    ``pattern`` jar (the Kafka broker's, the Iceberg REST catalog's)."""
    chosen = os.environ.get(env, "")
    directory = Path(chosen) if chosen else Path(sys.prefix) / default
    if not any(directory.glob(pattern)):
        raise ServerError(
            f"no {what} jars in {directory}: run `make jars` (Maven fetches {what} from "
            f"Maven Central), or set {env} to a directory that has them"
        )
    return directory


def _wait_until(check: object, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)  # waiting for another process to come up: nothing to wait on
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise ServerError(f"{what} did not become ready in {timeout}s\n{tail}")


class _Server:
    """Start on enter; always stop on exit, and also when start itself fails."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------- etcd
def etcd_argv(
    name: str,
    data: Path,
    client_url: str,
    peer_url: str,
    initial_cluster: str,
    state: str = "new",
    *,
    heartbeat_ms: int = 10,
    election_ms: int = 100,
) -> list[str]:
    """The command of one etcd member (the loopback clusters here and the test bed's)."""
    return [
        _require("etcd", "etcd-server"),
        "--name",
        name,
        "--data-dir",
        str(data),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        initial_cluster,
        "--initial-cluster-state",
        state,
        "--initial-cluster-token",
        "riverbed-test",
        "--heartbeat-interval",
        str(heartbeat_ms),
        "--election-timeout",
        str(election_ms),
        "--logger",
        "zap",
        "--log-level",
        "warn",
    ]


def etcd_healthy(client_url: str, timeout: float = 0.5) -> bool:
    """Whether the etcd member at ``client_url`` says it is healthy."""
    try:
        r = httpx.get(f"{client_url}/health", timeout=timeout)
        return r.status_code == 200 and r.json().get("health") == "true"
    except (httpx.HTTPError, ValueError):
        return False


class _EtcdNode:
    def __init__(self, name: str, base: Path, client_port: int, peer_port: int) -> None:
        self.name = name
        self.dir = base / name
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, initial_cluster: str, state: str = "new") -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "etcd.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            etcd_argv(
                self.name, self.dir / "data", self.client_url, self.peer_url, initial_cluster, state
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def status(self) -> dict[str, Any] | None:
        try:
            r = httpx.post(f"{self.client_url}/v3/maintenance/status", json={}, timeout=0.5)
            data: dict[str, Any] = r.json()
            return data if r.status_code == 200 and "leader" in data else None
        except (httpx.HTTPError, ValueError):
            return None

    def healthy(self) -> bool:
        return etcd_healthy(self.client_url)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


class EtcdCluster(_Server):
    """``size`` etcd members on loopback (``size=1`` for a single node)."""

    def __init__(self, size: int = 1) -> None:
        self._tmp = tempfile.mkdtemp(prefix="riverbed-etcd-")
        base = Path(self._tmp)
        self.nodes = [_EtcdNode(f"n{i}", base, free_port(), free_port()) for i in range(size)]
        self._initial = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)

    @property
    def endpoints(self) -> list[str]:
        return [n.endpoint for n in self.nodes]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints)

    def start(self, attempts: int = 3) -> Self:
        for attempt in range(attempts):
            for node in self.nodes:
                node.start(self._initial)
            try:
                _wait_until(
                    lambda: all(n.healthy() for n in self.nodes),
                    30,
                    "etcd",
                    self.nodes[0].dir / "etcd.log",
                )
                return self
            except ServerError as exc:
                if "address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                # a port was taken between choosing and binding it: new ports, again
                for node in self.nodes:
                    node.kill()
                    shutil.rmtree(node.dir, ignore_errors=True)
                    node.client_port, node.peer_port = free_port(), free_port()
                self._initial = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)
        return self

    def leader_index(self) -> int:
        """Index of the current raft leader (waits for one)."""
        found: list[int] = []

        def check() -> bool:
            for i, node in enumerate(self.nodes):
                st = node.status() if node.proc and node.proc.poll() is None else None
                header = st.get("header") if st else None
                if st and isinstance(header, dict) and st.get("leader") == header.get("member_id"):
                    found.append(i)
                    return True
            return False

        _wait_until(check, 15, "an etcd leader")
        return found[0]

    def kill(self, index: int) -> None:
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        node = self.nodes[index]
        node.start(self._initial, state="existing")
        _wait_until(node.healthy, 30, f"etcd member {node.name}", node.dir / "etcd.log")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)


def EtcdServer() -> EtcdCluster:
    """A single-node etcd."""
    return EtcdCluster(1)


# ---------------------------------------------------------------------- PostgreSQL
def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise ServerError(
        f"PostgreSQL's '{name}' is not installed; apt-get install -y postgresql "
        "(or run `make test`, which does it)"
    )


class PostgresServer(_Server):
    """A throwaway PostgreSQL cluster (``fsync=off``) with a template database.

    ``initdb`` refuses to run as root, so as root the cluster belongs to the
    ``postgres`` user and its commands run through ``runuser``.
    """

    TEMPLATE = "riverbed_template"

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.address = address
        self._tmp = Path(tempfile.mkdtemp(prefix="riverbed-pg-"))
        self.data = self._tmp / "data"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self._tmp, "postgres", "postgres")
        self._counter = 0

    @classmethod
    def attach(cls, directory: Path) -> PostgresServer:
        """The server whose files are in ``directory`` (its ``directory`` attribute), to
        stop it from another process."""
        server = cls.__new__(cls)
        server.address, server._tmp, server.data = "", Path(directory), Path(directory) / "data"
        server.port, server._counter = 0, 0
        server._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return server

    @property
    def directory(self) -> Path:
        return self._tmp

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self._as, *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ServerError(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/{dbname}"

    def start(self) -> Self:
        self._run(
            _pg_bin("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        if self.address != "127.0.0.1":  # a test bed's gateway: its hosts connect from /24
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        options = (
            f"-p {self.port} -c listen_addresses={self.address} -k {self._tmp} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self._tmp / "postgres.log"),
            "-w",
            "start",
        )
        self.execute(f"CREATE DATABASE {self.TEMPLATE}")
        return self

    def execute(self, sql: str, dbname: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(sql.encode())

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh database cloned from the template; yields its DSN, drops it after."""
        self._counter += 1
        name = f"test_{os.getpid()}_{self._counter}"
        self.execute(f"CREATE DATABASE {name} TEMPLATE {self.TEMPLATE}")
        try:
            yield self.dsn(name)
        finally:
            self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(ServerError):
                self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self._tmp, ignore_errors=True)


# ------------------------------------------------------------------------- MariaDB
class MariaDBServer(_Server):
    """A throwaway MariaDB server on loopback (Debian's ``mariadb-server``): its own data
    directory (``mariadb-install-db``), ``root`` without a password over TCP, durability
    off (no doublewrite, the log flushed once a second, no binary log) like the
    PostgreSQL one's ``fsync=off``. :meth:`database` gives each test a fresh database."""

    def __init__(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="riverbed-mariadb-"))
        self.data = self._tmp / "data"
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._counter = 0

    @property
    def directory(self) -> Path:
        return self._tmp

    def dsn(self, dbname: str = "mysql") -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> Self:
        install = _require("mariadb-install-db", "mariadb-server")
        server = _require("mariadbd", "mariadb-server")
        result = subprocess.run(
            [
                install,
                "--no-defaults",
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *(["--user=root"] if os.geteuid() == 0 else []),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServerError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")
        log = self._tmp / "mariadb.log"
        self._proc = subprocess.Popen(
            [
                server,
                "--no-defaults",
                f"--datadir={self.data}",
                *(["--user=root"] if os.geteuid() == 0 else []),
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self._tmp / 'mariadb.sock'}",
                f"--pid-file={self._tmp / 'mariadb.pid'}",
                f"--log-error={log}",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-doublewrite=0",
                "--innodb-buffer-pool-size=128M",
                "--max-connections=500",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def ready() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServerError(f"mariadbd exited:\n{log.read_text(errors='replace')[-2000:]}")
            try:
                self.execute("SELECT 1")
            except Exception:  # not accepting connections yet
                return False
            return True

        _wait_until(ready, 60, "MariaDB", log)
        return self

    def execute(self, sql: str, dbname: str | None = None) -> None:
        import pymysql

        conn = pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", database=dbname, autocommit=True
        )
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh, empty database; yields its DSN, drops it after."""
        self._counter += 1
        name = f"test_{os.getpid()}_{self._counter}"
        self.execute(f"CREATE DATABASE {name}")
        try:
            yield self.dsn(name)
        finally:
            self.execute(f"DROP DATABASE IF EXISTS {name}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)
        shutil.rmtree(self._tmp, ignore_errors=True)
