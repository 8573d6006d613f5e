"""Results as a Delta or an Iceberg table: one upserting commit per batch, carrying the
batch id — readers see one row per window and key, equal to the result table's current
rows; a re-run batch commits nothing; sessions merged away are deleted. Read back by
delta-rs / pyiceberg and by Polars; through `stream run --table` with SIGKILLs."""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.stream import Aggregation, Count, Delta, Distinct, Iceberg, Session, Sum, Tumbling
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.errors import StreamValueError
from riverbed.stream.lakehouse import (
    DeltaSink,
    IcebergSink,
    TableSinkError,
    app_id,
    read_with_spark,
)
from riverbed.stream.layout import Checkpoint
from riverbed.stream.results import current, output_arrow_schema
from tests.stream.conftest import make_events, write_events
from tests.stream.crashes import backlogs, kill_mid_batch
from tests.stream.test_engine import session_events, source_for

T0 = pd.Timestamp("2026-01-01", tz="UTC")
SCHEMA = pa.schema(
    [
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("window_end", pa.timestamp("us", tz="UTC")),
        ("key", pa.string()),
        ("n", pa.int64()),
        ("deleted", pa.bool_()),
        ("batch_id", pa.int64()),
    ]
)


def rows(batch: int, keyed: dict[str, int | None], deleted: tuple[str, ...] = ()) -> pd.DataFrame:
    keys = [*keyed, *deleted]
    return pd.DataFrame(
        {
            "window_start": [T0] * len(keys),
            "window_end": [T0] * len(keys),
            "key": keys,
            "n": [*keyed.values(), *([None] * len(deleted))],
            "deleted": [False] * len(keyed) + [True] * len(deleted),
            "batch_id": [batch] * len(keys),
        }
    )


def table_rows(path: Path) -> dict[str, int]:
    frame = DeltaTable(str(path)).to_pyarrow_table().to_pandas()
    return dict(zip(frame["key"], frame["n"], strict=True))


def read_table(kind: str, where: Path) -> pd.DataFrame:
    """A table's rows, as its own library reads them."""
    if kind == "delta":
        return DeltaTable(str(where / "delta")).to_pyarrow_table().to_pandas()
    return IcebergSink(f"sqlite:///{where / 'catalog.db'}", "rb.results").read()


def spark_read(spark: Any, kind: str, where: Path) -> pd.DataFrame:
    """The same table, read by Spark (its own Parquet reader over the files the table's
    log names: no Delta or Iceberg connector is published for this Spark)."""
    sink: DeltaSink | IcebergSink = (
        DeltaSink(where / "delta")
        if kind == "delta"
        else IcebergSink(f"sqlite:///{where / 'catalog.db'}", "rb.results")
    )
    return read_with_spark(spark, sink).toPandas()


def polars_read(kind: str, where: Path) -> pd.DataFrame:
    """The same table, read by Polars."""
    if kind == "delta":
        return pl.read_delta(str(where / "delta")).to_pandas()
    sink = IcebergSink(f"sqlite:///{where / 'catalog.db'}", "rb.results")
    return pl.scan_iceberg(sink.catalog.load_table("rb.results")).collect().to_pandas()


def test_each_batch_is_one_commit_once(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "t")
    assert sink.committed("agg") is None
    assert sink.write("agg", 0, rows(0, {"a": 1, "b": 2}), SCHEMA)
    assert not sink.write("agg", 0, rows(0, {"a": 99}), SCHEMA)  # a re-run: nothing
    assert sink.write("agg", 1, rows(1, {"a": 5, "c": 7}, deleted=("b",)), SCHEMA)
    assert not sink.write("agg", 0, rows(0, {"z": 1}), SCHEMA)  # older than the table's
    assert table_rows(tmp_path / "t") == {"a": 5, "c": 7}
    table = DeltaTable(str(tmp_path / "t"))
    assert table.version() == 1 and table.transaction_version(app_id("agg")) == 1
    assert "deleted" not in table.schema().to_arrow().names  # readers need no filter
    # another aggregation's batches are its own
    assert sink.write("other", 0, rows(0, {"o": 1}), SCHEMA)
    assert sink.committed("other") == 0 and sink.committed("agg") == 1
    sink.compact(retention_hours=0)
    assert table_rows(tmp_path / "t") == {"a": 5, "c": 7, "o": 1}


