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

from pathlib import Path
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
]


def open(url: str | Path) -> Log:
    """``file:///path`` (or a plain path), ``memory://``, or ``flight://host:port`` — a
    log server (``riverbed log serve``) on this or another machine."""
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
    from riverbed.log.wire import SCHEMES

    if parts.scheme in SCHEMES:
        from riverbed.log.flight import FlightLogStorage

        return Log(FlightLogStorage(str(url)))
    raise LogError(
        f"unknown log URL {url!r}; use file:///path, memory:// or flight://host:port "
        "(a `riverbed log serve`)"
    )
