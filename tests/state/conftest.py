from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.state import StateConfig, StateProvider
from tests.conftest import LOCATIONS, location_of


@pytest.fixture(params=["rocksdb", "memory"])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(params=LOCATIONS)
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the durable tier is: a directory, this process's memory, or a bucket."""
    return location_of(request.param, request, tmp_path, "durable")


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
