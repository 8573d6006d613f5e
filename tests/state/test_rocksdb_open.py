"""Opening a RocksDB partition whatever state a crash left its OPTIONS files in."""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict

from riverbed.state.rocksdb import RocksEngine


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


def test_a_db_killed_between_its_column_family_and_its_options_file_opens(
    tmp_path: Path,
) -> None:
    """RocksDB records a new column family in its MANIFEST, then writes a new OPTIONS
    file; a process killed in between leaves a DB whose latest OPTIONS file names only
    ``default``. Seen on a test-bed host: the next open failed with "Column families not
    opened: riverbed" and the standby never took over."""
    path = tmp_path / "db"
    db = Rdict(str(path), _options())  # OPTIONS file with `default` only
    db.close()
    before = {p.name: p.read_bytes() for p in path.glob("OPTIONS-*")}
    db = Rdict(str(path), _options())
    db.create_column_family("riverbed", _options())
    db.close()
    for p in path.glob("OPTIONS-*"):
        p.unlink()
    for name, data in before.items():  # what the kill left: the older file only
        (path / name).write_bytes(data)
    assert Rdict.list_cf(str(path)) == ["default", "riverbed"]  # the MANIFEST has it

    local = RocksEngine().open(path)
    try:
        local.apply([("put", b"k", b"v")], version=3, tag=0)
        assert local.marker == (3, 0)
    finally:
        local.close()
    local = RocksEngine().open(path)
    try:
        assert local.get(b"k") == b"v" and local.marker == (3, 0)
    finally:
        local.close()


def test_a_db_whose_options_files_are_gone_opens_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "db"
    local = RocksEngine().open(path)
    local.apply([("put", b"a", b"1")], version=1, tag=7)
    local.close()
    for p in path.glob("OPTIONS-*"):
        p.unlink()
    local = RocksEngine().open(path)
    try:
        assert local.get(b"a") == b"1" and local.marker == (1, 7)
    finally:
        local.close()


def test_a_partition_opened_again_and_again_keeps_few_old_info_logs(tmp_path: Path) -> None:
    """RocksDB starts an info log at each open and kept 1,000 old ones by default: a
    partition opened every batch grew by ~56 KB a batch while its data stayed flat."""
    from riverbed.state.rocksdb import KEPT_INFO_LOGS

    path = tmp_path / "db"
    for version in range(1, 13):
        local = RocksEngine().open(path)
        local.apply([("put", b"k", str(version).encode())], version=version, tag=0)
        local.close()
    old = list(path.glob("LOG.old*"))
    assert 0 < len(old) <= KEPT_INFO_LOGS
    local = RocksEngine().open(path)
    try:
        assert local.get(b"k") == b"12" and local.marker == (12, 0)
    finally:
        local.close()
