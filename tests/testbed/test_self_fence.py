"""Self-fencing (issue 34): a driver cut off from the control plane stops writing, by
its own lease clock, before the control plane could expire its lease and elect anyone
else — and the term recorded in the checkpoint still stops a driver that did not."""

from __future__ import annotations

import time

import pytest

from riverbed.control import Session, connect
from riverbed.stream.fencing import DriverFencedError, check_term
from riverbed.stream.leader import DriverLease
from riverbed.testing.cluster import Cluster
from riverbed.testing.testbed import TestBed

TTL = 4


def test_the_lease_clock_counts_from_each_refresh_sent():
    cp = connect("memory://")
    session = Session(cp, ttl=3)
    try:
        assert 2.5 < session.remaining() <= 3
        time.sleep(1.5)  # refreshed every second: the clock was wound back up
        assert session.remaining() > 1.5
    finally:
        session.close()
    assert session.remaining() == 0


@pytest.fixture
def etcd_on_a_host(tmp_path):
    with TestBed.create(tmp_path / "bed", hosts=1) as bed:
        yield Cluster(bed), Cluster(bed).start_etcd()


@pytest.mark.etcd
def test_a_driver_cut_off_from_etcd_stops_writing_before_its_lease_can_expire(
    etcd_on_a_host, tmp_path
):
    cluster, url = etcd_on_a_host
    checkpoint = tmp_path / "ckpt"
    lease = DriverLease(url, "agg", checkpoint, ttl=TTL)
    term = lease.acquire(standby=False)
    try:
        check_term(checkpoint, term, "agg")  # leading: writes pass
        assert lease.still_leading()
        cluster.bed.partition("h1")  # etcd's host: no refresh gets through now
        cut = time.monotonic()
        while True:
            assert time.monotonic() - cut < TTL + 2, "the driver never fenced itself"
            asked = time.monotonic()
            leading = lease.still_leading()  # the stream loop's question: never blocks
            assert time.monotonic() - asked < 0.2
            try:
                check_term(checkpoint, term, "agg")
            except DriverFencedError as exc:
                assert "could not refresh its lease" in str(exc)
                break
            # a write is let through only with a quarter of the lease certainly left
            assert lease.session.remaining() >= lease.margin - 0.05
            assert leading
            time.sleep(0.05)
        # it gave up by the end of its own clock: before the control plane could expire
        # the lease (that counts from the same refresh, on the server's side)
        assert time.monotonic() - cut <= TTL + 0.5
        assert not lease.still_leading()  # and the loop's own question agrees, offline
    finally:
        cluster.bed.heal("h1")
        lease.close()


def test_the_recorded_term_fences_a_driver_whose_clock_has_not_run_out(tmp_path):
    checkpoint = tmp_path / "ckpt"
    url = f"sqlite:///{tmp_path / 'control.db'}"
    old = DriverLease(url, "agg", checkpoint, ttl=30)
    old_term = old.acquire(standby=False)
    old.session.close(revoke=True)  # as if its lease ended while it was paused
    new = DriverLease(url, "agg", checkpoint, ttl=30)
    try:
        new_term = new.acquire(standby=False)
        assert new_term > old_term
        with pytest.raises(DriverFencedError):
            check_term(checkpoint, old_term, "agg")
        check_term(checkpoint, new_term, "agg")
    finally:
        new.close()
        old.close()