REST = pytest.param("rest", marks=pytest.mark.rest_catalog)  # Iceberg's own REST server


@pytest.mark.parametrize("catalog", ["sqlite", REST])
def test_an_iceberg_batch_is_one_commit_once(
    tmp_path: Path, catalog: str, request: pytest.FixtureRequest
) -> None:
    if catalog == "rest":  # Iceberg's own REST catalog server: it places the files
        server = request.getfixturevalue("iceberg_rest")
        namespace = f"rb_{uuid.uuid4().hex[:8]}"  # the server is shared by the run
        sink = IcebergSink(server.uri, f"{namespace}.t")
    else:
        sink = IcebergSink(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.t")
    assert sink.committed("agg") is None
    assert sink.write("agg", 0, rows(0, {"a": 1, "b": 2}), SCHEMA)
    assert not sink.write("agg", 0, rows(0, {"a": 99}), SCHEMA)  # a re-run: nothing
    assert sink.write("agg", 1, rows(1, {"a": 5, "c": 7}, deleted=("b",)), SCHEMA)
    assert not sink.write("agg", 0, rows(0, {"z": 1}), SCHEMA)  # older than the table's
    assert sink.write("other", 0, rows(0, {"o": 1}), SCHEMA)  # another's batches: its own
    assert sink.write("agg", 2, rows(2, {}, deleted=("c",)), SCHEMA)  # only a deletion
    got = sink.read()
    assert dict(zip(got["key"], got["n"], strict=True)) == {"a": 5, "o": 1}
    assert "deleted" not in got.columns
    assert sink.committed("agg") == 2 and sink.committed("other") == 0
    if catalog == "rest":  # the catalog's own warehouse, and another client agrees
        location = sink.catalog.load_table(sink.identifier).metadata_location
        assert location.startswith(f"file:{server.warehouse}/{namespace}/t/metadata/")
        again = IcebergSink(server.uri, sink.identifier).read()
        assert dict(zip(again["key"], again["n"], strict=True)) == {"a": 5, "o": 1}
    else:
        assert (tmp_path / "warehouse").is_dir()  # beside the SQLite catalog


def test_bad_table_arguments_are_named(tmp_path: Path) -> None:
    from riverbed.stream.doors import table_sink

    assert table_sink("delta:/x/y") == Delta("/x/y")
    assert table_sink("iceberg:sqlite:///c.db#ns.t") == Iceberg("sqlite:///c.db", "ns.t")
    assert table_sink("iceberg:sqlite:///c.db#ns.t@s3://b/wh") == Iceberg(
        "sqlite:///c.db", "ns.t", "s3://b/wh"
    )
    for bad in ("/x/y", "iceberg:x", "delta:", "iceberg:sqlite:///c.db", "iceberg:c#ns.t@"):
        with pytest.raises(StreamValueError, match=r"write delta:PATH .* or iceberg:CATALOG"):
            table_sink(bad)
    with pytest.raises(TableSinkError, match=r"name it namespace\.table"):
        IcebergSink(f"sqlite:///{tmp_path / 'c.db'}", "plain")
    with pytest.raises(TableSinkError, match="give warehouse=") as refused:
        IcebergSink("postgresql://rb:s3cret@db/cat", "ns.t")
    assert "s3cret" not in str(refused.value)
    assert table_sink("iceberg:http://127.0.0.1:8181#ns.t") == Iceberg(
        "http://127.0.0.1:8181", "ns.t"
    )
    with pytest.raises(TableSinkError, match="PYICEBERG_CATALOG__RIVERBED__TOKEN") as refused:
        IcebergSink("https://rb:s3cret@catalog.example/api", "ns.t")  # refused before a call
    assert "s3cret" not in str(refused.value)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
@pytest.mark.parametrize("path", ["spark", "colocated"])
@pytest.mark.parametrize("window", ["tumbling", "session"])
def test_a_table_holds_the_current_rows_one_per_window_and_key(
    spark: Any, log_url: str, tmp_path: Path, path: str, window: str, kind: str
) -> None:
    events = (
        make_events(1500, hours=3, seed=5)
        if window == "tumbling"
        else session_events(1500, seed=62).sample(frac=1, random_state=4)
    )
    write_events(log_url, events)
    spec = Aggregation(
        name="to_delta",
        key="flag",
        time="ts",
        window=Tumbling("1h") if window == "tumbling" else Session("5m"),
        watermark="10h",
        metrics={"events": Count(), "users": Distinct("user_id"), "total": Sum("amount")},
        state_partitions=3,
    )
    query = start(
        spark,
        spec,
        source_for(spark, log_url, path, max_records=300),
        checkpoint=tmp_path / "ckpt",
        output=tmp_path / "out",
        sinks=[
            Delta(f"file://{tmp_path / 'delta'}")
            if kind == "delta"
            else Iceberg(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.results")
        ],
        log_url=log_url,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    want = current(read_results(tmp_path / "out"))
    columns = [f.name for f in output_arrow_schema(spec) if f.name != "deleted"]
    want = want[columns].sort_values(["window_start", "key"]).reset_index(drop=True)
    for read in (read_table, polars_read, partial(spark_read, spark)):
        got = read(kind, tmp_path)[columns].sort_values(["window_start", "key"])
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)
    batches = len(list((tmp_path / "ckpt" / "riverbed" / "batches").glob("*.json")))
    # the newest batch that wrote rows (a no-data batch at the end may write none)
    newest = int(want["batch_id"].max())
    assert batches - 2 <= newest <= batches - 1
    if kind == "delta":
        table = DeltaTable(str(tmp_path / "delta"))
        assert table.transaction_version(app_id("to_delta")) == newest
        assert table.version() <= newest  # one commit a batch with rows, at most
    else:
        sink = IcebergSink(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.results")
        assert sink.committed("to_delta") == newest


SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="lake", key="flag", time="ts", window=Tumbling("1h"), watermark="10h",
    metrics={"users": Distinct("user_id"), "events": Count()}, state_partitions=3,
)
"""


def assert_holds(table: pd.DataFrame, events: pd.DataFrame) -> None:
    """A table read back holds the hourly oracle of ``events``: one row per window and
    key, with its users and events (what SPEC aggregates)."""
    want = (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
        .sort_values(["window_start", "key"])
        .reset_index(drop=True)
    )
    got = table[["window_start", "key", "users", "events"]]
    got = got.sort_values(["window_start", "key"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["delta", "iceberg", pytest.param("iceberg-rest", marks=pytest.mark.rest_catalog)]
)
def test_a_table_through_kills_holds_the_oracle(
    tmp_path: Path, subprocess_env: dict[str, str], kind: str, request: pytest.FixtureRequest
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    events = make_events(6000, hours=6, seed=9)
    kills = 4
    slices = backlogs(events, kills + 1)
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)  # (both kill tests)
    catalog, identifier = f"sqlite:///{tmp_path / 'catalog.db'}", "rb.results"
    if kind == "iceberg-rest":  # a REST catalog: Iceberg's own server (shared by the run)
        catalog = request.getfixturevalue("iceberg_rest").uri
        identifier = f"rb_{uuid.uuid4().hex[:8]}.results"
    table = f"delta:{tmp_path / 'lake'}" if kind == "delta" else f"iceberg:{catalog}#{identifier}"
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
               "--max-records-per-batch", "200", "--ttl", "3",
               "--table", table]  # fmt: skip
    aimed = kill_mid_batch(
        command,
        env,
        Checkpoint(home / "checkpoints" / "lake").batches,
        kills=kills,
        rng=random.Random(13),
        before_start=lambda k: write_events(f"file://{home / 'log'}", slices[k], partitions=3),
        logs=tmp_path / "logs",
    )
    assert len(aimed) == kills
    write_events(f"file://{home / 'log'}", slices[kills], partitions=3)
    finished = subprocess.run(
        [*command, "--once"], env=env, capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert_holds(
        pl.read_delta(str(tmp_path / "lake")).to_pandas()
        if kind == "delta"
        else IcebergSink(catalog, identifier).read(),
        events,
    )


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_every_hundredth_batch_compacts_the_table_after_its_commit(
    tmp_path: Path, kind: str
) -> None:
    from dataclasses import dataclass

    @dataclass
    class Running:  # what a sink is told of the aggregation (doors.Running)
        spec: Aggregation
        log_url: str | None = None

    spec = Aggregation(name="many", key="k", window=Tumbling("1h"), metrics={"n": Count()})
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    sink = Delta(tmp_path / "t") if kind == "delta" else Iceberg(catalog, "c.t")
    schema = output_arrow_schema(spec)
    iceberg = IcebergSink(catalog, "c.t")

    def files() -> int:
        if kind == "delta":
            return len(DeltaTable(str(tmp_path / "t")).file_uris())
        return len(iceberg.data_files())

    for b in range(100):
        frame = pd.DataFrame(
            {
                "window_start": [T0 + pd.Timedelta(hours=b)],
                "window_end": [T0 + pd.Timedelta(hours=b + 1)],
                "key": ["x"],
                "n": [b],
                "batch_id": [b],
            }
        )[schema.names]
        sink.write(Running(spec), b, frame)
        if b == 98:
            assert files() == 99  # a file a batch
    assert files() == 1  # compacted after batch 99's commit
    if kind == "delta":
        table = DeltaTable(str(tmp_path / "t"))
        assert table.transaction_version(app_id("many")) == 99
        got = table.to_pyarrow_table().column("n").to_pylist()
    else:
        assert iceberg.committed("many") == 99
        got = iceberg.read()["n"].tolist()
    assert sorted(got) == list(range(100))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_compaction_that_fails_after_a_batch_commits_does_not_fail_the_batch(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Batch 99's commit is followed by the table's compaction; its failure (a bucket's
    hiccup, raised in its place) is a warning naming the table, not the batch's: the
    stream goes on, the batch is committed, the compaction is left to batch 199."""
    import logging
    import warnings
    from dataclasses import dataclass

    @dataclass
    class Running:  # what a sink is told of the aggregation (doors.Running)
        spec: Aggregation
        log_url: str | None = None

    def fails(self: Any, *args: Any) -> None:
        raise OSError("the bucket answered 503 Slow Down")

    monkeypatch.setattr(DeltaSink if kind == "delta" else IcebergSink, "compact", fails)
    spec = Aggregation(name="many", key="k", window=Tumbling("1h"), metrics={"n": Count()})
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    sink = Delta(tmp_path / "t") if kind == "delta" else Iceberg(catalog, "c.t")
    schema = output_arrow_schema(spec)
    frame = pd.DataFrame(
        {
            "window_start": [T0],
            "window_end": [T0 + pd.Timedelta(hours=1)],
            "key": ["x"],
            "n": [7],
            "batch_id": [99],
        }
    )[schema.names]
    with caplog.at_level(logging.WARNING, logger="riverbed.tables"), warnings.catch_warnings():
        # nor is a window new to the table a warning (pyiceberg's delete of nothing)
        warnings.filterwarnings("error", message=".*did not match any records")
        sink.write(Running(spec), 99, frame)
    if kind == "delta":
        assert DeltaTable(str(tmp_path / "t")).transaction_version(app_id("many")) == 99
    else:
        assert IcebergSink(catalog, "c.t").committed("many") == 99
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "compaction" in said[0] and "503 Slow Down" in said[0]
    assert ("Delta table" if kind == "delta" else "Iceberg table c.t") in said[0]


def test_a_delta_compaction_deletes_the_files_no_commit_named_once_they_are_a_week_old(
    tmp_path: Path,
) -> None:
    """A data file whose commit never came (a killed writer's, a fenced zombie's) is
    never read, and the compaction deletes it once older than the retention; a younger
    one may be a commit in flight and stays, as do the files the table's rows are in."""
    import os
    import time

    import pyarrow.parquet as pq

    sink = DeltaSink(tmp_path / "t")
    for b in range(3):
        assert sink.write("agg", b, rows(b, {f"k{b}": b}), SCHEMA)
    stale, fresh = (
        tmp_path / "t" / "part-00000-stale.parquet",
        tmp_path / "t" / "part-00000-fresh.parquet",
    )
    for orphan in (stale, fresh):
        pq.write_table(pa.Table.from_pandas(rows(9, {"zombie": 9}), schema=SCHEMA), orphan)
    week_ago = time.time() - 169 * 3600
    os.utime(stale, (week_ago, week_ago))
    assert table_rows(tmp_path / "t") == {"k0": 0, "k1": 1, "k2": 2}  # orphans unread
    sink.compact()
    assert not stale.exists() and fresh.exists()
    assert table_rows(tmp_path / "t") == {"k0": 0, "k1": 1, "k2": 2}
    assert all(Path(f.removeprefix("file://")).exists() for f in sink.data_files())


@pytest.mark.s3
def test_a_delta_table_in_a_bucket(s3_url: str) -> None:
    """The same commits in a bucket (the S3 server keeps objects on disk): delta-rs
    reaches it with riverbed's bucket settings, commits create-only (conditional puts),
    and Polars reads it back."""
    from riverbed.tables import delta_options as _storage_options

    url = f"{s3_url}/lake"
    sink = DeltaSink(url)
    assert sink.write("agg", 0, rows(0, {"a": 1, "b": 2}), SCHEMA)
    assert not sink.write("agg", 0, rows(0, {"a": 9}), SCHEMA)
    assert sink.write("agg", 1, rows(1, {"a": 5}, deleted=("b",)), SCHEMA)
    options = _storage_options(url)
    got = pl.read_delta(url, storage_options=options).to_pandas()
    assert dict(zip(got["key"], got["n"], strict=True)) == {"a": 5}
    assert DeltaTable(url, storage_options=options).transaction_version(app_id("agg")) == 1


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"configuration": {"delta.enableDeletionVectors": "true"}}, "deletion vectors"),
        ({"partition_by": ["key"]}, "partition columns"),
    ],
)
def test_a_delta_table_whose_rows_are_not_whole_files_is_not_read_as_files(
    tmp_path: Path, options: dict[str, Any], problem: str
) -> None:
    """Spark's Parquet reader over the table's files is right only for whole files (what
    riverbed writes); a table written otherwise is refused, naming why and what to use."""
    from deltalake import write_deltalake

    data = pa.table({"key": ["a", "b"], "n": [1, 2]})
    write_deltalake(str(tmp_path / "t"), data, **options)
    with pytest.raises(TableSinkError, match=f"uses {problem}.*read it with a Delta reader"):
        DeltaSink(tmp_path / "t").data_files()
    write_deltalake(str(tmp_path / "plain"), data)
    assert len(DeltaSink(tmp_path / "plain").data_files()) == 1


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_in_a_bucket_killed_right_before_and_right_after_a_commit_holds_the_oracle(
    s3_url: str, tmp_path: Path, subprocess_env: dict[str, str], kind: str
) -> None:
    """``stream run --table`` into the S3 server's bucket, SIGKILLed right before batch
    1's table commit (the batch runs again and commits) and right after batch 2's (the
    commit landed, the batch record did not: the batch runs again and commits nothing),
    then run to the end: the table holds the oracle's rows, one per window and key, and
    each batch's commit once."""
    import os

    from riverbed.tables import delta_options as _storage_options

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}  # the bucket's
    events = make_events(3000, hours=5, seed=31)
    write_events(f"file://{home / 'log'}", events, partitions=3)
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)  # (both kill tests)
    table = (
        f"delta:{s3_url}/lake"
        if kind == "delta"
        else f"iceberg:sqlite:///{tmp_path / 'catalog.db'}#rb.results@{s3_url}/warehouse"
    )
    command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
               "--max-records-per-batch", "500", "--once", "--table", table]  # fmt: skip
    batches = open_batches(home / "checkpoints" / "lake")
    sink: DeltaSink | IcebergSink = (
        DeltaSink(f"{s3_url}/lake")
        if kind == "delta"
        else IcebergSink(
            f"sqlite:///{tmp_path / 'catalog.db'}", "rb.results", f"{s3_url}/warehouse"
        )
    )
    for fault, committed in (("table_commit:before:1", 0), ("table_commit:after:2", 2)):
        killed = subprocess.run(
            command, env={**env, "RIVERBED_FAULT": fault}, capture_output=True, text=True,
            check=False, timeout=600,
        )  # fmt: skip
        assert killed.returncode == -9, (fault, killed.returncode, killed.stderr[-2000:])
        assert sink.committed("lake") == committed, fault
        newest = batches.get(max(batches.ids()))
        assert newest is not None and not newest.done, fault  # died inside the batch
    finished = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert finished.returncode == 0, finished.stderr[-2000:]
    # the newest batch with events (after it, a no-data batch writes no rows)
    last = max(b for b in batches.ids() if batches.get(b).input)  # type: ignore[union-attr]
    assert last >= 5 and sink.committed("lake") == last
    if kind == "delta":  # one table version a batch: batch 2's second run committed nothing
        assert (
            DeltaTable(
                f"{s3_url}/lake", storage_options=_storage_options(f"{s3_url}/lake")
            ).version()
            == last
        )
    assert_holds(sink.read(), events)


