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
