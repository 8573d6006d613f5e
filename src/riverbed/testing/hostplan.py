"""The plan of a test bed's hosts: names, interfaces and addresses (pure).

A test bed (``riverbed.testing.testbed``) makes several *hosts* on one machine. A host is
a Linux network namespace joined to a bridge the test bed creates, with an address from
198.18.0.0/15 — the block reserved for network test beds (RFC 2544), so a test host
can never be confused with a real machine. Each bed takes one /24 of it, chosen by its
*slot* (0-511), so that beds of concurrent test runs never share a name or an address;
the bridge holds ``.1`` (the gateway: the servers every host shares, like the S3 server,
listen there), hosts ``.11`` upward. A host has no default route: it can reach the
other hosts of its bed and the gateway, and nothing else.

Where namespaces are not permitted (no root, no ``ip``), a bed falls back to one
loopback address per host: ``127.18.<slot>.<11+i>`` (slots above 255 use 127.19.*).
Hosts are then told apart only by address — a partition cannot cut a link and is
stood in for by stopping the host's processes, which ``testbed`` says when it does.

Everything here is a function of (slot, count, mode); the I/O lives in ``testbed``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from riverbed.errors import InvalidValueError

__all__ = [
    "IFNAME_MAX",
    "MAX_HOSTS",
    "NETWORK",
    "SLOTS",
    "BedPlan",
    "BedPlanError",
    "HostPlan",
    "Mode",
    "bridge_name",
    "netns_prefix",
    "plan",
]

Mode = Literal["netns", "loopback"]

NETWORK = ipaddress.ip_network("198.18.0.0/15")
SLOTS = 512  # /24s in 198.18.0.0/15
MAX_HOSTS = 200  # .11 .. .210
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
_FIRST_HOST = 11


class BedPlanError(InvalidValueError):
    """A test bed was asked for a slot or a number of hosts it cannot have."""


@dataclass(frozen=True)
class HostPlan:
    """One host: its name (``h1``…), namespace, root-side link and address."""

    name: str
    netns: str  # empty in loopback mode
    link: str  # the root-namespace end of the host's veth pair; empty in loopback mode
    address: str


@dataclass(frozen=True)
class BedPlan:
    slot: int
    mode: Mode
    bridge: str  # empty in loopback mode
    gateway: str  # where shared servers listen: the bridge (netns) or 127.18.<slot>.1
    prefix: int
    hosts: tuple[HostPlan, ...]

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        names = ", ".join(h.name for h in self.hosts)
        raise BedPlanError(f"no host {name!r} in this test bed (its hosts: {names})")

    @property
    def addresses(self) -> frozenset[str]:
        """Every address of the bed: the only targets its traffic may have."""
        return frozenset({self.gateway, *(h.address for h in self.hosts)})


def bridge_name(slot: int) -> str:
    """The bridge of the bed in ``slot``."""
    return f"rbbr{slot}"


def netns_prefix(slot: int) -> str:
    """What the names of the namespaces of the bed in ``slot`` begin with."""
    return f"riverbed-{slot}-"


def _subnet(slot: int, mode: Mode) -> tuple[int, int, int]:
    if mode == "netns":
        return 198, 18 + slot // 256, slot % 256
    return 127, 18 + slot // 256, slot % 256


def plan(slot: int, count: int, mode: Mode = "netns") -> BedPlan:
    """The names and addresses of a bed in ``slot`` with ``count`` hosts ``h1``…``hN``."""
    if not 0 <= slot < SLOTS:
        raise BedPlanError(f"test bed slot {slot} is outside 0..{SLOTS - 1}")
    if not 1 <= count <= MAX_HOSTS:
        raise BedPlanError(f"a test bed has 1 to {MAX_HOSTS} hosts, not {count}")
    if mode not in ("netns", "loopback"):
        raise BedPlanError(f"test bed mode {mode!r} is neither 'netns' nor 'loopback'")
    a, b, c = _subnet(slot, mode)
    hosts = []
    for i in range(1, count + 1):
        name = f"h{i}"
        address = f"{a}.{b}.{c}.{_FIRST_HOST + i - 1}"
        if mode == "netns":
            hosts.append(HostPlan(name, netns_prefix(slot) + name, f"rbv{slot}{name}", address))
        else:
            hosts.append(HostPlan(name, "", "", address))
    return BedPlan(
        slot=slot,
        mode=mode,
        bridge=bridge_name(slot) if mode == "netns" else "",
        gateway=f"{a}.{b}.{c}.1",
        prefix=24,
        hosts=tuple(hosts),
    )