pairs = st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c", "d", "e"]))


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(
        st.tuples(
            st.dictionaries(pairs, st.integers(0, 99), max_size=8),  # rows written
            st.sets(pairs, max_size=3),  # sessions merged away (deleted)
        ),
        min_size=1,
        max_size=5,
    )
)
def test_both_tables_hold_what_the_batches_upserted_and_deleted(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[tuple[dict[tuple[int, str], int], set[tuple[int, str]]]],
) -> None:
    """Any batches of rows and deletions over a few windows and keys: each table holds
    the model's rows — a (window, key) once, with its newest value, none deleted."""
    where = tmp_path_factory.mktemp("model")
    sinks: list[DeltaSink | IcebergSink] = [
        DeltaSink(where / "delta"),
        IcebergSink(f"sqlite:///{where / 'catalog.db'}", "m.t"),
    ]
    model: dict[tuple[int, str], int] = {}
    for b, (written, gone) in enumerate(batches):
        gone = gone - written.keys()  # a batch writes a (window, key) or deletes it
        keys = [*written, *gone]
        if not keys:
            continue  # (the sinks are not called for a batch without rows: doors.py)
        frame = pd.DataFrame(
            {
                "window_start": [T0 + pd.Timedelta(hours=h) for h, _ in keys],
                "window_end": [T0 + pd.Timedelta(hours=h + 1) for h, _ in keys],
                "key": [k for _, k in keys],
                "n": [*written.values(), *([None] * len(gone))],
                "deleted": [False] * len(written) + [True] * len(gone),
                "batch_id": [b] * len(keys),
            }
        )
        for sink in sinks:
            sink.write("m", b, frame, SCHEMA)
        model.update(written)
        for pair in gone:
            model.pop(pair, None)
    for sink in sinks:
        got = sink.read() if sink.committed("m") is not None else pd.DataFrame()
        held = {
            (int((pd.Timestamp(w) - T0) / pd.Timedelta(hours=1)), k): int(n)
            for w, k, n in zip(
                got.get("window_start", []), got.get("key", []), got.get("n", []), strict=True
            )
        }
        assert held == model, type(sink).__name__


