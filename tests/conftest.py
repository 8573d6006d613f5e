"""Shared fixtures: real servers on loopback ports, one Spark session per run."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from riverbed.spark import TEST_CONF
from riverbed.testing import (
    CephS3Server,
    EtcdCluster,
    EtcdServer,
    IcebergRestServer,
    KafkaServer,
    MariaDBServer,
    PostgresServer,
)
from tests import timings

_BEGAN = pytest.StashKey[float]()

ROOT = Path(__file__).resolve().parent.parent

# Properties, not timings: an example (or its generation) that runs slowly because the
# 2-core machine is busy (imports, a server starting for a neighbour test) is not a
# failure — a full run once failed a pure property on a 1.1 s pause. Performance is
# measured in benchmarks/.
settings.register_profile("riverbed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("riverbed")


QUICK = "RIVERBED_TESTS_QUICK"  # set by `make check`: no server, no Spark


def _no_servers_in_a_quick_run(request: pytest.FixtureRequest, what: str) -> None:
    """`make check` deselects the markers of servers and Spark; a test that reaches one
    without its marker (a fixture asked for by name at run time) fails here, naming the
    marker it needs, instead of starting the server in the quick loop."""
    if os.environ.get(QUICK):
        pytest.fail(
            f"{request.node.nodeid} starts {what} without its marker: add "
            "pytest.mark.<marker> to it (or to the parameter that asks for the server)"
        )


@pytest.fixture(scope="session")
def etcd_server(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """One single-node etcd for the whole run (tests isolate by key prefix)."""
    _no_servers_in_a_quick_run(request, "etcd")
    with EtcdServer() as server:
        yield server


@pytest.fixture
def etcd_cluster(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """A fresh 3-node etcd cluster for one failover test."""
    _no_servers_in_a_quick_run(request, "an etcd cluster")
    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    _no_servers_in_a_quick_run(request, "PostgreSQL")
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[str]:
    """DSN of a fresh database (from the template) for one test."""
    with postgres_server.database() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def mariadb_server(request: pytest.FixtureRequest) -> Iterator[MariaDBServer]:
    _no_servers_in_a_quick_run(request, "MariaDB")
    with MariaDBServer() as server:
        yield server


@pytest.fixture
def mariadb_db(mariadb_server: MariaDBServer) -> Iterator[str]:
    """DSN of a fresh, empty database for one test."""
    with mariadb_server.database() as dsn:
        yield dsn


S3_BUCKET = "riverbed-tests"
LOCATIONS = ["file", "memory", pytest.param("s3", marks=pytest.mark.s3)]  # every backend


def location_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    """A fresh location of ``kind``: a directory, this process's memory, or a prefix in
    the tests' bucket (which starts the S3 server and sets the AWS_* variables)."""
    if kind == "file":
        return str(tmp_path / name)
    if kind == "memory":
        return f"memory://{name}-{os.urandom(4).hex()}"
    url: str = request.getfixturevalue("s3_url")
    return f"{url}/{name}"


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> Iterator[CephS3Server]:
    """One Ceph RGW for the whole run (tests isolate by key prefix in one bucket)."""
    _no_servers_in_a_quick_run(request, "the S3 server")
    with CephS3Server() as server:
        server.create_bucket(S3_BUCKET)
        yield server


@pytest.fixture
def s3_url(
    s3_server: CephS3Server, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A fresh ``s3://`` location for one test, with the AWS settings that reach the
    tests' server in the environment (so riverbed, and any process the test starts,
    find it as they would in production)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"s3://{S3_BUCKET}/{slug}-{os.urandom(3).hex()}"


@pytest.fixture(scope="session")
def kafka_server(request: pytest.FixtureRequest) -> Iterator[KafkaServer]:
    """One Kafka broker for the whole run (tests isolate by topic name)."""
    _no_servers_in_a_quick_run(request, "the Kafka broker")
    with KafkaServer() as server:
        yield server


@pytest.fixture(scope="session")
def iceberg_rest(request: pytest.FixtureRequest) -> Iterator[IcebergRestServer]:
    """One Iceberg REST catalog for the whole run (tests isolate by namespace)."""
    _no_servers_in_a_quick_run(request, "the Iceberg REST catalog")
    with IcebergRestServer() as server:
        yield server


@pytest.fixture
def kafka_topic(kafka_server: KafkaServer, request: pytest.FixtureRequest) -> str:
    """A fresh topic name for one test (created by the test, with its partitions)."""
    slug = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{slug}-{os.urandom(3).hex()}"


