from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import riverbed.log
from riverbed.control.memory import MemoryControlPlane
from riverbed.log import Log
from riverbed.log.diskless import DisklessLogStorage
from riverbed.log.file import FileLogStorage
from riverbed.log.server import LogServer
from riverbed.storage.memory import MemoryStore


@pytest.fixture
def log_server(tmp_path: Path) -> Iterator[LogServer]:
    """``riverbed log serve`` of a file log, in this process, on a free loopback port."""
    server = LogServer(FileLogStorage(tmp_path / "served"))
    yield server
    server.shutdown()
    server.storage.close()


@pytest.fixture(
    params=[
        "memory",
        "file",
        "flight",
        "diskless",
        pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.etcd]),
    ]
)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """The same contract on every storage: in memory, on disk, through a log server
    (a client that reaches the files only over Arrow Flight), and diskless — objects in
    a store, offsets in a control plane: in this process's memory, and in the tests'
    S3 server (Ceph RGW) with their etcd."""
    if request.param == "flight":
        server = request.getfixturevalue("log_server")
        opened = riverbed.log.open(server.url)
    elif request.param == "diskless":
        store = MemoryStore(f"diskless-{uuid.uuid4().hex}")
        opened = Log(DisklessLogStorage(store, MemoryControlPlane(), flush_ms=5))
    elif request.param == "s3":
        s3_url = request.getfixturevalue("s3_url")
        etcd = request.getfixturevalue("etcd_server")
        opened = riverbed.log.open(s3_url, control=etcd.url, flush_ms=5)
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