def test_an_iceberg_compaction_bounds_the_snapshot_history_and_keeps_files_a_week(
    tmp_path: Path,
) -> None:
    """Each commit's cost grows with the snapshots the table keeps, so a compaction
    expires those before its rewrite — unless the table's own
    ``history.expire.max-snapshot-age-ms`` keeps more; the expired snapshots' data files
    stay for the retention (a reader on one still finds them). A bad value is named."""
    sink = IcebergSink(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.t")
    for b in range(3):
        assert sink.write("agg", b, rows(b, {"a": b, f"k{b}": b}), SCHEMA)
    on_disk = lambda: set((tmp_path / "warehouse").rglob("*.parquet"))  # noqa: E731
    files_before = on_disk()
    sink.compact()  # the default: a week's retention of files
    table = sink.catalog.load_table("rb.t")
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot().snapshot_id]
    assert files_before < on_disk()  # nothing deleted: younger than a week
    assert sink.committed("agg") == 2
    # a table that asks for a day of history keeps its snapshots
    with table.transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": str(86_400_000)})
    for b in range(3, 5):
        assert sink.write("agg", b, rows(b, {"a": b}), SCHEMA)
    ids = lambda: {s.snapshot_id for s in sink.catalog.load_table("rb.t").snapshots()}  # noqa: E731
    kept = ids()
    sink.compact()
    assert kept < ids()  # every one kept, and the rewrite's
    table = sink.catalog.load_table("rb.t")
    with table.transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": "a day"})
    kept = ids()
    with pytest.raises(TableSinkError, match=r"max-snapshot-age-ms is 'a day'.*86400000"):
        sink.compact()
    assert ids() == kept  # refused before it changed anything
    got = sink.read()
    assert dict(zip(got["key"], got["n"], strict=True)) == {"a": 4, "k0": 0, "k1": 1, "k2": 2}


