"""Tables whose partitions are replaced whole by fenced writers (riverbed.tables): one
contract for Delta and Iceberg, on a directory and in the tests' bucket — a partition
replaced at a version once, never by an older or equal version, a stale writer that
read the table before a newer commit loses the table's check, and each reader (the
table's own, Polars, Spark's Parquet reader) sees every partition's rows once."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import riverbed.tables
from riverbed.tables import (
    DELTA_TXN_RETENTION,
    ICEBERG_AT,
    ICEBERG_VERSION,
    PARTITION,
    DeltaPartitions,
    IcebergPartitions,
    PartitionTable,
    TableError,
    TableNameError,
    delta_interval,
    expired_versions,
    parse_table,
    partition_table,
    read_with_spark,
)

KINDS = [
    "delta",
    "iceberg",
    pytest.param("delta-s3", marks=pytest.mark.s3),
    pytest.param("iceberg-s3", marks=pytest.mark.s3),
]


@pytest.fixture(params=KINDS)
def spelled(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind.endswith("-s3"):
        url = request.getfixturevalue("s3_url")
        if kind == "delta-s3":
            return f"delta:{url}/lake"
        return f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.chunks@{url}/warehouse"
    if kind == "delta":
        return f"delta:{tmp_path / 'lake'}"
    return f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.chunks"


def rows(*values: int) -> pa.Table:
    return pa.table({"sensor": pa.array(values, pa.int64()), "v": [v / 2 for v in values]})


def content(table: PartitionTable) -> list[tuple[str, int]]:
    got = table.read()
    return sorted(
        zip(got.column(PARTITION).to_pylist(), got.column("sensor").to_pylist(), strict=True)
    )


def test_a_partition_is_replaced_once_per_version_and_never_by_an_older_one(spelled: str) -> None:
    t = partition_table(spelled, "sensors")
    assert t.version("a") is None and t.read().num_rows == 0
    assert t.replace("a", rows(1, 2), 10)
    assert t.replace("b", rows(3), 11)
    assert not t.replace("a", rows(9), 10)  # the same version again: a re-publication
    assert not t.replace("a", rows(9), 7)  # an older run of the chunk: never back
    assert content(t) == [("a", 1), ("a", 2), ("b", 3)]
    assert t.replace("a", rows(4, 5, 6), 12)  # a rerun replaces the partition whole
    assert (t.version("a"), t.version("b"), t.version("c")) == (12, 11, None)
    assert content(t) == [("a", 4), ("a", 5), ("a", 6), ("b", 3)]
    assert t.replace("b", rows(), 13)  # a rerun that found no rows empties it
    assert content(t) == [("a", 4), ("a", 5), ("a", 6)]
    other = partition_table(spelled, "other-job")  # versions are per writing job
    assert other.version("a") is None
    t.drop()
    assert t.read().num_rows == 0 and partition_table(spelled, "sensors").version("a") is None


def test_a_writer_that_read_the_table_before_a_newer_commit_loses(
    spelled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused publisher that decided on an old read: its commit fails the table's
    optimistic check, it reads again, finds the newer version and writes nothing."""
    t = partition_table(spelled, "sensors")
    t.replace("a", rows(1), 5)
    stale = t._table()  # type: ignore[attr-defined]  # what the paused writer read
    assert partition_table(spelled, "sensors").replace("a", rows(2, 3), 9)
    opened = iter([stale])
    real = type(t)._table
    reads: list[object] = []

    def first_stale(self: object, *args: object) -> object:
        reads.append(args)
        return next(opened, None) or real(self, *args)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:  # (undo() would drop the bucket's settings)
        patched.setattr(type(t), "_table", first_stale)
        assert not t.replace("a", rows(7), 6)
    assert len(reads) >= 2, "the stale commit was not refused: the writer never read again"
    assert content(partition_table(spelled, "sensors")) == [("a", 2), ("a", 3)]


