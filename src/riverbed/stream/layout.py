"""Every path under an aggregation's checkpoint location — the one owner of the layout.

::

    <checkpoints>/                       RIVERBED_CHECKPOINTS (default <home>/checkpoints)
        state/<name>/<partition>/...     durable state: changelogs and snapshots (state/);
        state/<name>.g<G>.<M>.v<V>/...     after a rescale, generation G's M partitions
        <name>/                          one aggregation's checkpoint
            riverbed/batches/<batch:012d>.json   the batch's plan, created once; re-runs read it
            riverbed/batches/<batch:012d>.side   its late/malformed records are in their topics
            riverbed/commits/<batch:012d>.json   the done record: the batch's commit, created once
            riverbed/terms/<term:020d>.json      one record per elected driver; the newest rules
            riverbed/spec.json           the state partition count, fixed on first start
            riverbed/specs/<hash>.json   a spec's shape, once; batch records name theirs
            riverbed/generations/<G>.json  a state generation: its partition count, once
            riverbed/job.json            the manifest: what the console reads
            riverbed/versions/<N>.json   version N is current from here on (versions.py)
            riverbed/handoff/<run>/      work-stealing boards of running batches (steal.py)
            spark/offsets/<batch>        Spark's offset and commit logs (DataFrame path,
            spark/commits/<batch>          and checkpoints of the Spark-driven loop)
            local-state/                 the default local RocksDB directory (a cache)
        output/<name>/batch_id=<id>/part-00000.parquet   the result table, when the
                                         checkpoints are in a bucket

Every record is an object of the checkpoint's store (:func:`checkpoint_store`: a
directory or ``s3://bucket/prefix``), what is current decided by create-only writes
alone (a ``link`` on a disk, ``If-None-Match: *`` in a bucket), since a bucket has no
atomic rename. A directory's checkpoint from before this layout may hold one record
file per batch (rewritten when done) and ``riverbed/driver.json`` (the term, replaced):
both still read (:mod:`riverbed.stream.batchlog`, :mod:`riverbed.stream.fencing`).
In a bucket Spark writes its own logs through Hadoop's s3a://.

Work-stealing boards are not durable (a re-run of a batch gets a new one), so with a
bucket's checkpoint they live on the machine the tasks share with the driver
(:func:`handoff_dir`).

Code asks :class:`Checkpoint` for a path, or this module for a key, instead of joining
names; :func:`is_local` says which a location is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from riverbed.locations import OUTPUT, child, is_local, local_path, location, output_url, parse
from riverbed.spark import tasks_on_this_machine

if TYPE_CHECKING:
    from riverbed.state import StateConfig
    from riverbed.storage import ObjectStore

__all__ = [
    "Checkpoint",
    "aggregations",
    "backfill_key",
    "batch_key",
    "check_format",
    "checkpoint_store",
    "checkpoints_location",
    "child",
    "commit_key",
    "generation_key",
    "handoff_dir",
    "is_local",
    "local_path",
    "location",
    "output_url",
    "record_format",
    "restored_key",
    "savepoint_key",
    "savepoint_rows_key",
    "side_key",
    "spark_location",
    "spec_key",
    "state_root",
    "state_url",
    "version_key",
]


STATE = "state"  # the durable state's place under a checkpoint location
RIVERBED = "riverbed/"  # everything of riverbed's own in a checkpoint
BATCHES = "riverbed/batches/"
COMMITS = "riverbed/commits/"
TERMS = "riverbed/terms/"
LEGACY_DRIVER = "riverbed/driver.json"  # a directory's term record before terms/
SPEC = "riverbed/spec.json"
FORMAT = "riverbed/format.json"  # the checkpoint's format version (riverbed.formats)
GENERATIONS = "riverbed/generations/"  # state generations: <G>.json (rescale.py)
BACKFILLS = "riverbed/backfills/"  # rows a backfill rewrote: <G>.parquet (backfill.py)
SAVEPOINTS = "riverbed/savepoints/"  # <name>.json and .parquet (savepoints.py)
RESTORED = "riverbed/restored/"  # <aggregation>.<savepoint>.json: started from it
SPECS = "riverbed/specs/"  # the shapes batches ran with: <shape hash>.json (changes.py)
MANIFEST = "riverbed/job.json"
JOIN = "riverbed/join.json"  # a stream-stream join's shape, fixed at first start (streamjoin.py)
LOOKUPS = "riverbed/lookups/"  # lookup tables' snapshots: <content hash>.arrow (lookups.py)
VERSIONS = "riverbed/versions/"  # <N>.json: version N is current from here on (versions.py)


_FORMAT_CHECKED: set[str] = set()


def check_format(checkpoint: str | Path) -> None:
    """Refuse a checkpoint a newer riverbed wrote (:mod:`riverbed.formats`; one read per
    checkpoint and process)."""
    import json

    from riverbed.formats import check
    from riverbed.locations import shown
    from riverbed.storage.errors import ObjectNotFoundError

    if str(checkpoint) in _FORMAT_CHECKED:
        return
    try:
        found = json.loads(checkpoint_store(checkpoint).get(FORMAT)).get("format")
    except ObjectNotFoundError:
        found = None  # written before checkpoints recorded it, or not started yet
    check("checkpoint", found, f"checkpoint {shown(str(checkpoint))}")
    _FORMAT_CHECKED.add(str(checkpoint))


def record_format(checkpoint: str | Path) -> None:
    """Record the checkpoint's format, once (its first start with this riverbed)."""
    import json

    from riverbed import __version__
    from riverbed.formats import CURRENT

    data = {"format": CURRENT["checkpoint"], "written_by": __version__}
    checkpoint_store(checkpoint).put_if_absent(FORMAT, json.dumps(data).encode())


