from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import riverbed.log
from riverbed.log import Log


@pytest.fixture(params=["memory", "file"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    url = "memory://" if request.param == "memory" else f"file://{tmp_path / 'log'}"
    opened = riverbed.log.open(url)
    yield opened
    opened.close()


@pytest.fixture
def file_log(tmp_path: Path) -> Iterator[Log]:
    opened = riverbed.log.open(tmp_path / "log")
    yield opened
    opened.close()
