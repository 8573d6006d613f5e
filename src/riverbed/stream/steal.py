"""Work stealing between the co-located tasks of one batch, so a hot log partition does
not leave a core idle.

In the co-located path each task owns whole state partitions (:mod:`riverbed.stream.
direct`): it reads log partition *p*, pre-aggregates it and merges the partials into
state partition *p*. State partitions are spread over the tasks by size, but a
partition cannot be cut: with zipf-skewed keys one log partition holds 43 % of a batch
and the two cores split it 43/57. Reading and pre-aggregating a slice is most of the
work, and it *can* be cut. So every slice is cut into pieces of ``PIECE`` records, and
a task that has finished its own partitions helps the others:

1. A piece is processed by whoever **claims** it first (an exclusive create of its
   claim file, holding the task's index, on the :class:`Board`: a directory of this
   batch run that every task reaches — under a local checkpoint, or on the driver's
   machine when the checkpoint is a bucket and the tasks run there too, see
   :func:`~riverbed.stream.layout.handoff_dir`). A retried task finds its earlier
   attempt's claims its own.
2. The owner walks its partitions in order and each one's pieces **front to back**,
   claiming and processing them; a helper walks the other tasks' partitions in the
   **opposite** order, pieces back to front (:func:`steal_order`), so the two meet in
   the middle of the last partition instead of racing for the same pieces.
3. A helper writes what it computed for a piece — the partials and the piece's side
   counts — to the board; it never merges into state and never waits.
4. The owner, when its own claims of a partition are done, takes the helpers' results
   for the rest (waiting at most ``wait_s`` for one that is still being computed:
   the helper is in step 3, which never waits, so the owner's wait is one piece long)
   and merges all partials **in piece order** into state partition *p*.

Exactly-once is untouched: only the owner merges and commits a state version, and a
piece's result is a pure function of its records, so a piece computed twice (a helper
lost after its claim: the owner computes it itself after ``wait_s``; a retried task
finding its earlier attempt's results) gives the same partials. The side counts of a
piece (input, late, malformed) travel with its result and are counted by the owner
only, once. When tasks run one after another (one core free), the first one finds the
others' pieces unclaimed and does their reading for them: the same work, moved.

Only a lopsided batch gets a board (:func:`lopsided`: the plan already knows each
task's load); evenly spread tasks finish together, and claims would only cost.

The pure core is :func:`split`, :func:`steal_order` and :func:`lopsided`; :class:`Board`
is the I/O.
"""

from __future__ import annotations

import logging
import os
import pickle  # results of this job's own tasks, as Spark's RDDs pickle them
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from riverbed.spark.source import CHUNK, LogSlice
from riverbed.stream.errors import StreamValueError

log = logging.getLogger(__name__)

PIECE = CHUNK  # records per piece: one columnar read (~10-20 ms of a task's work here)


def split(piece: LogSlice, size: int = PIECE) -> list[LogSlice]:
    """``piece`` cut into consecutive pieces of ``size`` records (the last shorter);
    none for an empty slice. Depends on the slice alone, so every task and every re-run
    cuts a batch the same way."""
    if size < 1:
        raise StreamValueError(f"piece size must be positive, not {size}")
    return [
        LogSlice(piece.partition, start, min(start + size, piece.end))
        for start in range(piece.start, piece.end, size)
    ]


def loads(groups: Sequence[Sequence[LogSlice]]) -> list[int]:
    """Records each task reads for its own partitions."""
    return [sum(s.end - s.start for s in group) for group in groups]


def steal_order(groups: Sequence[Sequence[LogSlice]], me: int, size: int = PIECE) -> list[LogSlice]:
    """The pieces task ``me`` tries to claim once its own partitions are done: the other
    tasks' work, most loaded task first, each task's partitions last-processed first and
    their pieces back to front (its owner walks them front to back)."""
    load = loads(groups)
    others = sorted((i for i in range(len(groups)) if i != me), key=lambda i: -load[i])
    return [
        piece
        for i in others
        for owned in reversed(groups[i])
        for piece in reversed(split(owned, size))
    ]


def lopsided(groups: Sequence[Sequence[LogSlice]], tolerance: float = 1.05) -> bool:
    """Whether the tasks' loads are uneven enough for helping to pay: the most loaded
    task has more than ``tolerance`` times the mean. Spread evenly (uniform keys), the
    tasks finish together and claims and hand-overs would only cost (~5 % measured)."""
    load = loads(groups)
    if len(load) < 2 or sum(load) == 0:
        return False
    return max(load) > tolerance * sum(load) / len(load)


class Board:
    """Claims and handed-over results of one batch run: ``<root>/<p>-<start>.claim``
    and ``.result`` files. Made by the driver (:meth:`create`), used by the tasks,
    removed by the driver after the job."""

    def __init__(self, root: str | Path, wait_s: float = 30.0) -> None:
        self.root = Path(root)
        self.wait_s = wait_s

    @classmethod
    def create(cls, parent: Path, batch_id: int, stale_s: float = 3600.0) -> Board:
        """A fresh board for one run of batch ``batch_id`` under ``parent`` (the
        aggregation's :func:`~riverbed.stream.layout.handoff_dir`; a re-run gets a new
        board; one left by a driver that crashed is removed once ``stale_s`` old)."""
        parent.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in parent.iterdir():
            try:
                if now - old.stat().st_mtime > stale_s:
                    shutil.rmtree(old, ignore_errors=True)
            except FileNotFoundError:  # another driver's cleanup got there first
                continue
        root = parent / f"{batch_id}-{uuid.uuid4().hex[:12]}"
        root.mkdir()
        return cls(root)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _name(self, piece: LogSlice, suffix: str) -> Path:
        return self.root / f"{piece.partition}-{piece.start}.{suffix}"

    def claim(self, piece: LogSlice, task: int) -> bool:
        """True for the one task that claims ``piece`` first — and for a later attempt
        of that same task (Spark retried it: its earlier attempt's claims are its own,
        and no result of them was handed over)."""
        path = self._name(piece, "claim")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                return path.read_text() == str(task)
            except FileNotFoundError:  # the board was removed: the job is over
                return False
        try:
            os.write(fd, str(task).encode())
        finally:
            os.close(fd)
        return True

    def put(self, piece: LogSlice, result: Any) -> None:
        """Hand ``result`` over to the piece's owner (atomically: whole or absent)."""
        final = self._name(piece, "result")
        tmp = final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        tmp.replace(final)

    def take(self, piece: LogSlice) -> Any | None:
        """The result a helper handed over for ``piece``; ``None`` when none came within
        ``wait_s`` (the helper was lost: the caller computes the piece itself).

        Waits by polling the file (1 ms growing to 20 ms): the helper is another
        process, maybe on another machine, and a shared directory is all the tasks of a
        Spark stage have in common."""
        path = self._name(piece, "result")
        deadline = time.monotonic() + self.wait_s
        pause = 0.001
        while True:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    log.warning(
                        "no result for %s-%s within %.0f s: computing it here",
                        piece.partition,
                        piece.start,
                        self.wait_s,
                    )
                    return None
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            return pickle.loads(data)  # noqa: S301 -- written by this job's own tasks


__all__ = ["PIECE", "Board", "lopsided", "split", "steal_order"]
