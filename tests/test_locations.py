"""What a location is, and how output shows one (never a password)."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from riverbed.locations import shown
from riverbed.stream.doors import Iceberg, SqlTable
from riverbed.stream.joins import Lookup

# "Zq" first: no scheme or host here holds it, so finding it in the output is a leak
_secret = st.text(alphabet=string.ascii_letters + string.digits + "!$%&*+-_~@:").map(
    lambda s: "Zq" + s
)


@given(
    scheme=st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "s3", "kafka"]),
    user=st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8),
    secret=_secret,
    host=st.sampled_from(["db", "10.0.0.1:5432", "h.example:1"]),
    path=st.sampled_from(["", "/db", "/a/b?sslmode=require"]),
)
def test_shown_leaves_out_the_user_and_password(
    scheme: str, user: str, secret: str, host: str, path: str
) -> None:
    url = f"{scheme}://{user}:{secret}@{host}{path}"
    out = shown(url)
    assert out == f"{scheme}://{host}{path}"
    assert secret not in out


def test_shown_keeps_what_has_no_credentials() -> None:
    for text in ["sqlite:///a/b.db", "/data/x", "s3://bucket/prefix", "file:///d", "x@y"]:
        assert shown(text) == text
    assert shown(Path("/p")) == "/p"


def test_reprs_of_sinks_and_lookups_hold_no_password(tmp_path: Path) -> None:
    url = "postgresql://rb:Sup3rSecret@db:5432/app"
    configs = [
        Iceberg(url, "ns.t", warehouse=str(tmp_path)),
        Lookup(url, on="user_id", table="users"),
        SqlTable(url),
    ]
    for config in configs:
        assert "Sup3rSecret" not in repr(config) and "rb:" not in repr(config)
    assert "db:5432/app" in repr(configs[0]) and "table='users'" in repr(configs[1])
