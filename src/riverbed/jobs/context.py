"""What a job's ``main(ctx, work_ids, **kwargs)`` gets: its claim and fenced output.

**Fenced output.** ``ctx.output`` stages a chunk's files in a directory private to
this attempt. When the chunk succeeds, the worker publishes them — as
``<home>/jobs/output/<job>/chunk=<id>/``, or under ``<checkpoints>/jobs/output`` when the
checkpoints are in a bucket — and only then records DONE, so whoever sees DONE finds the
output; an older attempt (a zombie) can never replace a newer one's output
(:mod:`riverbed.jobs.publication` owns the layout and the protocol). ``ctx.published``
reads them the same way wherever they are: as local files (copies, from a bucket).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from riverbed.config import Config
from riverbed.jobs.errors import JobsError, JobsValueError, SpecError
from riverbed.jobs.outputs import open_publication
from riverbed.jobs.publication import Publication, staging_dir

__all__ = ["ChunkOutput", "Context", "Output", "staging_dir"]


class ChunkOutput:
    """Files a chunk stages; published only if this attempt's result is recorded."""

    def __init__(self, staging: Path) -> None:
        self.dir = staging

    def __repr__(self) -> str:
        return f"ChunkOutput({str(self.dir)!r})"

    def path(self, name: str) -> Path:
        """A path inside this attempt's staging directory (parents created)."""
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise JobsValueError(f"output name {name!r} must be a relative path inside the output")
        target = self.dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self.path(name)
        target.write_text(text, encoding="utf-8")
        return target

    def write_json(self, name: str, value: Any) -> Path:
        return self.write_text(name, json.dumps(value, sort_keys=True, default=str) + "\n")

    def write_parquet(self, name: str, table: Any) -> Path:
        """A pyarrow Table or a pandas DataFrame as one Parquet file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not isinstance(table, pa.Table):
            table = pa.Table.from_pandas(table, preserve_index=False)
        target = self.path(name)
        pq.write_table(table, target)
        return target

    @property
    def used(self) -> bool:
        return self.dir.exists() and any(self.dir.iterdir())


Output = ChunkOutput  # the name it had: a chunk's ``ctx.output``


@dataclass
class Context:
    """A running chunk: who it is, its fencing token, and where its output goes."""

    chunk_id: int
    attempt: int
    job: str
    work_ids: list[int]
    kwargs: dict[str, Any]
    master: int | None
    output: ChunkOutput
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("riverbed.job"))
    home: Path | None = None
    spec_path: Path | None = None  # the job's module
    code_version: str | None = None  # what runs: git SHA and the module's hash
    publication: Publication | None = None  # where outputs are (default: under home)
    # riverbed's settings, as the executor's entry point read them (None: the defaults)
    config: Config | None = None
    _spark: Any = None

    def published(self, job: str, name: str) -> Path | None:
        """The newest published file ``name`` of job ``job`` — how a job reads what
        its dependencies wrote (``ctx.output`` names per work id make this exact, e.g.
        ``day=20261103.parquet``). None if no published chunk has it."""
        return self._publication().job_files(job, name).get(name)

    def published_files(self, job: str, pattern: str = "*") -> dict[str, Path]:
        """Every published file of job ``job`` whose name matches ``pattern``, by name;
        when a rerun published a name again, the newest chunk's file. Local paths: the
        files themselves, or copies of a bucket's (cached; an output never changes)."""
        return self._publication().job_files(job, pattern)

    def _publication(self) -> Publication:
        if self.publication is None:
            if self.home is None:
                raise JobsError("this context has no riverbed home to read outputs from")
            self.publication = open_publication(self.home)
        return self.publication

    @property
    def token(self) -> tuple[int, int]:
        """(chunk id, attempt): unique per attempt; writes outside ``output`` can carry it
        to be fenced downstream (e.g. a ``WHERE attempt <= :token`` upsert)."""
        return (self.chunk_id, self.attempt)

    @property
    def spark(self) -> Any:
        """The worker's warm SparkSession (jobs of ``kind="spark"``)."""
        if self._spark is None:
            raise SpecError(
                f"job '{self.job}' asked for ctx.spark but is not kind='spark'; set "
                "Job(kind='spark', ...) so a worker runs it with a SparkSession"
            )
        return self._spark
