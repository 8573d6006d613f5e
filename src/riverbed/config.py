"""Configuration: every setting riverbed has, one reader of the environment.

Precedence, lowest to highest: built-in defaults, ``riverbed.toml`` (in the working
directory, or the file named by ``RIVERBED_CONFIG``), then ``RIVERBED_*`` environment
variables. :data:`SETTINGS` names every setting once — its variable, its
``riverbed.toml`` spelling, its default and what it means — and docs/configuration.md
is its table (a test keeps the two equal, and fails on a ``RIVERBED_*`` name used
anywhere in riverbed that is not one of them).

Entry points (the CLI, the demos, :func:`riverbed.stream.start`) build a :class:`Config`
with :func:`load_config` and pass it, or the parts needed, down; library code does not
read the environment. Two kinds of process have no entry point of riverbed's and read
the few settings that reach them through :func:`inherited` instead: Spark's Python
workers (an executor's task is handed its driver's bucket and log settings in the
environment, as Spark ships Hadoop's settings) and the processes a test bed starts on
its hosts (named by ``RIVERBED_HOST``).

``riverbed.toml``::

    home = ".riverbed"
    control = "etcd://127.0.0.1:2379"
    jobs_db = "postgresql://riverbed@db:5432/jobs"   # default: sqlite under home
    jobs_dir = "jobs"                                  # where job modules live

    [spark]
    master = "local[*]"
    conf = { "spark.sql.shuffle.partitions" = "8" }

    [state]
    memory_mb = 256    # RocksDB's memory per process, shared by every state database
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from riverbed.errors import ConfigError

__all__ = [
    "SETTINGS",
    "Config",
    "Setting",
    "SparkConfig",
    "adopt",
    "child_environment",
    "inherited",
    "inherited_environment",
    "load_config",
    "overlaid",
    "settings_table",
]


@dataclass(frozen=True)
class Setting:
    """One setting: its environment variable, its ``riverbed.toml`` spelling (None:
    the environment only), its default and what it means. ``inherited``: also read by
    processes riverbed or Spark starts without an entry point of riverbed's (Spark's
    Python workers, a test bed's processes), through :func:`inherited`. ``secret``:
    never printed, logged or put in a URL. ``who``: who sets it — ``user``, ``riverbed``
    (set for a child process: the user reads it there) or ``tests``. ``handed``: a
    driver hands it to its Spark tasks (:func:`inherited_environment`)."""

    env: str
    toml: str | None
    default: str
    meaning: str
    inherited: bool = False
    secret: bool = False
    handed: bool = False
    who: str = "user"


# The one list of riverbed's settings; docs/configuration.md is its table.
SETTINGS: tuple[Setting, ...] = (
    Setting("RIVERBED_CONFIG", None, "./riverbed.toml", "the riverbed.toml to read"),
    Setting(
        "RIVERBED_HOME",
        "home",
        ".riverbed",
        "this machine's directory: logs, local state, SQLite defaults, caches",
    ),
    Setting(
        "RIVERBED_CONTROL",
        "control",
        "SQLite under home",
        "the control plane: sqlite:///path or etcd://host:2379[,host:2379]",
        inherited=True,
        handed=True,
    ),
    Setting(
        "RIVERBED_LOG",
        "log",
        "file://home/log",
        "riverbed's topics: a directory, s3://bucket/prefix (diskless), "
        "flight://host:8815[,host:8815] or kafka://host:9092",
    ),
    Setting(
        "RIVERBED_CHECKPOINTS",
        "checkpoints",
        "file://home/checkpoints",
        "where checkpoints, state and job outputs are kept: a directory or s3://bucket/prefix",
    ),
    Setting(
        "RIVERBED_JOBS_DB",
        "jobs_db",
        "SQLite under home",
        "the jobs queue's database: sqlite:///path, postgresql://… or mysql://… (MariaDB)",
    ),
    Setting("RIVERBED_JOBS_DIR", "jobs_dir", "jobs", "the directory of job modules"),
    Setting(
        "RIVERBED_SPARK_MASTER",
        "spark.master",
        "local[*]",
        "the Spark master of riverbed's sessions; `riverbed`: every master the control "
        "plane knows (announced by `riverbed control spark-master`, [cluster.md](cluster.md))",
    ),
    Setting(
        "RIVERBED_SPARK_CONF",
        "spark.conf",
        "{}",
        "Spark settings: a JSON object in the environment (laid over riverbed.toml's table)",
    ),
    Setting(
        "RIVERBED_STATE_MEMORY_MB",
        "state.memory_mb",
        "RocksDB's own",
        "RocksDB's memory in MiB per process holding state, shared by its databases (at least 8)",
    ),
    Setting(
        "RIVERBED_HOST",
        None,
        "the hostname",
        "this machine's name in the hosts view and in process ids",
        inherited=True,
    ),
    Setting(
        "RIVERBED_STORAGE_WAIT",
        None,
        "900",
        "seconds a bucket's outage is waited out (retries with backoff) before a call fails",
        inherited=True,
        handed=True,
    ),
    Setting(
        "RIVERBED_S3_ADDRESSING",
        None,
        "path for an IP or localhost endpoint, else virtual",
        "S3 request style: path or virtual",
        inherited=True,
        handed=True,
    ),
    Setting(
        "RIVERBED_LOG_TOKEN",
        None,
        "none",
        "the token log servers require (riverbed log serve) and their clients send",
        inherited=True,
        secret=True,
        handed=True,
    ),
    Setting(
        "RIVERBED_ALERT_WEBHOOK",
        None,
        "none",
        "the webhook riverbed alerts watch sends to (its URL is a credential)",
        secret=True,
    ),
    Setting(
        "RIVERBED_UI_TOKEN",
        None,
        "none",
        "the token the console requires of visitors (riverbed ui)",
        secret=True,
    ),
    Setting(
        "RIVERBED_JARS",
        None,
        ".venv/jars",
        "the jar cache Spark reads (S3A, Kafka, Avro), filled by `riverbed setup jars`",
        inherited=True,
    ),
    Setting(
        "RIVERBED_SPARK_CDS",
        None,
        "an archive beside PySpark",
        "the class-data archive Spark's driver JVMs map, or off",
        inherited=True,
    ),
    Setting(
        "RIVERBED_LOCK_TOKEN",
        None,
        "-",
        "the fencing token of the lock held for the command riverbed control lock runs",
        who="riverbed",
    ),
    Setting(
        "RIVERBED_DEMO_PACE",
        None,
        "-",
        "how slowly the example jobs of riverbed demo jobs run, so its crashes land mid-chunk",
        who="riverbed",
    ),
    Setting(
        "RIVERBED_FAULT",
        None,
        "none",
        "a failpoint of the stream engine (`after_commit:<dir>`; `kill_in_move:<n>`, "
        "`read`, `switch` or `done`: SIGKILL during a state rescale, backfill or restore; "
        "`table_commit:<before|after>:<batch>`: SIGKILL around a lakehouse table's commit; "
        "`joined:<join|planned>:<batch>`, `chained:<head>:committed:<batch>`, "
        "`chained:<aggregation>:planned:<batch>`: SIGKILL between a join's or an "
        "aggregation's batch and the aggregation of its rows)",
        inherited=True,
        who="tests",
    ),
    Setting(
        "RIVERBED_JOBS_FAULT",
        None,
        "none",
        "a failpoint of jobs workers (publish_done:<delay s>:<kill p>)",
        inherited=True,
        who="tests",
    ),
    Setting(
        "RIVERBED_TESTS_QUICK",
        None,
        "unset",
        "make check: a test that reaches a server without its marker fails",
        who="tests",
    ),
    Setting(
        "RIVERBED_EXPRESSION_EXAMPLES",
        None,
        "25",
        "examples of the expression property test checked against Spark (more: a longer hunt)",
        who="tests",
    ),
    Setting(
        "RIVERBED_TESTBED",
        None,
        "-",
        "the test bed `riverbed chaos` acts on (else RIVERBED_HOME/testbed)",
        who="tests",
    ),
    Setting(
        "RIVERBED_TESTBED_MODE",
        None,
        "namespaces when root",
        "loopback: a test bed on 127.0.0.x instead of network namespaces",
        who="tests",
    ),
    Setting(
        "RIVERBED_TEST_PORTS",
        None,
        "12,000 ports below the ephemeral range",
        "`<low>-<high>`: the ports test servers start on (each pytest-xdist worker: a slice)",
        who="tests",
    ),
    Setting(
        "RIVERBED_TESTBED_CLAIMS",
        None,
        "$TMPDIR/riverbed-testbeds",
        "where test beds claim their addresses",
        who="tests",
    ),
    Setting(
        "RIVERBED_KAFKA_JARS",
        None,
        ".venv/kafka",
        "the Kafka broker's jars the tests start",
        who="tests",
    ),
    Setting(
        "RIVERBED_ICEBERG_REST_JARS",
        None,
        ".venv/iceberg-rest",
        "the Iceberg REST catalog server's jars the tests start",
        who="tests",
    ),
    Setting(
        "RIVERBED_TEST_SPARK_REMOTE",
        None,
        "(unset: a local[2,2] session)",
        "the tests' `spark` fixture as a Spark Connect client of this server (sc://…)",
        who="tests",
    ),
)
_BY_NAME = {s.env: s for s in SETTINGS}


def settings_table() -> str:
    """:data:`SETTINGS` as the Markdown table docs/configuration.md carries."""
    rows = [
        "| variable | riverbed.toml | default | meaning | set by |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        toml = f"`{s.toml}`" if s.toml else "—"
        notes = [s.who]
        notes += ["inherited"] if s.inherited else []
        notes += ["handed to tasks"] if s.handed else []
        notes += ["secret"] if s.secret else []
        meaning = s.meaning.replace("|", "\\|")
        rows.append(f"| `{s.env}` | {toml} | {s.default} | {meaning} | {', '.join(notes)} |")
    return "\n".join(rows) + "\n"


def inherited(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of an inherited setting in this process's environment ("" if unset).
    For code that runs where no entry point handed it a :class:`Config` (see the module
    doc); everywhere else settings are passed in."""
    setting = _BY_NAME.get(name)
    if setting is None or not setting.inherited:
        raise KeyError(f"{name} is not an inherited setting of riverbed.config.SETTINGS")
    return (os.environ if env is None else env).get(name, "")


