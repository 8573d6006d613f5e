"""Where a checkpoint's batches ended, per log partition: from riverbed's batch records,
or — for checkpoints a Spark streaming query drove (the DataFrame path, and the loop
before riverbed recorded its plans) — from Spark's own offset and commit logs
(``<checkpoint>/spark/offsets/<batch>``, ``spark/commits/<batch>``), read as objects of
the checkpoint's store, in a directory and in a bucket alike.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

from riverbed.storage import ObjectNotFoundError, ObjectStore
from riverbed.stream.batchlog import BatchRecord, open_batches
from riverbed.stream.layout import checkpoint_store, spark_location
from riverbed.stream.plan import ends_of, slices_json

__all__ = [
    "committed_ends",
    "read_ends",
    "source_offsets",
    "spark_committed_ends",
    "spark_ends",
    "spark_slices",
]

OFFSETS = "offsets/"  # below Spark's location: its write-ahead offset log
COMMITS = "commits/"  # its commit log


def spark_ends(checkpoint: str | Path, batch_id: int) -> dict[int, int] | None:
    """Where batch ``batch_id`` ended in every log partition according to Spark's
    write-ahead offset log (``spark/offsets/<b>``): for checkpoints written when a
    Spark streaming query drove this path (their batch records hold no slices).
    ``None`` when it cannot tell (the entry gone, an unexpected format)."""
    try:
        text = _spark_logs(checkpoint).get(f"{OFFSETS}{batch_id}").decode()
        offsets = source_offsets(text)
    except (ObjectNotFoundError, ValueError):
        return None
    return None if offsets is None else {int(p): int(e) for p, e in offsets.items()}


def spark_committed_ends(checkpoint: str | Path) -> dict[int, int] | None:
    """Where the newest batch in Spark's commit log ended in every partition
    (:func:`spark_ends` of it); ``None`` before the first commit or when the logs
    cannot tell (an unexpected format)."""
    keys = (info.key.removeprefix(COMMITS) for info in _spark_logs(checkpoint).list(COMMITS))
    done = sorted(int(k) for k in keys if k.isdigit())
    return spark_ends(checkpoint, done[-1]) if done else None


def _spark_logs(checkpoint: str | Path) -> ObjectStore:
    """Spark's own offset and commit logs of a checkpoint, as objects (Hadoop's
    ``.crc`` and temporary files beside them are hidden names no digit starts)."""
    return checkpoint_store(spark_location(checkpoint))


def committed_ends(checkpoint: str | Path, newest_first: Iterable[BatchRecord]) -> dict[int, int]:
    """Where the newest finished batch ended, per log partition: its recorded plan, or
    for a checkpoint of the Spark-driven loop, Spark's commit and offset logs ({}: no
    batch finished, or they cannot tell)."""
    done = next((d for d in newest_first if d.done), None)
    if done is not None and done.slices is not None:
        return ends_of(done.slices)
    return spark_committed_ends(checkpoint) or {}


def read_ends(checkpoint: str | Path) -> tuple[dict[int, int] | None, bool]:
    """:func:`committed_ends` of a checkpoint (``None`` when there are none), and
    whether Spark's streaming engine drove its batches (their records hold no slices:
    a checkpoint of the DataFrame path, which stays on it). Records are read newest
    first, only as far as the newest finished one."""
    batches = open_batches(checkpoint)
    records = (r for r in map(batches.get, reversed(batches.ids())) if r is not None)
    newest = next(records, None)
    if newest is None:
        return None, False
    if newest.slices is None:
        return spark_committed_ends(checkpoint), True
    return committed_ends(checkpoint, itertools.chain([newest], records)) or None, False


def spark_slices(checkpoint: str | Path, batch_id: int) -> dict[str, list[int]] | None:
    """A batch's slices, as a batch record stores them, from Spark's offset log: batch
    *b* started where *b - 1* ended. ``None`` when the log cannot tell (batch 0, files
    gone, an unexpected format)."""
    if batch_id == 0:
        return None
    end, start = spark_ends(checkpoint, batch_id), spark_ends(checkpoint, batch_id - 1)
    if end is None or start is None:
        return None
    return slices_json({p: start.get(p, 0) for p in end}, end)


def source_offsets(text: str) -> dict[str, int] | None:
    """The one source's offsets in an offset log entry (``v1``, metadata, one line per
    source), if it has that shape: riverbed's ``{"<partition>": end}``, or Spark's Kafka
    source's ``{"<topic>": {"<partition>": end}}`` (one topic)."""
    lines = text.splitlines()
    if len(lines) != 3 or lines[0] != "v1":
        return None
    offsets = json.loads(lines[2])
    if isinstance(offsets, dict) and len(offsets) == 1:
        (only,) = offsets.values()
        if isinstance(only, dict):
            offsets = only
    if not isinstance(offsets, dict) or not all(
        isinstance(v, int) and str(k).isdigit() for k, v in offsets.items()
    ):
        return None
    return offsets
