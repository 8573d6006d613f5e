"""riverbed.files: the one reading of a SQLite URL, and its writer lock's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.files import sqlite_path, writer_lock

names = st.lists(
    st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8).filter(
        lambda n: n not in (".", "..")
    ),
    min_size=1,
    max_size=4,
).map("/".join)


@given(names)
def test_three_slashes_name_a_relative_path_and_four_an_absolute_one(path):
    assert sqlite_path(f"sqlite:///{path}", "x.db") == Path(path)
    assert sqlite_path(f"sqlite:////{path}", "x.db") == Path("/" + path)
    assert writer_lock(Path(path)) == Path(path + ".lock")


@pytest.mark.parametrize("url", ["etcd://h1:2379", "memory://", "postgresql://u@h/db"])
def test_other_schemes_are_not_sqlite(url):
    assert sqlite_path(url, "x.db") is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite://host/x.db", "three slashes and a path, e.g. sqlite:///.riverbed/jobs.db"),
        ("sqlite://", "no database path; e.g. sqlite:///.riverbed/jobs.db"),
        ("sqlite:///", "no database path"),
    ],
)
def test_a_malformed_sqlite_url_says_how_to_spell_it(url, problem):
    with pytest.raises(ValueError, match=problem.replace(".", r"\.")):
        sqlite_path(url, ".riverbed/jobs.db")