@pytest.fixture(scope="session", autouse=True)
def _spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Spark's scratch space (its ``spark-*`` and ``blockmgr-*`` directories) for every
    Spark this run starts — the session's, and the drivers, executors and cluster daemons
    of the processes tests start, which inherit the environment — under this run's
    pytest temporary directory. A JVM killed with SIGKILL never removes its own, and a
    run kills hundreds: in /tmp they outlived the run (thousands after a few runs);
    here they go with pytest's retention of old runs' directories. So does the JVMs'
    ``java.io.tmpdir`` of every JVM spark-submit starts (drivers, the Connect server:
    ``SPARK_SUBMIT_OPTS``), where Spark keeps its ``artifacts-*`` directories."""
    scratch = tmp_path_factory.mktemp("spark-local")
    settings = {
        "SPARK_LOCAL_DIRS": str(scratch),
        "SPARK_SUBMIT_OPTS": " ".join(
            filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), f"-Djava.io.tmpdir={scratch}"])
        ),
    }
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield scratch
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[object]:
    _no_servers_in_a_quick_run(request, "a Spark session")
    from riverbed.config import SparkConfig
    from riverbed.spark import session

    # the engine's tests again over Spark Connect (tests/stream/test_connect.py runs them
    # in a process of their own: a process is a Connect client or a classic driver)
    remote = os.environ.get("RIVERBED_TEST_SPARK_REMOTE")
    master = remote or "local[2,2]"
    s = session(SparkConfig(master=master, app_name="riverbed-tests"), test=remote is None)
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _no_streaming_query_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A streaming query a test left running in the shared session would run on beside
    every later test, taking CPU from them: stop it, and say which test left it."""
    yield
    if "spark" not in request.fixturenames:
        return
    left = request.getfixturevalue("spark").streams.active
    for query in left:
        query.stop()
    if left:
        warnings.warn(
            f"{request.node.nodeid} left {len(left)} streaming queries running; stopped",
            stacklevel=1,
        )


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child processes: this interpreter's riverbed, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # the fast settings of the tests' own session (no UI, 2 shuffle partitions, a C1
    # driver JVM) for every riverbed process a test starts
    env["RIVERBED_SPARK_CONF"] = json.dumps(TEST_CONF)
    return env


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker (and every process its tests start) draws the ports of
    its servers from a slice of its own: workers choosing at random from one range could
    choose the same free port at once, and one server would fail to bind."""
    from riverbed.testing.servers import PORTS_ENV, host_port_range, port_slice

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and count > 0 and not os.environ.get(PORTS_ENV):
        low, high = port_slice(*host_port_range(), int(worker[2:]), count)
        os.environ[PORTS_ENV] = f"{low}-{high}"


_WORKERS_DONE: dict[str, float] = {}  # xdist worker id -> when it finished (monotonic)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEGAN] = time.monotonic()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on the controller
def pytest_testnodedown(node: object, error: object) -> None:
    gateway = getattr(node, "gateway", None)
    _WORKERS_DONE[str(getattr(gateway, "id", node))] = time.monotonic()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Under ``make test``: when each pytest-xdist worker ran out of tests — how evenly the
    run spread over the workers (a worker done early left its core to the others)."""
    began = config.stash.get(_BEGAN, None)
    if began is None or len(_WORKERS_DONE) < 2:
        return
    done = sorted((at - began, worker) for worker, at in _WORKERS_DONE.items())
    spread = done[-1][0] - done[0][0]
    each = ", ".join(f"{worker} {int(at) // 60}:{int(at) % 60:02d}" for at, worker in done)
    terminalreporter.write_line(
        f"xdist workers ran out of tests at {each} (the first {spread:.0f} s before the last)"
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (pytest-xdist workers, ``--dist loadgroup``) the ``slow``
    scenario tests that start Spark drivers — killed, restarted, taken over — are
    :data:`tests.timings.GROUPS` groups of whole modules, of about equal time: each
    group runs on one worker, one test after another, so no more scenarios than that
    run at once (on 2 cores, more starve each other: takeovers and deadlines stretch).
    xdist hands out the largest units first, so each group starts at once on a worker
    of its own, and everything else fills the workers around them. The scenarios
    without Spark (log servers, control-plane and jobs processes, the S3 outages) are
    spread like any test."""
    scenarios = []
    for item in items:
        # a test that uses a server's fixture carries its marker, so `make check` (no
        # servers, no Spark) never starts one: the markers follow the fixtures
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in SERVER_FIXTURES.items():
            if used & fixtures and not item.get_closest_marker(marker):
                item.add_marker(getattr(pytest.mark, marker))
        drivers = item.get_closest_marker("spark") or item.nodeid.startswith(SPARK_SCENARIOS)
        if item.get_closest_marker("slow") and drivers:
            scenarios.append(item)
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(SCENARIO_HANG_GUARD))
    group = timings.groups_of([i.nodeid for i in scenarios], timings.load())
    for item in scenarios:
        n = group[timings.module_of(item.nodeid)]
        item.add_marker(pytest.mark.xdist_group(f"scenarios-{n + 1}"))


SERVER_FIXTURES = {
    "spark": {"spark"},
    "etcd": {"etcd_server", "etcd_cluster"},
    "postgres": {"postgres_server", "postgres_db"},
    "mariadb": {"mariadb_server", "mariadb_db"},
    "s3": {"s3_server", "s3_url"},
    "kafka": {"kafka_server"},
    "rest_catalog": {"iceberg_rest"},
}

# The hang guard of every Spark scenario test without one of its own (only the cluster
# demo has one: longer). A guard stops a test that hangs; it is not what a test checks,
# and a slow host must not reach it. A driver's start and first micro-batch cost ~16.5 s
# of CPU, and under one core's worth of CPU shared by three workers (a slow CI host) the
# kill scenarios took up to 450 s — pytest-timeout's default here — in whole suites: the
# DataFrame join's 356 s and a Connect shard's 298 s (2026-12-06), the lookup join's
# kills 402 s and over 450 (stopped by the default guard in its last check, not hung),
# the Kafka source's 310 s, the driver crash's 281 s (2026-12-07, at 91bd60b).
SCENARIO_HANG_GUARD = 900

# modules whose slow tests start Spark drivers in processes of their own (the ``spark``
# marker only says a test uses the session's Spark)
SPARK_SCENARIOS = ("tests/stream/", "tests/jobs/test_demo.py")