def test_an_iceberg_batch_transaction_computes_its_staged_metadata_once_per_state(
    tmp_path: Path,
) -> None:
    from riverbed.iceberg import iceberg_transaction

    sink = IcebergSink(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.t")
    assert sink.write("agg", 0, rows(0, {"a": 0}), SCHEMA)
    tx = iceberg_transaction(sink.catalog.load_table("rb.t"))
    first = tx.table_metadata
    assert tx.table_metadata is first  # not replayed and copied again
    tx.set_properties({"x": "1"})
    assert tx.table_metadata is not first and tx.table_metadata.properties["x"] == "1"
    assert "x" not in first.properties


def test_an_iceberg_compaction_keeps_every_aggregations_batch_id_and_expires_the_rest(
    tmp_path: Path,
) -> None:
    """Compacted with no retention, the table keeps only its newest snapshots; the batch
    ids of both aggregations writing it are still found (the rewrite's snapshot carries
    them), so an older batch run again still commits nothing."""
    sink = IcebergSink(f"sqlite:///{tmp_path / 'catalog.db'}", "rb.t")
    for b in range(4):
        assert sink.write("agg", b, rows(b, {f"k{b}": b, "a": b}), SCHEMA)
    assert sink.write("other", 7, rows(7, {"o": 7}), SCHEMA)
    before = len(sink.catalog.load_table("rb.t").snapshots())
    assert len(sink.data_files()) > 1
    sink.compact(retention_hours=0)
    table = sink.catalog.load_table("rb.t")
    assert len(table.snapshots()) < before and len(sink.data_files()) == 1
    on_disk = {f"file://{p}" for p in (tmp_path / "warehouse").rglob("*.parquet")}
    live = {f if f.startswith("file://") else f"file://{f}" for f in sink.data_files()}
    assert on_disk == live  # the expired snapshots' files are gone too
    assert sink.committed("agg") == 3 and sink.committed("other") == 7
    assert not sink.write("agg", 2, rows(2, {"a": 99}), SCHEMA)  # older: nothing
    got = sink.read()
    assert dict(zip(got["key"], got["n"], strict=True)) == {
        "k0": 0, "k1": 1, "k2": 2, "k3": 3, "a": 3, "o": 7,
    }  # fmt: skip
