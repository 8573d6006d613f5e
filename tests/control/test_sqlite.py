"""SQLite-specific behaviour: automatic history trimming, URL options, shared files."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.control import CompactedError, InvalidURLError, connect


def test_history_is_trimmed_automatically(tmp_path: Path) -> None:
    cp = connect(f"sqlite:///{tmp_path / 'c.db'}?history=100")
    for i in range(1000):  # revisions 2..1001; trimming runs every 1000 revisions
        cp.put("k", str(i))
    with cp.watch("k", start_revision=2) as watch, pytest.raises(CompactedError) as err:
        watch.get(timeout=5)
    assert err.value.compact_revision == 900
    with cp.watch("k", start_revision=1000) as watch:
        event = watch.get(timeout=5)
    assert event is not None and event.revision == 1000 and event.kv.value == b"998"
    cp.close()


def test_two_connections_share_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    a, b = connect(url), connect(url)
    with b.watch("shared") as watch:
        a.put("shared", "hello")
        event = watch.get(timeout=5)
    assert event is not None and event.kv.value == b"hello"
    assert b.get("shared") is not None
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///x.db?poll=fast", "not a number"),
        ("sqlite://", "no database path"),
        ("sqlite://host/x.db", "three slashes"),
    ],
)
def test_bad_sqlite_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidURLError, match=message):
        connect(url)
