"""A durable partitioned event log: topics, producers, consumer groups.

::

    import riverbed.log

    log = riverbed.log.open("file:///data/log")          # or "memory://"
    log.create_topic("events", partitions=4, serde="json")
    log.producer("events").send({"user": 1, "flag": "a"}, key="user-1")
    for record in log.iter_records("events", partition=0):
        print(record.offset, record.value)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from riverbed.log.base import LogStorage, TopicConfig
from riverbed.log.errors import (
    CorruptLogError,
    GroupError,
    LogError,
    OffsetOutOfRangeError,
    SerdeError,
    TopicExistsError,
    TopicNotFoundError,
)
from riverbed.log.log import Log, PartitionOffsets, Producer
from riverbed.log.records import Record, RecordMetadata

__all__ = [
    "CorruptLogError",
    "GroupError",
    "Log",
    "LogError",
    "LogStorage",
    "OffsetOutOfRangeError",
    "PartitionOffsets",
    "Producer",
    "Record",
    "RecordMetadata",
    "SerdeError",
    "TopicConfig",
    "TopicExistsError",
    "TopicNotFoundError",
    "open",
    "reach_environment",
]


def reach_environment() -> dict[str, str]:
    """The environment variables another process (a Spark Python worker, an executor on
    another host) needs to reach the log as this one does: the bucket's settings and
    the control plane of diskless topics, the log servers' token. Holds secrets: never
    print or log it."""
    from riverbed.config import inherited_environment
    from riverbed.storage import storage_environment

    return storage_environment() | inherited_environment()


def open(
    url: str | Path,
    *,
    control: str | None = None,
    flush_ms: float | None = None,
    kafka: Mapping[str, Any] | None = None,
) -> Log:
    """``file:///path`` (or a plain path), ``memory://``, ``flight://host:port`` — a
    log server (``riverbed log serve``) on this or another machine; ``riverbed://``: the
    log servers the control plane at ``control`` knows (:mod:`riverbed.log.discovery`) —
    ``s3://bucket/prefix``: diskless topics (:mod:`riverbed.log.diskless`), their
    records in the bucket and their offsets in the control plane at ``control``
    (default: riverbed's configured one, ``RIVERBED_CONTROL``), appends sharing an object
    per ``flush_ms`` (default 50) — or ``kafka://host:9092[?serde=json]``: a Kafka
    cluster's topics, read-only (:mod:`riverbed.log.kafkalog`), with the Kafka client
    settings ``kafka`` (security, SASL, TLS)."""
    if kafka is not None and not str(url).startswith("kafka://"):
        raise LogError(f"Kafka client settings are for kafka:// logs, not {url!r}")
    if flush_ms is not None and not str(url).startswith("s3://"):
        raise LogError(f"flush_ms is a setting of diskless topics (s3://), not of {url!r}")
    if isinstance(url, Path):
        from riverbed.log.file import FileLogStorage

        return Log(FileLogStorage(url.resolve()))
    parts = urlsplit(url)
    if parts.scheme == "memory":
        from riverbed.log.memory import MemoryLogStorage

        return Log(MemoryLogStorage())
    if parts.scheme in ("file", ""):
        path = parts.path if parts.scheme else url
        if not path:
            raise LogError(f"log URL {url!r} has no path; e.g. file:///data/log")
        from riverbed.log.file import FileLogStorage

        return Log(FileLogStorage(Path(path).resolve()))
    if parts.scheme == "s3":
        return Log(_diskless(str(url), control, flush_ms))
    if parts.scheme == "kafka":
        from riverbed.log.kafkalog import KafkaLogStorage

        return Log(KafkaLogStorage(str(url), kafka))
    from riverbed.log.wire import SCHEMES

    if parts.scheme in SCHEMES:
        from riverbed.log.flight import FlightLogStorage

        return Log(FlightLogStorage(str(url)))
    if parts.scheme == "riverbed":  # the log servers the control plane knows
        from riverbed.config import load_config
        from riverbed.log.discovery import discovered, resolver
        from riverbed.log.flight import FlightLogStorage

        plane = control or load_config().control_url
        servers = FlightLogStorage(discovered(str(url), plane), resolve=resolver(str(url), plane))
        return Log(servers)
    raise LogError(
        f"unknown log URL {url!r}; use file:///path, memory://, s3://bucket/prefix "
        "(diskless topics), flight://host:port (a `riverbed log serve`), riverbed:// (the "
        "log servers the control plane knows) or "
        "kafka://host:9092 (a Kafka cluster's topics, read-only)"
    )


def _diskless(url: str, control: str | None, flush_ms: float | None) -> LogStorage:
    from riverbed.config import load_config
    from riverbed.control import connect
    from riverbed.log.diskless import FLUSH_MS, DisklessLogStorage
    from riverbed.storage import open_store

    store = open_store(url)  # checks the bucket's URL before a control plane is dialled
    config = load_config()
    plane = connect(control or config.control_url)
    return DisklessLogStorage(
        store,
        plane,
        flush_ms=FLUSH_MS if flush_ms is None else flush_ms,
        cache_dir=config.home / "cache" / "log",  # reads: memory, then this disk
        close_control=True,
    )
