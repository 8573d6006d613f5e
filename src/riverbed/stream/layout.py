"""Every path under an aggregation's checkpoint location — the one owner of the layout.

::

    <checkpoints>/                       RIVERBED_CHECKPOINTS (default <home>/checkpoints)
        state/<name>/<partition>/...     durable state: changelogs and snapshots (state/)
        <name>/                          one aggregation's checkpoint
            riverbed/batches/<batch:012d>.json   batch records: plan, watermark, counts
            riverbed/driver.json         the active driver's term (fencing.py)
            riverbed/spec.json           the state partition count, fixed on first start
            riverbed/job.json            the manifest: what the console reads
            riverbed/handoff/<run>/      work-stealing boards of running batches (steal.py)
            spark/offsets/<batch>        Spark's offset and commit logs (DataFrame path,
            spark/commits/<batch>          and checkpoints of the Spark-driven loop)
            local-state/                 the default local RocksDB directory (a cache)

Code asks :class:`Checkpoint` for a path instead of joining names, so moving the
durable tier (object storage) changes this module, not its readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Checkpoint", "aggregations", "state_root"]


STATE = "state"  # the durable state's place under a checkpoint location


def state_root(checkpoints: Path) -> Path:
    """The durable state of every aggregation under ``checkpoints``."""
    return checkpoints / STATE


def state_url(checkpoints: str) -> str:
    """:func:`state_root` of a location given as a URL (``s3://bucket/prefix``,
    ``file:///path``) or a path."""
    return f"{checkpoints.rstrip('/')}/{STATE}"


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint location of one aggregation."""

    root: Path

    @classmethod
    def of(cls, root: str | Path) -> Checkpoint:
        return cls(Path(root))

    @property
    def _riverbed(self) -> Path:
        return self.root / "riverbed"

    @property
    def batches(self) -> Path:
        return self._riverbed / "batches"

    def batch(self, batch_id: int) -> Path:
        return self.batches / f"{batch_id:012d}.json"

    @property
    def driver(self) -> Path:
        return self._riverbed / "driver.json"

    @property
    def spec(self) -> Path:
        return self._riverbed / "spec.json"

    @property
    def manifest(self) -> Path:
        return self._riverbed / "job.json"

    @property
    def handoff(self) -> Path:
        return self._riverbed / "handoff"

    @property
    def spark(self) -> Path:
        return self.root / "spark"

    @property
    def spark_offsets(self) -> Path:
        return self.spark / "offsets"

    @property
    def spark_commits(self) -> Path:
        return self.spark / "commits"

    @property
    def local_state(self) -> Path:
        return self.root / "local-state"

    @classmethod
    def of_batch_record(cls, path: Path) -> Checkpoint:
        """The checkpoint a batch record's path lies in."""
        return cls(path.parent.parent.parent)


def aggregations(checkpoints: Path) -> list[str]:
    """The names of the aggregations that have run under ``checkpoints``."""
    if not checkpoints.is_dir():
        return []
    return sorted(p.name for p in checkpoints.iterdir() if Checkpoint(p).batches.is_dir())
