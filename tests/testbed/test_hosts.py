"""The pure plan of a test bed's names and addresses."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.testing.hostplan import (
    IFNAME_MAX,
    MAX_HOSTS,
    NETWORK,
    SLOTS,
    BedPlanError,
    plan,
)

slots = st.integers(0, SLOTS - 1)
counts = st.integers(1, MAX_HOSTS)
modes = st.sampled_from(["netns", "loopback"])


@given(slots, counts, modes)
def test_every_address_is_in_the_reserved_block_and_names_fit(slot, count, mode):
    p = plan(slot, count, mode)
    assert [h.name for h in p.hosts] == [f"h{i}" for i in range(1, count + 1)]
    addresses = [p.gateway, *(h.address for h in p.hosts)]
    assert len(set(addresses)) == len(addresses)
    for a in addresses:
        ip = ipaddress.ip_address(a)
        assert ip in NETWORK if mode == "netns" else ip.is_loopback
        assert ip in ipaddress.ip_network(f"{p.gateway}/{p.prefix}", strict=False)
    names = [p.bridge, *(h.link for h in p.hosts)]
    if mode == "netns":
        assert all(0 < len(n) <= IFNAME_MAX for n in names)
        assert len(set(names)) == len(names)
        assert len({h.netns for h in p.hosts}) == count
    else:
        assert names == [""] * (count + 1)
    assert p.addresses == frozenset(addresses)


@given(slots, slots, counts, modes)
def test_two_slots_never_share_a_name_or_an_address(a, b, count, mode):
    if a == b:
        return
    pa, pb = plan(a, count, mode), plan(b, count, mode)
    assert not pa.addresses & pb.addresses
    if mode == "netns":
        na = {pa.bridge, *(h.link for h in pa.hosts), *(h.netns for h in pa.hosts)}
        nb = {pb.bridge, *(h.link for h in pb.hosts), *(h.netns for h in pb.hosts)}
        assert not na & nb


@pytest.mark.parametrize(
    ("slot", "count", "mode", "words"),
    [
        (-1, 3, "netns", "slot -1"),
        (SLOTS, 3, "netns", f"slot {SLOTS}"),
        (0, 0, "netns", "not 0"),
        (0, MAX_HOSTS + 1, "netns", f"not {MAX_HOSTS + 1}"),
        (0, 3, "docker", "'docker'"),
    ],
)
def test_impossible_beds_are_refused_by_name(slot, count, mode, words):
    with pytest.raises(BedPlanError, match=words):
        plan(slot, count, mode)


def test_an_unknown_host_names_the_hosts_there_are():
    with pytest.raises(BedPlanError, match="h1, h2, h3"):
        plan(0, 3).host("h4")
