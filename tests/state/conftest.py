from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.state import StateConfig, StateProvider


@pytest.fixture(params=["rocksdb", "memory"])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def provider(engine: str, tmp_path: Path) -> StateProvider:
    return StateProvider(
        StateConfig(
            local_dir=tmp_path / "local",
            durable=tmp_path / "durable",
            engine=engine,
            snapshot_every=3,
            retain_versions=4,
            lock_timeout=0.5,
        )
    )
