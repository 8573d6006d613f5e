"""A durable directory with a file in the way is refused naming the file and the fix,
before and while writing, and what is stored stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.state import StateConfig, StateProvider
from riverbed.state.errors import StateValueError


def test_a_file_where_the_durable_directory_goes_is_named(tmp_path: Path) -> None:
    (tmp_path / "durable").write_text("not a directory")
    with pytest.raises(StateValueError, match=r"durable\b.* is a file where a directory goes"):
        StateProvider(StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable"))
    assert (tmp_path / "durable").read_text() == "not a directory"


def test_a_file_in_the_way_of_a_partition_is_named_and_committed_state_stays(
    tmp_path: Path,
) -> None:
    provider = StateProvider(
        StateConfig(local_dir=tmp_path / "local", durable=tmp_path / "durable")
    )
    store = provider.load("ns", 0, version=0)
    store.put(b"a", b"1")
    store.commit(1)
    (tmp_path / "durable" / "ns" / "1").write_text("in the way")
    store = provider.load("ns", 1, version=0)
    store.put(b"b", b"2")
    with pytest.raises(StateValueError, match=r"ns/1 is a file where a directory goes"):
        store.commit(1)
    assert provider.load("ns", 0, version=1).get(b"a") == b"1"
