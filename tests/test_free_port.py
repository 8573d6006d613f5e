"""riverbed.testing.free_port: the ports test servers are started on."""

from __future__ import annotations

import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.testing import free_port
from riverbed.testing.servers import (
    PORTS_ENV,
    ServerError,
    host_port_range,
    port_range,
    port_slice,
)


def test_ports_asked_for_together_are_never_the_same() -> None:
    """Nothing binds the ports between the calls (a Kafka cluster's nodes are given
    theirs before any starts), so only free_port itself keeps them apart: 500 from a
    range of ~12,000 would repeat one almost surely (a birthday bound of 1 - e^-10)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:  # and each is one a server can bind now
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


@given(
    st.integers(1024, 60000).flatmap(lambda low: st.tuples(st.just(low), st.integers(low, 65535))),
    st.integers(1, 16),
)
def test_the_slices_of_a_range_are_disjoint_and_cover_it(
    bounds: tuple[int, int], count: int
) -> None:
    low, high = bounds
    slices = [port_slice(low, high, i, count) for i in range(count)]
    ports = [p for a, b in slices for p in range(a, b + 1)]
    assert ports == list(range(low, high + 1))  # in order: disjoint, nothing left out
    if high - low + 1 >= count:
        assert all(a <= b for a, b in slices)  # none empty
        sizes = [b - a + 1 for a, b in slices]
        assert max(sizes) - min(sizes) <= 1


def test_free_port_draws_from_its_processs_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under xdist each worker has a slice of its own (tests/conftest.py); within one,
    free_port answers from it only."""
    low, high = port_range(32768)
    assert (low, high) == (32767 - 12000, 32767)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a slice of this host's whole range
        mine_low, mine_high = (int(p) for p in os.environ[PORTS_ENV].split("-"))
        whole_low, whole_high = host_port_range()
        assert whole_low <= mine_low < mine_high <= whole_high
    monkeypatch.setenv(PORTS_ENV, "21000-21049")
    ports = {free_port() for _ in range(30)}
    assert len(ports) == 30 and all(21000 <= p <= 21049 for p in ports)
    for bad in ("21000", "x-y", "900-1000", "5000-4000"):
        monkeypatch.setenv(PORTS_ENV, bad)
        with pytest.raises(ServerError, match=PORTS_ENV):
            free_port()
