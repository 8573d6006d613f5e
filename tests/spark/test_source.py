"""The riverbed Spark source, batch and streaming, on a real local[2] session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import riverbed.log
from riverbed.log.records import RawRecord
from riverbed.spark.source import register

pytestmark = pytest.mark.spark
SCHEMA = "user_id long, flag string"


@pytest.fixture
def log_url(tmp_path: Path) -> str:
    return _fill(f"file://{tmp_path / 'log'}")


def _fill(url: str) -> str:
    log = riverbed.log.open(url)
    log.create_topic("events", 3)
    log.producer("events").send_batch(
        [{"user_id": i % 40, "flag": f"f{i % 5}"} for i in range(500)], key_field="flag"
    )
    log.storage.append("events", 0, [RawRecord(0, b"k", b"{oops not json")])
    log.producer("events").send({"user_id": "abc", "flag": "f1"}, partition=1)
    log.close()
    return url


def test_batch_read_decodes_fields_and_flags_malformed_records(spark: Any, log_url: str) -> None:
    register(spark)
    df = (
        spark.read.format("riverbed")
        .option("topic", "events")
        .option("log", log_url)
        .option("schema", SCHEMA)
        .load()
    )
    assert df.columns == ["user_id", "flag", "key", "timestamp", "partition", "offset", "_error"]
    rows = df.collect()
    assert len(rows) == 502
    bad = sorted((r["partition"], r["_error"][:40]) for r in rows if r["_error"])
    assert len(bad) == 2
    assert "not JSON" in bad[0][1] and "user_id" in bad[1][1]
    good = [r for r in rows if not r["_error"]]
    assert sorted(r["user_id"] for r in good) == sorted(i % 40 for i in range(500))


def test_a_diskless_topic_reads_the_same(
    spark: Any, s3_url: str, etcd_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic in a bucket, its offsets in etcd: Spark's Python workers (started before
    these settings) reach both as the driver does, and read the same rows."""
    monkeypatch.setenv("RIVERBED_CONTROL", etcd_server.url)
    register(spark)
    df = (
        spark.read.format("riverbed")
        .option("topic", "events")
        .option("log", _fill(s3_url))
        .option("schema", SCHEMA)
        .load()
    )
    rows = df.collect()
    assert len(rows) == 502 and sum(1 for r in rows if r["_error"]) == 2
    assert sorted(r["user_id"] for r in rows if not r["_error"]) == sorted(
        i % 40 for i in range(500)
    )


def test_schema_is_inferred_without_the_option(spark: Any, log_url: str) -> None:
    register(spark)
    df = spark.read.format("riverbed").option("topic", "events").option("log", log_url).load()
    assert dict(df.dtypes)["user_id"] == "bigint" and dict(df.dtypes)["flag"] == "string"


def test_stream_reads_everything_once_in_bounded_batches_and_resumes(
    spark: Any, log_url: str, tmp_path: Path
) -> None:
    register(spark)
    batches: list[list[tuple[int, int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append([(r["partition"], r["offset"]) for r in df.collect()])

    def run() -> None:
        query = (
            spark.readStream.format("riverbed")
            .option("topic", "events")
            .option("log", log_url)
            .option("schema", SCHEMA)
            .option("maxRecordsPerBatch", 120)
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    seen = [c for b in batches for c in b]
    assert len(seen) == 502 == len(set(seen))
    assert all(len(b) <= 120 for b in batches), [len(b) for b in batches]
    assert len(batches) >= 5
    for p in range(3):  # within a partition, offsets arrive in order
        offsets = [o for q, o in seen if q == p]
        assert offsets == sorted(offsets)
    # new data and a new partition, then a restart from the checkpoint
    log = riverbed.log.open(log_url)
    next_in_p0 = log.storage.offsets("events", 0)[1]
    log.add_partitions("events", 4)
    log.producer("events").send({"user_id": 1, "flag": "new"}, partition=3)
    log.producer("events").send({"user_id": 2, "flag": "new"}, partition=0)
    log.close()
    batches.clear()
    run()
    assert sorted(c for b in batches for c in b) == [(0, next_in_p0), (3, 0)]


def test_bad_options_are_named(spark: Any, log_url: str) -> None:
    register(spark)
    with pytest.raises(Exception, match="topic"):
        spark.read.format("riverbed").option("log", log_url).load().collect()
    with pytest.raises(Exception, match="maxRecordsPerBatch"):
        query = (
            spark.readStream.format("riverbed")
            .option("topic", "events")
            .option("log", log_url)
            .option("schema", SCHEMA)
            .option("maxRecordsPerBatch", "lots")
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(60)
        raise RuntimeError(str(query.exception()))


def test_a_typed_topic_reads_like_the_same_records_in_json(spark: Any, tmp_path: Path) -> None:
    """Typed columns go to Spark without parsing; the rows equal the JSON topic's, the
    schema comes from the topic, and a source schema asking other types is cast."""
    url = f"file://{tmp_path / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("typed", 2, schema="user_id long, flag string, ts timestamp")
    log.create_topic("plain", 2)
    values = [
        {"user_id": i % 7, "flag": f"f{i % 3}", "ts": f"2026-11-23T00:{i % 60:02d}:00Z"}
        for i in range(300)
    ]
    values[5] = {"user_id": 5}  # absent fields: null
    for topic in ("typed", "plain"):
        log.producer(topic).send_batch(values, key_field="flag")
    log.close()
    register(spark)

    def rows(topic: str, schema: str | None = None) -> list[tuple[Any, ...]]:
        reader = spark.read.format("riverbed").option("topic", topic).option("log", url)
        if schema:
            reader = reader.option("schema", schema)
        df = reader.load()
        cols = ["user_id", "flag", "ts", "key", "partition", "offset", "_error"]
        return sorted((tuple(r) for r in df.select(*cols).collect()), key=lambda r: r[4:6])

    ddl = "user_id long, flag string, ts timestamp"
    typed = rows("typed")
    assert typed == rows("plain", ddl)
    assert len(typed) == 300 and all(r[-1] is None for r in typed)
    as_double = rows("typed", "user_id double, flag string, ts timestamp, missing int")
    assert [r[0] for r in as_double] == [float(r[0]) if r[0] is not None else None for r in typed]
