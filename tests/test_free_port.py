"""riverbed.testing.free_port: the ports test servers are started on."""

from __future__ import annotations

import socket

from riverbed.testing import free_port


def test_ports_asked_for_together_are_never_the_same() -> None:
    """Nothing binds the ports between the calls (a Kafka cluster's nodes are given
    theirs before any starts), so only free_port itself keeps them apart: 500 from a
    range of ~12,000 would repeat one almost surely (a birthday bound of 1 - e^-10)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:  # and each is one a server can bind now
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
