from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.state import CorruptStateError, PartitionBusyError, StateConfig, StateProvider, codecs
from riverbed.state.keys import (
    closed_prefix,
    closed_window_key,
    expire_before,
    is_closed_window_key,
    split_window_key,
    split_window_key_ms,
    split_window_keys_ms,
    window_key,
    window_key_of_closed,
)

T0 = datetime(2026, 11, 21, tzinfo=UTC)


@given(st.integers(0, 2**50), st.integers(0, 2**50), st.binary(max_size=8), st.binary(max_size=8))
def test_window_keys_sort_by_time_first(a: int, b: int, ka: bytes, kb: bytes) -> None:
    assert (window_key(a, ka) < window_key(b, kb)) == ((a, ka) < (b, kb))


@given(st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=12)), max_size=20))
def test_many_window_keys_split_at_once_as_each_alone(pairs: list[tuple[int, bytes]]) -> None:
    data = [window_key(ms, key) for ms, key in pairs]
    starts, keys = split_window_keys_ms(data)
    assert list(zip(starts.tolist(), keys, strict=True)) == [split_window_key_ms(k) for k in data]
    assert starts.dtype == "int64"


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.binary(max_size=8))
def test_a_closed_windows_key_is_its_window_key_apart_and_back(
    start: int, expire_to: int, key: bytes
) -> None:
    """A closed window kept beside panes: a key of its own, after every window key, the
    user key still 8 bytes in, its window key back from it, and inside the range that
    expires it exactly when its start is at or before the expiry."""
    closed = closed_window_key(window_key(start, key))
    assert is_closed_window_key(closed) and not is_closed_window_key(window_key(start, key))
    assert closed > window_key(2**62, b"\xff" * 8) and closed[8:] == key
    assert window_key_of_closed(closed) == window_key(start, key)
    assert (closed_prefix(0) <= closed < closed_prefix(expire_to + 1)) == (start <= expire_to)


def test_expire_before_drops_whole_windows(provider: StateProvider) -> None:
    store = provider.load("w", 0)
    for hour in range(6):
        for flag in (b"f1", b"f2"):
            store.put(window_key(T0 + timedelta(hours=hour), flag), b"x")
    store.commit()
    store = provider.load("w", 0)
    expire_before(store, T0 + timedelta(hours=4))
    store.commit()
    store = provider.load("w", 0)
    left = [split_window_key(k) for k, _ in store.scan()]
    store.abort()
    assert left == [(T0 + timedelta(hours=h), f) for h in (4, 5) for f in (b"f1", b"f2")]


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        window_key(datetime(2026, 1, 1), b"k")  # noqa: DTZ001 - the point of the test


def test_codec_roundtrip_and_clear_errors() -> None:
    value = {"users": 3, "flags": ["a", "b"], "blob": b"\x00\x01", "mean": 1.5}
    assert codecs.decode(codecs.encode(value)) == value
    with pytest.raises(TypeError, match="cannot store object"):
        codecs.encode(object())
    with pytest.raises(CorruptStateError):
        codecs.decode(b"\xc1")


def test_partition_held_by_another_process_waits_then_fails_clearly(tmp_path: Path) -> None:
    config = StateConfig(local_dir=tmp_path / "l", durable=tmp_path / "d", lock_timeout=0.5)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from riverbed.state import StateConfig, StateProvider; "
            f"p = StateProvider(StateConfig(local_dir=Path({str(tmp_path / 'l')!r}), "
            f"durable=Path({str(tmp_path / 'd')!r}))); s = p.load('ns', 0); "
            "print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(PartitionBusyError, match="another process"):
            StateProvider(config).load("ns", 0)
        assert time.monotonic() - started >= 0.5  # it waited first
    finally:
        holder.kill()
        holder.wait()
    StateProvider(config).load("ns", 0).abort()  # free once the holder is gone
