"""The ``cp`` fixture: one control plane per backend, for the contract suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from riverbed.control import ControlPlane, connect
from riverbed.testing import EtcdCluster

BACKENDS = ["memory", "sqlite", pytest.param("etcd", marks=pytest.mark.etcd)]


def backend_url(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if name == "memory":
        return "memory://"
    if name == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    server: EtcdCluster = request.getfixturevalue("etcd_server")
    return server.url


@pytest.fixture(params=BACKENDS)
def cp(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlPlane]:
    plane = connect(backend_url(request.param, tmp_path, request))
    yield plane
    plane.close()


@pytest.fixture
def ns() -> str:
    """A key prefix private to one test (the etcd server is shared by the run)."""
    return f"t/{uuid.uuid4().hex[:10]}/"