def generation_key(number: int) -> str:
    """Where state generation ``number`` is recorded (:mod:`riverbed.stream.rescale`)."""
    return f"{GENERATIONS}{number:06d}.json"


def backfill_key(generation: int) -> str:
    """Where the result rows a backfill rewrote wait for the first batch of state
    generation ``generation`` to write them (:mod:`riverbed.stream.backfill`)."""
    return f"{BACKFILLS}{generation:06d}.parquet"


def savepoint_key(name: str) -> str:
    """Where savepoint ``name``'s record is (:mod:`riverbed.stream.savepoints`)."""
    return f"{SAVEPOINTS}{name}.json"


def restored_key(aggregation: str, name: str) -> str:
    """The marker that a checkpoint started from savepoint ``name`` of ``aggregation``."""
    return f"{RESTORED}{aggregation}.{name}.json"


def savepoint_rows_key(name: str) -> str:
    """Where savepoint ``name``'s result rows (the result table at its cut) are."""
    return f"{SAVEPOINTS}{name}.parquet"


def version_key(number: int) -> str:
    """Where the record that made version ``number`` current is (:mod:`.versions`)."""
    return f"{VERSIONS}{number:06d}.json"


def spec_key(shape_hash: str) -> str:
    """Where a spec's shape is stored (:mod:`riverbed.stream.changes`), by its hash."""
    return f"{SPECS}{shape_hash}.json"


def checkpoints_location(url: str) -> str | Path:
    """Where checkpoints go, from a setting (``--checkpoints``, RIVERBED_CHECKPOINTS,
    riverbed.toml): :func:`riverbed.locations.parse`."""
    return parse(url, "checkpoints")


def checkpoint_store(location: str | Path) -> ObjectStore:
    """The object store at a checkpoint's location — a directory or a bucket — one per
    process (clients are reused by every batch and every task)."""
    from riverbed.storage import shared_store

    return shared_store(location)


def batch_key(batch_id: int) -> str:
    return f"{BATCHES}{batch_id:012d}.json"


