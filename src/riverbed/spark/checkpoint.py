"""Spark's own checkpoint logs (``offsets/``, ``commits/``) where riverbed must tend
them: in a directory through the file system (Hadoop's hidden temporary files are no
objects of a :class:`~riverbed.storage.FileStore`), in a bucket as objects.
"""

from __future__ import annotations

import logging
from pathlib import Path

from riverbed.locations import is_local, local_path
from riverbed.storage import ObjectStore, shared_store

__all__ = ["clear_unfinished_start"]

log = logging.getLogger(__name__)


def clear_unfinished_start(location: str | Path) -> None:
    """Remove what a driver killed while writing Spark's *first* offset-log entry left,
    in Spark's checkpoint at ``location`` (a directory or an ``s3://`` URL).

    Spark writes each entry to a hidden temporary file (``offsets/.0.<uuid>.tmp``) and
    renames it (on a bucket S3A's rename is a copy, then a delete). Killed before the
    rename, the entry was never committed, but the next start of the query (at batch 0
    again) refuses the checkpoint: "the checkpoint location …/offsets should be empty on
    batch 0". With no committed entry, the hidden files in ``offsets/`` and ``commits/``
    are exactly those unfinished writes; once an entry is committed, nothing here is
    touched.
    """
    if not is_local(location):
        _clear_in_bucket(shared_store(str(location)))
        return
    root = local_path(location)
    offsets = root / "offsets"
    if not offsets.is_dir() or any(p.name.isdigit() for p in offsets.iterdir()):
        return
    for directory in (offsets, root / "commits"):
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if path.name.startswith(".") and path.is_file():
                log.warning("removing %s: an unfinished first batch of a killed driver", path)
                path.unlink()


def _clear_in_bucket(spark: ObjectStore) -> None:
    offsets = [info.key for info in spark.list("offsets/")]
    if any(key.rsplit("/", 1)[-1].isdigit() for key in offsets):
        return
    for key in [*offsets, *(info.key for info in spark.list("commits/"))]:
        if key.rsplit("/", 1)[-1].startswith("."):
            what = f"{spark.url}/{key}"
            log.warning("removing %s: the unfinished first batch of a killed driver", what)
            spark.delete(key)
