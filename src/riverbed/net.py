"""Binding servers safely: the log server and the console share these rules."""

from __future__ import annotations

import errno
import ipaddress
import socket


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound (a taken port, a foreign address), said with
    the fix; None when it can (or ``port`` is 0: any free one)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            hint = (
                "is another server using the port? pick another --port (0: any free one)"
                if exc.errno == errno.EADDRINUSE
                else f"is {host} an address of this machine? (0.0.0.0: every address)"
            )
            return f"{exc.strerror or exc}; {hint}"
    return None
