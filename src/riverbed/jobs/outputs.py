"""Where job outputs are published: the one place that picks the publication.

Under ``<home>/jobs/output`` on this machine (:class:`~riverbed.jobs.publication.
DirectoryPublication`), or — when the ``checkpoints`` setting names a bucket — under
``<checkpoints>/jobs/output`` (:class:`~riverbed.jobs.objectpublication.ObjectPublication`),
so that a lost machine loses no published output. Workers, their executors, the
orchestrator and ``ctx.published`` all open it here, from the same setting.
"""

from __future__ import annotations

from pathlib import Path

from riverbed.jobs.objectpublication import ObjectPublication
from riverbed.jobs.publication import DirectoryPublication, Publication
from riverbed.locations import child, is_local
from riverbed.storage import shared_store

__all__ = ["OUTPUTS", "open_publication"]

OUTPUTS = "jobs/output"  # below a bucket's checkpoints location: every job's outputs


def open_publication(home: Path, checkpoints: str | Path | None = None) -> Publication:
    """The publication of this riverbed: in a bucket when ``checkpoints`` names one,
    else under ``home``. Attempts stage under ``home`` either way."""
    if checkpoints is None or checkpoints == "" or is_local(checkpoints):
        return DirectoryPublication(home)
    return ObjectPublication(shared_store(str(child(checkpoints, OUTPUTS))), home)