def test_a_partitions_version_fences_stale_writers_for_its_retention_then_goes(
    spelled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions do not pile up for ever (a partition a minute is 500,000 a year): one
    whose last commit is older than the retention is forgotten (its partition's rows
    stay); a younger one still refuses a stale writer. The clock of the commits is
    moved, not waited on."""
    monkeypatch.setattr(riverbed.tables, "VERSION_RETENTION_HOURS", 1)
    t = partition_table(spelled, "sensors")
    real = riverbed.tables._now_ms
    with monkeypatch.context() as patched:  # committed two hours ago
        patched.setattr(riverbed.tables, "_now_ms", lambda: real() - 2 * 3_600_000)
        assert t.replace("a", rows(1), 10)
    assert t.replace("b", rows(2), 11)  # now: and a's version, long past, goes
    assert (t.version("a"), t.version("b")) == (None, 11)
    assert not t.replace("b", rows(9), 3)  # b's is young: the stale writer loses
    assert content(t) == [("a", 1), ("b", 2)]  # a forgotten version keeps its rows
    assert t.replace("a", rows(5), 1)  # and the next writer of a starts afresh
    assert t.version("a") == 1 and content(t) == [("a", 5), ("b", 2)]
    table = t._table()  # type: ignore[attr-defined]
    if isinstance(t, DeltaPartitions):  # the table tells every Delta reader and writer
        assert table.metadata().configuration[DELTA_TXN_RETENTION] == "interval 1 hours"
    else:  # each version has its time beside it; the expired ones were removed
        keys = {k for k in table.properties if k.startswith("riverbed.")}
        assert keys == {
            f"{prefix}.sensors.{p}" for prefix in (ICEBERG_VERSION, ICEBERG_AT) for p in "ab"
        }


def test_a_delta_table_made_before_versions_expired_gets_its_retention(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    made = rows(1).append_column(PARTITION, pa.array(["z"]))
    write_deltalake(str(tmp_path / "lake"), made, partition_by=[PARTITION])  # as before
    t = partition_table(f"delta:{tmp_path / 'lake'}", "sensors")
    assert t.replace("a", rows(2), 1)
    config = t._table().metadata().configuration  # type: ignore[attr-defined]
    assert config[DELTA_TXN_RETENTION] == "interval 168 hours"
    assert t.version("a") == 1


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.tuples(st.integers(0, 10**7), st.none() | st.integers(0, 10**7)),
    ),
    st.integers(0, 10**7),
    st.integers(0, 10**7),
)
def test_the_versions_expired_are_those_whose_commit_is_older_than_the_retention(
    held: dict[str, tuple[int, int | None]], now: int, retention: int
) -> None:
    properties = {"write.format.default": "parquet", f"{ICEBERG_AT}.other.a": "0"}
    for p, (version, at) in held.items():
        properties[f"{ICEBERG_VERSION}.job.{p}"] = str(version)
        if at is not None:  # (none: a version written before there were times)
            properties[f"{ICEBERG_AT}.job.{p}"] = str(at)
    doomed = expired_versions(properties, "job", now, retention)
    old = [p for p, (_, at) in held.items() if at is not None and now - at > retention]
    assert doomed == sorted(
        f"{prefix}.job.{p}" for p in old for prefix in (ICEBERG_VERSION, ICEBERG_AT)
    )


def test_delta_intervals_are_spelled_as_delta_reads_them() -> None:
    assert delta_interval(168) == "interval 168 hours"
    assert delta_interval(0.5) == "interval 1800 seconds"


def test_each_reader_sees_every_partition_once(spelled: str, spark: object) -> None:
    t = partition_table(spelled, "sensors")
    t.replace("20260101T000000Z", rows(1, 2), 3)
    t.replace("20260101T010000Z", rows(3), 4)
    t.replace("20260101T000000Z", rows(5, 6), 8)
    want = [("20260101T000000Z", 5), ("20260101T000000Z", 6), ("20260101T010000Z", 3)]
    assert content(t) == want
    if isinstance(t, DeltaPartitions):
        polars = pl.read_delta(t.uri, storage_options=t.options)
    else:
        assert isinstance(t, IcebergPartitions)
        polars = pl.scan_iceberg(t._table()).collect()
    assert sorted(zip(polars[PARTITION].to_list(), polars["sensor"].to_list(), strict=True)) == want
    frame = read_with_spark(spark, t).toPandas()
    assert sorted(zip(frame[PARTITION].astype(str), frame["sensor"], strict=True)) == want


def test_table_names_are_checked_and_secrets_never_shown(tmp_path: Path) -> None:
    assert parse_table("delta:s3://b/lake").where == "s3://b/lake"
    name = parse_table("iceberg:sqlite:///c.db#ns.t@s3://b/wh")
    assert (name.kind, name.where, name.table, name.warehouse) == (
        "iceberg",
        "sqlite:///c.db",
        "ns.t",
        "s3://b/wh",
    )
    for bad in ("parquet:/x", "delta:", "iceberg:sqlite:///c.db", "iceberg:#ns.t"):
        with pytest.raises(TableNameError, match="write delta:PATH"):
            parse_table(bad)
    with pytest.raises(TableNameError) as refused:
        parse_table("iceberg:postgresql://rb:s3cret@db/cat")
    assert "s3cret" not in str(refused.value)
    with pytest.raises(TableError, match=r"namespace\.table"):
        partition_table(f"iceberg:sqlite:///{tmp_path / 'c.db'}#flat", "j")
    assert "s3cret" not in repr(parse_table("iceberg:postgresql://rb:s3cret@db/cat#ns.t"))
    t = partition_table(f"delta:{tmp_path / 'lake'}", "j")
    with pytest.raises(TableError, match="rename it"):
        t.replace("a", pa.table({PARTITION: ["x"]}), 1)
    with pytest.raises(TableError, match="quote"):
        t.replace("it's", rows(1), 1)


@pytest.fixture(params=["iceberg", pytest.param("iceberg-s3", marks=pytest.mark.s3)])
def iceberg_spelled(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "iceberg-s3":
        url = request.getfixturevalue("s3_url")
        return f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.chunks@{url}/warehouse"
    return f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.chunks"


def _listed(url: str, suffix: str) -> set[str]:
    from riverbed.storage import open_store

    return {f"{url}/{i.key}" for i in open_store(url).list() if i.key.endswith(suffix)}


def test_an_iceberg_partition_table_bounds_its_snapshots_files_and_metadata(
    iceberg_spelled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every publication is a commit and a snapshot (10,000 a week at a chunk a minute),
    and each commit's cost grows with them: past twice ``PARTITION_HISTORY`` the table
    expires all but the newest ``PARTITION_HISTORY`` — the partitions' versions, table
    properties, stay — and deletes the data files no snapshot names once older than
    the retention; riverbed's tables delete metadata files beyond Iceberg's
    ``write.metadata.previous-versions-max``."""
    import riverbed.tables

    monkeypatch.setattr(riverbed.tables, "PARTITION_HISTORY", 3)
    monkeypatch.setattr(riverbed.tables, "FILE_RETENTION_HOURS", 0)
    t = partition_table(iceberg_spelled, "sensors")
    assert isinstance(t, IcebergPartitions)
    assert t.replace("a", rows(1), 1)
    table = t._table()
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    with table.transaction() as tx:  # a user's setting: keep two metadata files besides
        tx.set_properties({"write.metadata.previous-versions-max": "2"})
    data = f"{table.location().rstrip('/')}/data"
    first = _listed(data, ".parquet")
    counts = []
    for version in range(2, 14):
        assert t.replace("abc"[version % 3], rows(version), version)
        table = t._table()
        counts.append(len(table.snapshots()))
        assert len(_listed(f"{table.location().rstrip('/')}/metadata", ".metadata.json")) <= 3
    assert max(counts) <= 2 * 3 and min(counts[4:]) >= 3, counts  # expired, then bounded
    assert (t.version("a"), t.version("b"), t.version("c")) == (12, 13, 11)
    assert content(t) == [("a", 12), ("b", 13), ("c", 11)]
    # the first file was replaced long ago: no snapshot names it, it is gone; every file
    # a snapshot names is there
    named = {task.file.file_path for s in table.snapshots()
             for task in table.scan(snapshot_id=s.snapshot_id).plan_files()}  # fmt: skip
    assert first and not first & _listed(data, ".parquet")
    assert named <= _listed(data, ".parquet")
    # manifests and manifest lists too: each kept snapshot's, and none besides
    metadata = f"{table.location().rstrip('/')}/metadata"
    lists = {s.manifest_list for s in table.snapshots()}
    manifests = {m.manifest_path for s in table.snapshots() for m in s.manifests(table.io)}
    assert _listed(metadata, ".avro") == lists | manifests

    with table.transaction() as tx:  # a table that keeps a day of history keeps it
        tx.set_properties({"history.expire.max-snapshot-age-ms": "86400000"})
    before = len(t._table().snapshots())
    for version in range(14, 20):
        assert t.replace("a", rows(version), version)
    assert len(t._table().snapshots()) > before >= 3

    with t._table().transaction() as tx:  # a bad setting: refused before any write
        tx.set_properties({"history.expire.max-snapshot-age-ms": "a day"})
    with pytest.raises(TableError, match="not a number of milliseconds"):
        t.replace("a", rows(99), 20)
    assert t.version("a") == 19 and content(t)[0] == ("a", 19)


@pytest.fixture(params=["delta", pytest.param("delta-s3", marks=pytest.mark.s3)])
def delta_spelled(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "delta-s3":
        return f"delta:{request.getfixturevalue('s3_url')}/lake"
    return f"delta:{tmp_path / 'lake'}"


def test_a_delta_partition_table_vacuums_the_files_it_replaced_every_hundredth_version(
    delta_spelled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replaced partition's files stay in the table's directory after the log stops
    naming them (a chunk a minute: 10,000 a week): every ``PARTITION_HISTORY``-th version
    the table vacuums — the files no version names once older than the retention, and
    files no commit ever named (a writer killed before its commit) — and every file the
    table's current version names stays."""
    import riverbed.tables
    from riverbed.storage import open_store

    monkeypatch.setattr(riverbed.tables, "PARTITION_HISTORY", 4)
    t = partition_table(delta_spelled, "sensors")
    assert isinstance(t, DeltaPartitions)
    for version in (1, 2, 3):  # versions 0, 1, 2
        assert t.replace("ab"[version % 2], rows(version), version)
    store = open_store(t.uri)
    first = {i.key for i in store.list() if i.key.endswith(".parquet")}
    store.put("chunk=a/never-committed.parquet", b"PAR1 a writer killed before its commit")
    monkeypatch.setattr(riverbed.tables, "FILE_RETENTION_HOURS", 1)  # all younger: kept
    vacuums: list[int] = []
    vacuum = DeltaPartitions._vacuum

    def counted(self: DeltaPartitions) -> None:
        vacuums.append(self._table().version())
        vacuum(self)

    monkeypatch.setattr(DeltaPartitions, "_vacuum", counted)
    assert t.replace("a", rows(4), 4)  # version 3, no vacuum yet
    assert t.replace("b", rows(5), 5)  # version 4: a vacuum (that deletes nothing)
    assert vacuums == [4]
    kept = {i.key for i in store.list() if i.key.endswith(".parquet")}
    assert first | {"chunk=a/never-committed.parquet"} <= kept  # none a week old

    monkeypatch.setattr(riverbed.tables, "FILE_RETENTION_HOURS", 0)
    counts = []
    for version in range(6, 16):
        assert t.replace("ab"[version % 2], rows(version), version)
        counts.append(sum(1 for i in store.list() if i.key.endswith(".parquet")))
    table = t._table()
    named = {u.removeprefix(t.uri.rstrip("/") + "/") for u in table.file_uris()}
    now = {i.key for i in store.list() if i.key.endswith(".parquet")}
    assert named <= now and len(named) == 2
    assert not first & now and "chunk=a/never-committed.parquet" not in now
    # two live files, and a vacuum interval's replaced ones at most
    assert max(counts[3:]) <= 2 + 3, counts
    assert vacuums[1:] == [8, 12, 16, 20], vacuums  # a vacuum's two commits count as versions
    assert (t.version("a"), t.version("b")) == (14, 15)
    assert content(t) == [("a", 14), ("b", 15)]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_upkeep_that_fails_after_a_commit_leaves_the_commit_standing(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A vacuum or a snapshot expiry runs after a replacement committed: its failure (a
    bucket's hiccup, here raised in its place) is logged with the table's name and left
    to its next turn — the replacement stays done, and is not tried again."""
    import logging

    import riverbed.tables

    monkeypatch.setattr(riverbed.tables, "PARTITION_HISTORY", 1)
    work = "vacuum_delta" if kind == "delta" else "expire_iceberg_history"
    calls: list[int] = []

    def fails(*args: object) -> None:
        calls.append(1)
        raise OSError("the bucket answered 503 Slow Down")

    monkeypatch.setattr(riverbed.tables, work, fails)
    spelled = (
        f"delta:{tmp_path / 'lake'}"
        if kind == "delta"
        else f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.chunks"
    )
    t = partition_table(spelled, "sensors")
    with caplog.at_level(logging.WARNING, logger="riverbed.tables"):
        for version in range(1, 5):
            assert t.replace("ab"[version % 2], rows(version), version)
    assert calls  # the upkeep ran, and failed
    assert content(t) == [("a", 4), ("b", 3)]
    assert t.version("a") == 4 and t.version("b") == 3
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said and all("left to its next turn" in m and "503 Slow Down" in m for m in said)
    assert all(("lake" in m) if kind == "delta" else ("rb.chunks" in m) for m in said)