def side_key(batch_id: int) -> str:
    return f"{BATCHES}{batch_id:012d}.side"


def commit_key(batch_id: int) -> str:
    return f"{COMMITS}{batch_id:012d}.json"


SPARK = "spark"  # Spark's own offset and commit logs under a checkpoint
SPARK_COMMITS = f"{SPARK}/commits/"  # Spark's commit of batch <b>: the object <b>


def spark_location(checkpoint: str | Path) -> str:
    """Where Spark keeps its own logs for the checkpoint at ``checkpoint``: a directory,
    or a bucket's ``s3://…/spark`` URL (Spark reaches it as ``s3a://``)."""
    return str(child(location(checkpoint), SPARK))


def state_root(checkpoints: Path) -> Path:
    """The durable state of every aggregation under ``checkpoints``."""
    return checkpoints / STATE


def default_state(checkpoint: str | Path) -> StateConfig:
    """The state of a query started without a ``StateConfig``: its local cache and
    durable tier in its checkpoint's directory. A checkpoint in a bucket needs one (the
    local cache is a directory of this machine)."""
    from riverbed.state import StateConfig
    from riverbed.stream.errors import StreamValueError

    if not is_local(checkpoint):
        raise StreamValueError(
            f"checkpoint {checkpoint} is in a bucket: pass state=StateConfig(local_dir=…, "
            "durable=…) so the local state cache is a directory of this machine"
        )
    local = local_path(checkpoint)
    return StateConfig(local_dir=Checkpoint(local).local_state, durable=state_root(local))


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
        """The checkpoint at a local location (a path or ``file://`` URL)."""
        return cls(local_path(root))

    @property
    def _riverbed(self) -> Path:
        return self.root / "riverbed"

    @property
    def batches(self) -> Path:
        return self.root / BATCHES.rstrip("/")

    @property
    def spec(self) -> Path:
        return self.root / SPEC

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def handoff(self) -> Path:
        return self._riverbed / "handoff"

    @property
    def spark(self) -> Path:
        return self.root / SPARK

    @property
    def spark_offsets(self) -> Path:
        return self.spark / "offsets"

    @property
    def spark_commits(self) -> Path:
        return self.spark / "commits"

    @property
    def local_state(self) -> Path:
        return self.root / "local-state"


def handoff_dir(checkpoint: str, local_cache: Path, name: str, spark_master: str) -> Path | None:
    """Where a batch run's work-stealing boards go (:mod:`riverbed.stream.steal`): a
    directory every task of the batch reaches. A local checkpoint's ``handoff``
    directory (its file system reaches every task that reaches the checkpoint). With a
    bucket's checkpoint and a local Spark master, the tasks run on the driver's machine:
    ``<home>/handoff/<name>`` beside its state cache (``local_cache``) — nothing there is
    needed to resume. A bucket's checkpoint with tasks on other machines: None, no
    stealing — a claim per piece in the bucket costs a request about as long as the
    piece's work (docs/stream.md)."""
    if is_local(checkpoint):
        return Checkpoint.of(checkpoint).handoff
    if tasks_on_this_machine(spark_master):
        return local_cache.parent / "handoff" / name
    return None


def aggregations(checkpoints: str | Path) -> list[str]:
    """The names of the aggregations that have run under ``checkpoints`` (not the
    stream-stream joins: :func:`joins`)."""
    store = checkpoint_store(checkpoints)
    return [
        n
        for n in store.entries()
        if n not in (OUTPUT, STATE)
        and (store.exists(f"{n}/{MANIFEST}") or store.entries(f"{n}/{BATCHES}"))
        and not store.exists(f"{n}/{JOIN}")
    ]


def joins(checkpoints: str | Path) -> list[str]:
    """The names of the stream-stream joins that have started under ``checkpoints``."""
    store = checkpoint_store(checkpoints)
    return [n for n in store.entries() if n not in (OUTPUT, STATE) and store.exists(f"{n}/{JOIN}")]