def inherited_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a driver hands its Spark tasks, as set in this process: holds
    secrets — never print or log it."""
    env = os.environ if env is None else env
    return {s.env: env[s.env] for s in SETTINGS if s.handed and env.get(s.env)}


def child_environment(settings: Mapping[str, str | None]) -> dict[str, str]:
    """This process's environment with ``settings`` set (None: removed), for a process
    an entry point starts (a demo's driver, a class-data archive's build). Holds
    secrets: never print or log it."""
    unknown = [n for n in settings if n.startswith("RIVERBED_") and n not in _BY_NAME]
    if unknown:
        raise KeyError(f"not settings of riverbed.config.SETTINGS: {', '.join(unknown)}")
    env = dict(os.environ)
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def adopt(settings: Mapping[str, str]) -> None:
    """Take the inherited settings a driver handed this process (a Spark task's) where
    this process has none of its own: Spark's Python workers may have started before
    the driver's settings were set, or on another machine. Names outside riverbed's
    (``AWS_*``) are the bucket's, from :func:`riverbed.storage.storage_environment`."""
    for name, value in settings.items():
        known = _BY_NAME.get(name)
        if name.startswith("RIVERBED_") and (known is None or not known.inherited):
            raise KeyError(f"{name} is not an inherited setting of riverbed.config.SETTINGS")
        os.environ.setdefault(name, value)  # and the AWS chain's (riverbed.storage)


@contextlib.contextmanager
def overlaid() -> Iterator[Callable[[Mapping[str, str]], None]]:
    """Yields ``put(settings)``, which sets settings in this process's environment for
    as long as the block runs; the environment is as it was after (a scenario that plays
    several machines' processes from one, e.g. the cluster demo's driver)."""
    saved = dict(os.environ)

    def put(settings: Mapping[str, str]) -> None:
        os.environ.update(settings)

    try:
        yield put
    finally:
        os.environ.clear()
        os.environ.update(saved)


def storage_wait_s(env: Mapping[str, str] | None = None) -> float:
    """``RIVERBED_STORAGE_WAIT``: seconds, at least 0 (a bad value is named, not a
    traceback from deep inside a store)."""
    text = inherited("RIVERBED_STORAGE_WAIT", env) or "900"
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not wait >= 0:
        raise ConfigError(
            f"RIVERBED_STORAGE_WAIT={text!r} must be seconds (e.g. 900); fix or unset it"
        )
    return wait


@dataclass(frozen=True)
class SparkConfig:
    """How riverbed builds SparkSessions (see :mod:`riverbed.spark`)."""

    master: str = "local[*]"
    app_name: str = "riverbed"
    conf: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:  # read-only, whatever mapping it was given
        if not isinstance(self.conf, MappingProxyType):
            object.__setattr__(self, "conf", MappingProxyType(dict(self.conf)))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as plain values (a read-only mapping does not pickle): a worker hands
        its configuration to the executors it spawns."""
        return (SparkConfig, (self.master, self.app_name, dict(self.conf)))


@dataclass(frozen=True)
class Config:
    """Where riverbed keeps things. Every location is a URL or a path."""

    home: Path = Path(".riverbed")
    control: str = ""
    checkpoints: str = ""
    log: str = ""
    jobs_db: str = ""
    jobs_dir: Path = Path("jobs")
    spark: SparkConfig = field(default_factory=SparkConfig)
    # RocksDB's memory in each process that holds state (the driver, every Python
    # worker), MiB: one budget for every database it opens; None: RocksDB's defaults
    state_memory_mb: int | None = None

    @property
    def control_url(self) -> str:
        """The control-plane URL; defaults to SQLite under ``home``."""
        if self.control:
            return self.control
        return f"sqlite:///{(self.home / 'control.db').resolve()}"

    @property
    def checkpoints_url(self) -> str:
        """Durable location of checkpoints (state changelogs and snapshots)."""
        return self.checkpoints or f"file://{(self.home / 'checkpoints').resolve()}"

    @property
    def log_url(self) -> str:
        """The event log's location."""
        return self.log or f"file://{(self.home / 'log').resolve()}"

    @property
    def jobs_db_url(self) -> str:
        """The jobs queue's database; defaults to SQLite under ``home``."""
        return self.jobs_db or f"sqlite:///{(self.home / 'jobs.db').resolve()}"

    @property
    def state_dir(self) -> Path:
        """This machine's local state databases."""
        return self.home / "state"


def _expect_str(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(
            f"{source}: '{key}' must be a string, got {type(value).__name__} {value!r}; "
            f'quote it, e.g. {key} = "..."'
        )
    return value


def _conf_from_env(text: str) -> dict[str, str]:
    """``RIVERBED_SPARK_CONF``: a JSON object of Spark settings, over riverbed.toml's."""
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as exc:
        conf = exc
    if not isinstance(conf, dict):
        raise ConfigError(
            "RIVERBED_SPARK_CONF must be a JSON object of Spark settings, e.g. "
            '\'{"spark.sql.shuffle.partitions": "8"}\'; unset it or fix it'
        )
    return {str(k): str(v) for k, v in conf.items()}


def _memory_mb(source: str, value: Any) -> int | None:
    """A state memory budget in MiB: a whole number of at least 8 (None: unset)."""
    if value is None:
        return None
    try:
        mb = int(value) if isinstance(value, int | str) and not isinstance(value, bool) else 0
    except ValueError:
        mb = 0
    if mb < 8:
        raise ConfigError(
            f"{source} must be a whole number of MiB, at least 8 (e.g. 256), not {value!r}"
        )
    return mb


def load_config(
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Config:
    """Build the :class:`Config` from ``riverbed.toml`` and ``RIVERBED_*`` variables."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    path = Path(env["RIVERBED_CONFIG"]) if env.get("RIVERBED_CONFIG") else cwd / "riverbed.toml"
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid TOML ({exc}); fix the file or remove it"
            ) from exc
    elif env.get("RIVERBED_CONFIG"):
        raise ConfigError(f"RIVERBED_CONFIG names {path}, which does not exist")

    known = {s.toml.split(".")[0] for s in SETTINGS if s.toml}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    src = str(path)
    home = Path(_expect_str(src, "home", data.get("home", ".riverbed")))
    control = _expect_str(src, "control", data.get("control", ""))
    checkpoints = _expect_str(src, "checkpoints", data.get("checkpoints", ""))
    log_url = _expect_str(src, "log", data.get("log", ""))
    jobs_db = _expect_str(src, "jobs_db", data.get("jobs_db", ""))
    jobs_dir = Path(_expect_str(src, "jobs_dir", data.get("jobs_dir", "jobs")))
    spark_data = data.get("spark", {})
    if not isinstance(spark_data, dict):
        raise ConfigError(f"{path}: [spark] must be a table")
    master = _expect_str(src, "spark.master", spark_data.get("master", "local[*]"))
    conf_raw = spark_data.get("conf", {})
    if not isinstance(conf_raw, dict):
        raise ConfigError(f"{path}: spark.conf must be a table of strings")
    conf = {str(k): str(v) for k, v in conf_raw.items()}
    state_data = data.get("state", {})
    if not isinstance(state_data, dict) or set(state_data) - {"memory_mb"}:
        raise ConfigError(f"{path}: [state] takes one setting, memory_mb (MiB), e.g. 256")
    memory_mb = _memory_mb(f"{path}: state.memory_mb", state_data.get("memory_mb"))

    if env.get("RIVERBED_HOME"):
        home = Path(env["RIVERBED_HOME"])
    if env.get("RIVERBED_CONTROL"):
        control = env["RIVERBED_CONTROL"]
    if env.get("RIVERBED_LOG"):
        log_url = env["RIVERBED_LOG"]
    if env.get("RIVERBED_JOBS_DB"):
        jobs_db = env["RIVERBED_JOBS_DB"]
    if env.get("RIVERBED_JOBS_DIR"):
        jobs_dir = Path(env["RIVERBED_JOBS_DIR"])
    if not jobs_dir.is_absolute():
        jobs_dir = cwd / jobs_dir
    if env.get("RIVERBED_CHECKPOINTS"):
        checkpoints = env["RIVERBED_CHECKPOINTS"]
    if env.get("RIVERBED_SPARK_MASTER"):
        master = env["RIVERBED_SPARK_MASTER"]
    if env.get("RIVERBED_SPARK_CONF"):
        conf.update(_conf_from_env(env["RIVERBED_SPARK_CONF"]))
    if env.get("RIVERBED_STATE_MEMORY_MB"):
        memory_mb = _memory_mb("RIVERBED_STATE_MEMORY_MB", env["RIVERBED_STATE_MEMORY_MB"])
    if not home.is_absolute():
        home = cwd / home
    return Config(
        home=home,
        control=control,
        checkpoints=checkpoints,
        log=log_url,
        jobs_db=jobs_db,
        jobs_dir=jobs_dir,
        spark=SparkConfig(master=master, conf=MappingProxyType(conf)),
        state_memory_mb=memory_mb,
    )
