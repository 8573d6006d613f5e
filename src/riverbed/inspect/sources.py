"""Where the read model reads from: the configured log, control plane, state and jobs
database, opened lazily and shared; and the error every question raises."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from riverbed.config import Config
from riverbed.errors import ConfigError, RiverbedError
from riverbed.stream.layout import STATE, checkpoints_location, child


class QueryError(RiverbedError):
    """A query named something that does not exist, or asked in a way it cannot answer."""


def local_path(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return Path(parts.path if parts.scheme else url)
    if parts.scheme == "sqlite":
        return Path(parts.path[1:] if parts.path.startswith("//") else parts.path)
    return None


def du(path: str | Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist) — or of the objects
    under a bucket location (``s3://…``)."""
    if isinstance(path, str):
        from riverbed.stream.layout import checkpoint_store

        return sum(i.size for i in checkpoint_store(path).list())
    total = 0
    try:
        for f in path.rglob("*"):
            try:
                if f.is_file():
                    total += f.stat().st_size
            except OSError:
                continue  # a file removed while we walked (segment retention, purge)
    except OSError:
        return total
    return total


class Sources:
    """Where the console reads, opened once (lazily) from a :class:`Config`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._log: Any = None
        self._cp: Any = None
        self._state: Any = None
        self._jobs: Any = None

    @property
    def log(self) -> Any:
        with self._lock:
            if self._log is None:
                import riverbed.log

                self._log = riverbed.log.open(self.config.log_url)
            return self._log

    @property
    def control(self) -> Any:
        with self._lock:
            if self._cp is None:
                from riverbed.control import connect

                self._cp = connect(self.config.control_url)
            return self._cp

    @property
    def checkpoints(self) -> str | Path:
        """The checkpoints location: a directory, or a bucket's ``s3://`` URL."""
        try:
            return checkpoints_location(self.config.checkpoints_url)
        except ConfigError as exc:
            raise QueryError(str(exc)) from None

    def place(self, name: str) -> str | Path:
        """Where something is under the checkpoints (``state``, an aggregation's name)."""
        return child(self.checkpoints, name)

    @property
    def state(self) -> Any:
        with self._lock:
            if self._state is None:
                from riverbed.state import StateConfig, StateProvider

                self._state = StateProvider(
                    StateConfig(local_dir=self.config.state_dir, durable=self.place(STATE))
                )
            return self._state

    @property
    def jobs(self) -> Any:
        """The jobs database's reader, or None when there is none yet (a SQLite file
        that does not exist is not created by looking at it)."""
        with self._lock:
            if self._jobs is None:
                url = self.config.jobs_db_url
                path = local_path(url) if url.startswith("sqlite") else None
                if path is not None and not path.exists():
                    return None
                from riverbed.jobs.reads import QueueReader

                self._jobs = QueueReader(url)
            return self._jobs

    def close(self) -> None:
        for thing in (self._log, self._cp, self._jobs):
            if thing is not None:
                thing.close()
        self._log = self._cp = self._jobs = self._state = None


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
