"""Configuration: frozen dataclasses built once and passed in.

Precedence, lowest to highest: built-in defaults, ``riverbed.toml`` (in the working
directory, or the file named by ``RIVERBED_CONFIG``), then ``RIVERBED_*`` environment
variables. Library code never reads the environment itself; it receives a
:class:`Config` (or one of its parts) from its caller.

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

Environment: ``RIVERBED_HOME``, ``RIVERBED_CONTROL``, ``RIVERBED_LOG``,
``RIVERBED_CHECKPOINTS``, ``RIVERBED_JOBS_DB``, ``RIVERBED_JOBS_DIR``,
``RIVERBED_SPARK_MASTER``, ``RIVERBED_SPARK_CONF`` (a JSON object of Spark
settings laid over ``[spark] conf``) and ``RIVERBED_STATE_MEMORY_MB``.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from riverbed.errors import ConfigError

__all__ = ["Config", "SparkConfig", "load_config"]


@dataclass(frozen=True)
class SparkConfig:
    """How riverbed builds SparkSessions (see :mod:`riverbed.spark`)."""

    master: str = "local[*]"
    app_name: str = "riverbed"
    conf: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


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

    known = {"home", "control", "checkpoints", "log", "jobs_db", "jobs_dir", "spark", "state"}
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
