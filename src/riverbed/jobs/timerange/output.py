"""A time-range job's output folder: staged files, atomic publication, carried state.

::

    <output>/rows/chunk=20260101T050000Z/part.parquet        one file per chunk
    <output>/windows_1h/chunk=20260101T050000Z/part.parquet  tumbling aggregates
    <output>/_riverbed/staging/<token>/                      a chunk's files before publication
    <output>/_riverbed/carry/<token>/                        state carried after that chunk

A chunk's files are written under its token first; once the progress marker names that
token (the compare-and-swap), each file is moved into place with ``os.replace`` — atomic,
so a reader sees the old chunk or the new one, never both and never half. A staged file
can be moved once: a driver that takes over finishes the moves of the last published
chunk, and a paused driver that wakes up later finds nothing left to move. Readers see
no duplicate rows at any moment (``read_parquet('<output>/rows/*/*.parquet')``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from riverbed.files import fsync_dir
from riverbed.jobs.timerange.plan import chunk_label

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Output"]


class Output:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.meta = self.root / "_riverbed"

    def staging(self, token: str) -> Path:
        return self.meta / "staging" / token

    def carry(self, token: str) -> Path:
        return self.meta / "carry" / token

    def final(self, dataset: str, start: int) -> Path:
        return self.root / dataset / f"chunk={chunk_label(start)}" / "part.parquet"

    @staticmethod
    def write(path: Path, table: pa.Table) -> None:
        """Write ``table`` to ``path`` durably (a temporary file, fsync, rename)."""
        import pyarrow.parquet as pq

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def publish(self, token: str, start: int) -> int:
        """Move chunk ``start``'s staged files into place; returns how many were moved.

        Idempotent and race-free: each staged file is renamed at most once, by whoever
        gets there first; the others find it gone.
        """
        staged = self.staging(token)
        moved = 0
        if not staged.is_dir():
            return 0
        for path in sorted(staged.glob("*.parquet")):
            target = self.final(path.stem, start)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(path, target)
            except FileNotFoundError:
                continue
            fsync_dir(target.parent)
            moved += 1
        shutil.rmtree(staged, ignore_errors=True)
        return moved

    def discard(self, token: str) -> None:
        """Delete the staged files and carried state of a token that was never published."""
        shutil.rmtree(self.staging(token), ignore_errors=True)
        shutil.rmtree(self.carry(token), ignore_errors=True)

    def forget(self, keep: set[str], pending: str | None) -> int:
        """Delete staged and carried files of tokens no chunk record names; returns count."""
        removed = 0
        for kind in ("staging", "carry"):
            folder = self.meta / kind
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if entry.name == pending or (kind == "carry" and entry.name in keep):
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        return removed

    def datasets(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name != "_riverbed")

    def read(self, dataset: str = "rows") -> pa.Table:
        """Every published chunk of ``dataset`` as one table (tests, status, the demo)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted((self.root / dataset).glob("chunk=*/part.parquet"))
        if not files:
            return pa.table({})
        return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
