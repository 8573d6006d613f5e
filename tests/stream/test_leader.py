"""The driver lease against the checkpoint's terms: a control plane whose terms are
behind those the checkpoint recorded (a new SQLite file, a reset etcd) is named at
start, on a directory and in a bucket alike — it could never fence the drivers of the
control plane the aggregation ran with, and its own driver would be fenced by the
checkpoint's newer term at its first write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from riverbed.stream.fencing import check_term, record_term, recorded_driver
from riverbed.stream.leader import DriverLease, TermBehindError


@pytest.mark.parametrize("where", ["directory", "memory"])
def test_a_control_plane_behind_the_checkpoints_terms_is_named_at_start(
    where: str, tmp_path: Path
) -> None:
    checkpoint = (
        str(tmp_path / "ckpt") if where == "directory" else f"memory://lead-{os.urandom(4).hex()}"
    )
    first_url = f"sqlite:///{tmp_path / 'first.db'}"
    terms = []
    for _ in range(3):  # three drivers in turn under the first control plane
        lease = DriverLease(first_url, "agg", checkpoint, ttl=5)
        try:
            terms.append(lease.acquire(standby=False))
            check_term(checkpoint, terms[-1], "agg")  # each rules in its turn
        finally:
            lease.close()
    assert terms == sorted(set(terms))  # the same control plane: its terms only grow
    held = int(recorded_driver(checkpoint)["term"])  # type: ignore[index]
    fresh = DriverLease(f"sqlite:///{tmp_path / 'new.db'}", "agg", checkpoint, ttl=5)
    try:
        behind = rf"with term \d+, but the checkpoint .* term {held}:"
        with pytest.raises(TermBehindError, match=behind):
            fresh.acquire(standby=False)
    finally:
        fresh.close()
    assert int(recorded_driver(checkpoint)["term"]) == held  # type: ignore[index]
    record_term(checkpoint, held + 1, "someone", "now")  # what does rule is untouched
    check_term(checkpoint, held + 1, "agg")


def test_a_driver_standing_by_again_waits_for_a_control_plane_it_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that lost its lead to a partition campaigns again with a new lease; right
    after the heal no etcd endpoint may answer yet — connecting fails, not only the
    campaign. It says so and tries again until one does (found on CI: the cluster demo's
    cut-off driver exited with "no etcd endpoint … answered within 3s" instead)."""
    import socket

    from riverbed.cli import stream as stream_cli

    monkeypatch.setattr(stream_cli, "REJOIN_WAIT_S", (0.05, 0.05))  # (seconds between tries)
    with socket.socket() as probe:  # a port nothing listens on: an unreachable etcd
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tries: list[str] = []

    def make() -> DriverLease:
        """Two tries against the unreachable etcd, then a control plane that answers."""
        url = f"etcd://127.0.0.1:{port}?timeout=0.5" if len(tries) < 2 else (
            f"sqlite:///{tmp_path / 'control.db'}"
        )  # fmt: skip
        tries.append(url)
        return DriverLease(url, "agg", str(tmp_path / "ckpt"), ttl=5)

    said: list[str] = []
    lease = stream_cli._stand_by_again(make, said.append)
    try:
        assert lease.term is not None and len(tries) == 3
        waited = [s for s in said if "the control plane does not answer yet" in s]
        assert len(waited) == 2 and all("no etcd endpoint" in s for s in waited), said
        assert int(recorded_driver(str(tmp_path / "ckpt"))["term"]) == lease.term  # type: ignore[index]
    finally:
        lease.close()
