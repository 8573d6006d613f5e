from __future__ import annotations

import os
from pathlib import Path

import pytest

from riverbed.state import StateConfig, StateProvider


@pytest.fixture(params=["rocksdb", "memory"])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(params=["file", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the durable tier is: a directory, this process's memory, or a bucket."""
    if request.param == "file":
        return str(tmp_path / "durable")
    if request.param == "memory":
        return f"memory://state-{os.urandom(4).hex()}"
    url: str = request.getfixturevalue("s3_url")
    return url


@pytest.fixture
def provider(engine: str, durable: str, tmp_path: Path) -> StateProvider:
    return StateProvider(
        StateConfig(
            local_dir=tmp_path / "local",
            durable=durable,
            engine=engine,
            snapshot_every=3,
            retain_versions=4,
            lock_timeout=0.5,
        )
    )
