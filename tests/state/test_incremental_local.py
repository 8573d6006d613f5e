"""A directory's state snapshots are incremental as a bucket's are: consecutive
snapshots share RocksDB's unchanged files, and a machine with an empty disk restores
from them (the bucket's own test: tests/state/test_objects.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from riverbed.state.objects import ObjectStorage
from tests.state.test_objects import commit, contents, provider


def test_a_directorys_snapshots_share_unchanged_files_and_restore(tmp_path: Path) -> None:
    durable = str(tmp_path / "durable")
    p = provider(durable, tmp_path / "machine-1")
    storage = p.durable
    assert isinstance(storage, ObjectStorage)
    for version in range(1, 9):
        commit(p, version, 3000, version)
    stats = storage.stats
    assert stats.reused_files > 0, "later snapshots share the unchanged SST files"
    assert stats.uploaded_bytes < stats.uploaded_bytes + stats.reused_bytes
    want = contents(p, 8)
    shutil.rmtree(tmp_path / "machine-1")
    fresh = provider(durable, tmp_path / "machine-2")
    assert contents(fresh, 8) == want
    shared = list((tmp_path / "durable" / "agg" / "0" / "shared").iterdir())
    snapshots = list((tmp_path / "durable" / "agg" / "0" / "snapshot").iterdir())
    assert shared and all(len(list(s.iterdir())) == 1 for s in snapshots)  # a manifest each
