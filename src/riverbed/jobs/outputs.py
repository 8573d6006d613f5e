"""Where job outputs are published: the one place that picks the publication's store.

Under ``<home>/jobs/output`` on this machine, or — when the ``checkpoints`` setting names
a bucket — under ``<checkpoints>/jobs/output``, so that a lost machine loses no published
output. Either is one :class:`~riverbed.jobs.publication.Publication` over an object
store. Workers, their executors, the orchestrator and ``ctx.published`` all open it
here, from the same setting.
"""

from __future__ import annotations

from pathlib import Path

from riverbed.jobs.publication import Publication, adopt_old_layout
from riverbed.locations import in_bucket
from riverbed.storage import open_store, shared_store

__all__ = ["OUTPUTS", "open_publication"]

OUTPUTS = "jobs/output"  # below home, or below a bucket's checkpoints location

_adopted: set[str] = set()  # homes whose old-layout outputs this process has adopted


def open_publication(home: Path, checkpoints: str | Path | None = None) -> Publication:
    """The publication of this riverbed: in a bucket when ``checkpoints`` names one,
    else under ``home`` (whose outputs published by an older riverbed get their markers
    the first time). Attempts stage under ``home`` either way."""
    home = Path(home)
    bucket = in_bucket(checkpoints, OUTPUTS)
    if bucket is not None:
        return Publication(shared_store(bucket), home)
    store = open_store(str(home / OUTPUTS))
    if store.url not in _adopted:
        adopt_old_layout(store)
        _adopted.add(store.url)
    return Publication(store, home)
