"""Which servers on the MySQL protocol can hold a jobs database (a pure check)."""

from __future__ import annotations

import pytest

from riverbed.jobs.schema import mariadb_refusal


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("10.11.19-MariaDB-0+deb12u1", True),
        ("10.6.0-MariaDB", True),
        ("11.4.2-MariaDB-log", True),
        ("10.5.25-MariaDB", False),  # no SKIP LOCKED
        ("8.0.36", False),  # MySQL: no INSERT … RETURNING
        ("8.4.0-commercial", False),
        ("5.5.5-10.11.6-MariaDB", True),  # the prefix MariaDB shows old MySQL clients
        ("garbage", False),
    ],
)
def test_only_mariadb_10_6_or_newer_is_accepted(version: str, ok: bool) -> None:
    refusal = mariadb_refusal(version)
    assert (refusal is None) == ok
    if refusal:
        assert version in refusal and "MariaDB 10.6 or newer" in refusal
