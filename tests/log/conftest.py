from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import riverbed.log
from riverbed.log import Log
from riverbed.log.file import FileLogStorage
from riverbed.log.server import LogServer


@pytest.fixture
def log_server(tmp_path: Path) -> Iterator[LogServer]:
    """``riverbed log serve`` of a file log, in this process, on a free loopback port."""
    server = LogServer(FileLogStorage(tmp_path / "served"))
    yield server
    server.shutdown()
    server.storage.close()


@pytest.fixture(params=["memory", "file", "flight"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """The same contract on every storage: in memory, on disk, and through a log server
    (a client that reaches the files only over Arrow Flight)."""
    if request.param == "flight":
        server = request.getfixturevalue("log_server")
        opened = riverbed.log.open(server.url)
    else:
        url = "memory://" if request.param == "memory" else f"file://{tmp_path / 'log'}"
        opened = riverbed.log.open(url)
    yield opened
    opened.close()


@pytest.fixture
def file_log(tmp_path: Path) -> Iterator[Log]:
    opened = riverbed.log.open(tmp_path / "log")
    yield opened
    opened.close()
