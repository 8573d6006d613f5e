"""Kafka topics as a stream source (riverbed.stream.kafkasource): the options, the check before
Spark starts, and an aggregation over a real broker's topic equal to pandas — across a
restart that must neither lose nor double-count a record."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.log.partitioners import KeyHashPartitioner
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.kafkasource import (
    KafkaSource,
    KafkaSourceError,
    check,
    continuity,
    ignored_options,
    is_label,
    lag,
    log_native,
    log_options,
    parse,
    parse_label,
    with_max_records,
)
from riverbed.stream.layout import Checkpoint
from riverbed.stream.loop import DirectQuery
from riverbed.stream.metrics import Count, Distinct, Sum
from riverbed.stream.sparklog import committed_ends, source_offsets
from riverbed.testing import KafkaCluster, KafkaServer, free_port
from riverbed.windows import Tumbling
from tests.stream.conftest import make_events
from tests.stream.crashes import backlogs, kill_mid_batch
from tests.stream.test_kafka_sink import read_topic, topic_ends

SCHEMA = "user_id long, flag string, amount double, ts timestamp"
GOOD = {"bootstrap": "127.0.0.1:9092", "topic": "clicks", "schema": SCHEMA}


def test_a_well_formed_source_becomes_sparks_options() -> None:
    source = parse({"kafka": {**GOOD, "options": {"kafka.security.protocol": "SSL"}}})
    assert source.label == "kafka://127.0.0.1:9092/clicks"
    options = source.spark_options()
    assert options["kafka.bootstrap.servers"] == "127.0.0.1:9092"
    assert options["subscribe"] == "clicks" and options["startingOffsets"] == "earliest"
    assert options["kafka.security.protocol"] == "SSL" and options["failOnDataLoss"] == "true"
    capped = parse(with_max_records({"kafka": GOOD}, 500))
    assert capped.spark_options()["maxOffsetsPerTrigger"] == "500"
    raw = parse({"kafka": {"bootstrap": "b:1", "topic": "t", "format": "raw"}})
    assert raw.schema is None and raw.format == "raw"


AVRO = {
    "type": "record",
    "name": "Click",
    "fields": [
        {"name": "user_id", "type": "long"},
        {"name": "flag", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def test_a_json_source_becomes_log_native_options_and_names_what_it_ignores() -> None:
    given = {"maxOffsetsPerTrigger": "500", "kafka.security.protocol": "SSL", "minPartitions": "8"}
    source = parse({"kafka": {**GOOD, "options": given}})
    assert log_native(source)
    options = log_options(source)
    assert options["log"] == "kafka://127.0.0.1:9092?serde=json"
    assert (options["topic"], options["schema"], options["maxRecordsPerBatch"]) == (
        "clicks",
        SCHEMA,
        "500",
    )
    assert options["kafka.security.protocol"] == "SSL" and options["co_locate"] == "auto"
    assert ignored_options(source) == ["minPartitions"]
    ours = {"co_locate": "false", "steal": "false", "driverBatchRecords": "5000"}
    shuffled = log_options(parse({"kafka": {**GOOD, "options": ours}}))
    assert {k: shuffled[k] for k in ours} == ours
    assert not ignored_options(parse({"kafka": {**GOOD, "options": ours}}))
    pinned = parse({"kafka": {**GOOD, "startingOffsets": '{"clicks": {"0": -2}}'}})
    assert not log_native(pinned)
    assert not log_native(parse({"kafka": {"bootstrap": "b:1", "topic": "t", "format": "raw"}}))


def test_an_avro_source_takes_its_schema_as_json_text_or_a_dict() -> None:
    as_text = parse({"kafka": {**GOOD, "format": "avro", "schema": json.dumps(AVRO, indent=2)}})
    as_dict = parse({"kafka": {**GOOD, "format": "avro", "schema": AVRO}})
    assert as_text == as_dict and as_text.format == "avro"
    assert as_text.schema is not None and json.loads(as_text.schema) == AVRO


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bootstrap": None}, "needs 'bootstrap'"),
        ({"bootstrap": "broker-1"}, "is not host:port"),
        ({"topic": ""}, "needs 'topic'"),
        ({"schema": None}, "needs 'schema'"),
        ({"format": "avro"}, "is not JSON"),
        ({"format": "avro", "schema": {"type": "string"}}, "the Avro schema of the values"),
        ({"format": "avro", "schema": '{"type": "record", "fields": []}'}, "needs 'fields'"),
        ({"format": "avro", "schema": None}, "the Avro schema of the values, a record"),
        ({"format": "protobuf"}, "is not one of json, avro, raw"),
        ({"format": "raw"}, "drop 'schema'"),
        ({"options": {"subscribe": "other"}}, "are riverbed's to set"),
        ({"options": "x"}, "must be a dict"),
        ({"group": "g"}, "unknown Kafka source option(s) group"),
        ({"topic": "a/b"}, "Kafka topic name 'a/b' is not one Kafka allows"),
    ],
)
def test_bad_options_are_one_error_naming_the_fix(change: dict[str, Any], message: str) -> None:
    options = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(KafkaSourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse({"kafka": options})


VALUES = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.integers(),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
KEYS = st.sampled_from(
    ["bootstrap", "topic", "schema", "format", "startingOffsets", "options", "x"]
)


@given(st.one_of(VALUES, st.dictionaries(KEYS, VALUES, max_size=7)))
def test_any_source_parses_or_is_a_kafka_source_error(raw: Any) -> None:
    """No input reaches Spark as anything but a checked source or one clear error."""
    try:
        source = parse({"kafka": raw})
    except KafkaSourceError:
        return
    assert isinstance(source, KafkaSource) and source.topic and source.bootstrap
    assert source.spark_options()["subscribe"] == source.topic
    assert is_label(source.label) and parse_label(source.label) == (source.bootstrap, source.topic)


def test_a_label_that_is_not_kafkas_is_an_error_and_sparks_kafka_offsets_are_read(
    tmp_path: Path,
) -> None:
    for bad in ("kafka://host:9092", "kafka:///topic", "s3://b/t"):
        with pytest.raises(KafkaSourceError, match="not a Kafka source label"):
            parse_label(bad)
    offsets = tmp_path / "7"  # Spark's offset log file of a Kafka source's batch 7
    offsets.write_text('v1\n{"batchWatermarkMs":0}\n{"clicks":{"1":40,"0":12}}\n')
    assert source_offsets(offsets.read_text()) == {"1": 40, "0": 12}


@pytest.mark.kafka
def test_the_check_names_a_missing_topic_and_an_unreachable_broker(
    kafka_server: KafkaServer, kafka_topic: str
) -> None:
    with pytest.raises(KafkaSourceError, match=f"topic '{kafka_topic}' does not exist"):
        check(parse({"kafka": {**GOOD, "bootstrap": kafka_server.bootstrap, "topic": kafka_topic}}))
    kafka_server.create_topic(kafka_topic, partitions=2)
    assert (
        check(parse({"kafka": {**GOOD, "bootstrap": kafka_server.bootstrap, "topic": kafka_topic}}))
        == 2
    )
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaSourceError, match=f"no Kafka broker answered at {nobody}"):
        check(parse({"kafka": {**GOOD, "bootstrap": nobody}}), timeout=2)
    assert lag(f"kafka://{nobody}/clicks", {}, timeout=1) == {}  # unknown, not zero


def _produce(
    bootstrap: str,
    topic: str,
    events: pd.DataFrame,
    malformed: int = 0,
    place: Callable[[int, str], int | None] = lambda i, flag: i % 3,
) -> None:
    """``events`` as JSON values keyed by flag, record ``i`` in partition
    ``place(i, flag)`` (None: where librdkafka's default partitioner puts the key)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i, (u, f, a, t) in enumerate(
        events[["user_id", "flag", "amount", "ts"]].itertuples(index=False)
    ):
        value = {"user_id": int(u), "flag": f, "amount": a, "ts": t.isoformat()}
        where = place(i, f)
        if where is None:
            producer.produce(topic, key=f, value=json.dumps(value))
        else:
            producer.produce(topic, key=f, value=json.dumps(value), partition=where)
    for i in range(malformed):  # not JSON, and JSON without the time
        bad = "{not json" if i % 2 else json.dumps({"user_id": 1, "flag": "f1"})
        producer.produce(topic, value=bad, partition=i % 3)
    assert producer.flush(120) == 0  # a broker of three lost: leaders move meanwhile


def _hourly(name: str) -> Aggregation:
    """Per flag and hour: distinct users, events, the amount's sum."""
    return Aggregation(
        name=name,
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="100h",
        metrics={"users": Distinct("user_id"), "events": Count(), "total": Sum("amount")},
        state_partitions=2,
    )


def _oracle(events: pd.DataFrame) -> pd.DataFrame:
    return (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users=("user_id", "nunique"), events=("user_id", "size"), total=("amount", "sum"))
        .reset_index()
        .rename(columns={"flag": "key"})
        .sort_values(["window_start", "key"], ignore_index=True)
    )


def _run(spark: Any, spec: Aggregation, bootstrap: str, topic: str, root: Path) -> None:
    source = {
        "kafka": {
            "bootstrap": bootstrap,
            "topic": topic,
            "schema": SCHEMA,
            "options": {"maxOffsetsPerTrigger": "1500"},
        }
    }
    # the results to a Kafka topic too, one transaction per batch
    _run_once(spark, spec, source, root, topic=f"kafka://{bootstrap}/{topic}-results")


def _run_once(
    spark: Any, spec: Aggregation, source: dict[str, Any], root: Path, topic: str | None = None
) -> Any:
    """Run the aggregation over what the topic holds now (``availableNow``), into
    ``root``'s ckpt/ and out/; its query, ended without an error."""
    query = start(
        spark,
        spec,
        source,
        checkpoint=root / "ckpt",
        output=root / "out",
        topic=topic,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def _assert_results(output: Path, events: pd.DataFrame) -> pd.DataFrame:
    """Every window and key of the result table equals pandas over ``events`` (which
    it returns)."""
    got = read_results(output).sort_values(["window_start", "key"], ignore_index=True)
    want = _oracle(events)
    assert list(got["key"]) == list(want["key"])
    assert list(got["window_start"]) == list(want["window_start"])
    assert list(got["events"]) == list(want["events"]), "double or missing counts"
    assert list(got["users"]) == list(want["users"])
    assert list(got["total"]) == list(want["total"])
    return want


def _committed(checkpoint: Path) -> dict[int, int]:
    """Where the newest finished batch ended, as `riverbed stream status` reads it."""
    batches = open_batches(checkpoint)
    newest_first = [batches.get(b) for b in reversed(batches.ids())]
    return committed_ends(checkpoint, [r for r in newest_first if r is not None])


@pytest.mark.kafka
@pytest.mark.spark
def test_an_aggregation_of_a_kafka_topic_equals_pandas_across_a_restart(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path
) -> None:
    spec = _hourly("clicks")
    events = make_events(4000, hours=6, seed=3)
    first, second = events.iloc[:2500], events.iloc[2500:]
    kafka_server.create_topic(kafka_topic, partitions=3)
    _produce(kafka_server.bootstrap, kafka_topic, first, malformed=6)
    _run(spark, spec, kafka_server.bootstrap, kafka_topic, tmp_path)
    batches = open_batches(tmp_path / "ckpt")
    assert len(batches.ids()) >= 2  # maxOffsetsPerTrigger: several batches
    label = f"kafka://{kafka_server.bootstrap}/{kafka_topic}"
    assert lag(label, _committed(tmp_path / "ckpt")) == {"0": 0, "1": 0, "2": 0}
    # a new driver (a new query over the same checkpoint) after more records arrived
    _produce(kafka_server.bootstrap, kafka_topic, second)
    behind = lag(label, _committed(tmp_path / "ckpt"))  # what status shows now
    assert behind == {str(p): len(second.iloc[p::3]) for p in range(3)}
    _run(spark, spec, kafka_server.bootstrap, kafka_topic, tmp_path)

    want = _assert_results(tmp_path / "out", events)
    _assert_results_topic(kafka_server.bootstrap, f"{kafka_topic}-results", want)
    records = [batches.get(b) for b in batches.ids()]
    assert sum(r.malformed or 0 for r in records if r is not None) == 6
    assert sum(r.input or 0 for r in records if r is not None) == len(events) + 6
    # records deleted before they were read: the next start says so in one line,
    # before Spark runs (Spark's own check is a Java trace), and stores nothing
    _produce(kafka_server.bootstrap, kafka_topic, events.iloc[:30])
    _delete_records(kafka_server.bootstrap, kafka_topic, partition=1)
    ids = batches.ids()
    with pytest.raises(KafkaSourceError, match=r"deleted \(its retention\).*partition 1: "):
        _run(spark, spec, kafka_server.bootstrap, kafka_topic, tmp_path)
    assert batches.ids() == ids


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("co_located", [True, False])
def test_sessions_of_a_kafka_topic_equal_their_definition_and_its_results_topic(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path, co_located: bool
) -> None:
    """Session windows read from Kafka (co-located: the topic keyed by librdkafka's
    default partitioner; or shuffled): the current sessions, and a read_committed
    consumer of the Kafka results topic that applies records in order (deletes
    included) ends with the same rows."""
    from riverbed.stream import Session
    from tests.stream.test_engine import session_events, session_oracle

    events = session_events(1800, seed=81).sample(frac=1, random_state=2)
    kafka_server.create_topic(kafka_topic, partitions=2)
    _produce(kafka_server.bootstrap, kafka_topic, events, place=lambda i, flag: None)
    spec = Aggregation(
        name="visits",
        key="flag",
        time="ts",
        window=Session("5m"),
        watermark="100h",
        metrics={"events": Count(), "total": Sum("amount")},
        state_partitions=2,
    )
    options = {"maxOffsetsPerTrigger": "400"} | ({} if co_located else {"co_locate": "false"})
    source = {
        "kafka": {"bootstrap": kafka_server.bootstrap, "topic": kafka_topic, "schema": SCHEMA}
        | {"options": options}
    }
    results = f"{kafka_topic}-results"
    _run_once(spark, spec, source, tmp_path, topic=f"kafka://{kafka_server.bootstrap}/{results}")
    plans = {open_batches(tmp_path / "ckpt").get(b).co_located for b in range(2)}  # type: ignore[union-attr]
    assert plans == {co_located}
    want = session_oracle(events, pd.Timedelta(minutes=5))
    got = read_results(tmp_path / "out")
    columns = ["window_start", "window_end", "key", "events", "total"]
    pd.testing.assert_frame_equal(
        got[columns].reset_index(drop=True), want[columns], check_dtype=False
    )
    sent = read_topic(kafka_server.bootstrap, results, "read_committed")
    assert any(r["deleted"] for r in sent), "no session was merged away"
    seen: dict[tuple[str, str], int] = {}
    for record in sorted(sent, key=lambda r: r["batch_id"]):
        if record["deleted"]:
            seen.pop((record["window_start"], record["key"]), None)
        else:
            seen[(record["window_start"], record["key"])] = record["events"]
    assert sorted(seen.values()) == sorted(want["events"].tolist())
    assert len(seen) == len(want)


@pytest.mark.kafka
@pytest.mark.spark
def test_an_aggregation_of_avro_values_equals_pandas_and_counts_the_undecodable(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path
) -> None:
    """Values encoded by fastavro (not by Spark) with the writer's schema; a value that
    is not a datum of it is malformed, not a failed batch."""
    source = {"format": "avro", "schema": json.dumps(AVRO)}
    bad = [b"", b"\xff"]  # nothing to decode; a varint cut short
    _avro_run(kafka_server, kafka_topic, spark, tmp_path, source, lambda d: d, bad)


@pytest.mark.kafka
@pytest.mark.spark
def test_avro_values_in_a_registrys_framing_aggregate_as_plain_ones(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path
) -> None:
    """Values as a schema registry's Avro serializer writes them (Confluent's wire
    format: a zero byte, the schema id in 4 bytes big-endian, the datum — framed here by
    hand around fastavro's datum), read with ``schema_id`` and the schema registered
    under it: the same windows as plain values; one framed with another id, one not
    framed and a header alone are malformed."""
    import struct

    def framed(datum: bytes, schema_id: int = 300) -> bytes:
        return struct.pack(">bI", 0, schema_id) + datum

    datum = _avro_datum({"user_id": 1, "flag": "x", "amount": 1.5, "ts": 0})
    bad = [framed(datum, 301), datum, framed(b"")]
    source = {"format": "avro", "schema": AVRO, "schema_id": 300}
    _avro_run(kafka_server, kafka_topic, spark, tmp_path, source, framed, bad)


def _avro_datum(record: dict[str, Any]) -> bytes:
    """``record`` as one Avro datum of :data:`AVRO`, encoded by fastavro (not Spark)."""
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO), record)
    return out.getvalue()


def _avro_run(
    kafka_server: KafkaServer,
    topic: str,
    spark: Any,
    tmp_path: Path,
    source: dict[str, Any],
    frame: Any,
    bad: list[bytes],
) -> None:
    """Events as Avro datums (each ``frame``d) and the ``bad`` values, aggregated from
    the topic through ``source``: every window equals pandas', each bad value is
    malformed (counted), none fails a batch."""
    from confluent_kafka import Producer

    spec = _hourly("avro_clicks")
    events = make_events(1500, hours=3, seed=11)
    kafka_server.create_topic(topic, partitions=3)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap})
    epoch_ms = events["ts"].astype("int64") // 1_000_000
    for i, (u, f, a, ms) in enumerate(
        zip(events["user_id"], events["flag"], events["amount"], epoch_ms, strict=True)
    ):
        record = {"user_id": int(u), "flag": f, "amount": float(a), "ts": int(ms)}
        producer.produce(topic, key=f, value=frame(_avro_datum(record)), partition=i % 3)
    for value in bad:
        producer.produce(topic, value=value, partition=1)
    assert producer.flush(30) == 0
    read = {"bootstrap": kafka_server.bootstrap, "topic": topic, **source}
    read["options"] = {"maxOffsetsPerTrigger": "700"}
    _run_once(spark, spec, {"kafka": read}, tmp_path)
    _assert_results(tmp_path / "out", events)
    batches = open_batches(tmp_path / "ckpt")
    records = [batches.get(b) for b in batches.ids()]
    assert sum(r.malformed or 0 for r in records if r is not None) == len(bad)
    assert sum(r.input or 0 for r in records if r is not None) == len(events) + len(bad)


def test_a_schema_id_is_for_avro_values_and_a_whole_number() -> None:
    framed = parse({"kafka": {**GOOD, "format": "avro", "schema": AVRO, "schema_id": 7}})
    assert framed.schema_id == 7
    with pytest.raises(KafkaSourceError, match="it needs format 'avro'"):
        parse({"kafka": {**GOOD, "schema_id": 7}})
    for bad in (-1, 2**32, "7", True, 1.5):
        with pytest.raises(KafkaSourceError, match="is not a registry's schema id"):
            parse({"kafka": {**GOOD, "format": "avro", "schema": AVRO, "schema_id": bad}})


@pytest.mark.kafka
@pytest.mark.spark
def test_a_checkpoint_the_dataframe_path_started_stays_on_it(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path
) -> None:
    """Offsets pinned per partition (Spark's JSON) take Spark's Kafka source; started
    again with ``earliest`` after more records arrived, the aggregation carries on
    from Spark's offset log on the same path — nothing read twice or skipped."""
    spec = _hourly("pinned")
    events = make_events(1500, hours=3, seed=5)
    kafka_server.create_topic(kafka_topic, partitions=3)
    _produce(kafka_server.bootstrap, kafka_topic, events.iloc[:900])
    pinned = json.dumps({kafka_topic: {str(p): -2 for p in range(3)}})  # -2: earliest
    for starting in (pinned, "earliest"):
        source = {
            "kafka": {
                "bootstrap": kafka_server.bootstrap,
                "topic": kafka_topic,
                "schema": SCHEMA,
                "startingOffsets": starting,
            }
        }
        query = _run_once(spark, spec, source, tmp_path)
        assert not isinstance(query, DirectQuery), "the log-native loop, not Spark's query"
        if starting == pinned:
            _produce(kafka_server.bootstrap, kafka_topic, events.iloc[900:])
    batches = open_batches(tmp_path / "ckpt")
    assert all(batches.get(b).slices is None for b in batches.ids())  # type: ignore[union-attr]
    _assert_results(tmp_path / "out", events)


@pytest.mark.kafka
@pytest.mark.spark
def test_a_topic_keyed_by_librdkafkas_default_partitioner_is_co_located_and_exact(
    kafka_server: KafkaServer, spark: Any, tmp_path: Path
) -> None:
    """Keys placed by librdkafka's default partitioner (their CRC-32, riverbed's key
    hash) on as many partitions as state partitions: the batches read each partition
    where its state is, no shuffle. Placed otherwise (as murmur2 would), ``auto``
    shuffles, ``co_locate: true`` stops with the fix — both before anything is lost."""
    spec = _hourly("placed")
    events = make_events(3000, hours=4, seed=9)
    crc = KeyHashPartitioner()

    def elsewhere(i: int, flag: str) -> int:
        return (crc.partition(flag.encode(), 2) + 1) % 2

    def default(i: int, flag: str) -> None:
        return None  # librdkafka's default partitioner places the key

    def source(topic: str, **options: str) -> dict[str, Any]:
        kafka = {"bootstrap": kafka_server.bootstrap, "topic": topic, "schema": SCHEMA}
        return {"kafka": {**kafka, "options": options}}

    runs = {"librdkafka": default, "elsewhere": elsewhere}
    for name, place in runs.items():
        kafka_server.create_topic(name, partitions=2)
        _produce(kafka_server.bootstrap, name, events, place=place)
        root = tmp_path / name
        _run_once(spark, spec, source(name, maxOffsetsPerTrigger="1000"), root)
        batches = open_batches(root / "ckpt")
        records = [batches.get(b) for b in batches.ids()]
        assert len(records) >= 3
        assert {r.co_located for r in records if r is not None} == {name == "librdkafka"}
        _assert_results(root / "out", events)
    with pytest.raises(Exception, match=r"not keyed by 'flag'.*co_locate=.false."):
        _run_once(spark, spec, source("elsewhere", co_locate="true"), tmp_path / "forced")


def _delete_records(bootstrap: str, topic: str, partition: int) -> None:
    """Everything in ``partition`` deleted, as retention would."""
    from confluent_kafka import OFFSET_END, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, partition, OFFSET_END)])
    for future in futures.values():
        future.result(timeout=30)


@given(
    st.integers(1, 6),
    st.dictionaries(st.integers(0, 7), st.integers(0, 100), max_size=8),
    st.dictionaries(st.integers(0, 7), st.integers(0, 120), max_size=8),
    st.booleans(),
)
def test_continuity_refuses_lost_partitions_and_unread_deleted_records(
    partitions: int, read: dict[int, int], earliest: dict[int, int], strict: bool
) -> None:
    gone = [p for p in read if p >= partitions]
    lost = [p for p in read if p < partitions and earliest.get(p, 0) > read[p]]
    try:
        warnings = continuity("t", partitions, read, earliest, strict)
    except KafkaSourceError as exc:
        assert gone or (lost and strict), exc
        assert ("partition(s)" in str(exc)) == bool(gone)
        return
    assert not gone and not (lost and strict)
    assert any("skipping" in w for w in warnings) == bool(lost)
    grown = bool(read) and partitions > max(read) + 1
    assert any("partitions now" in w for w in warnings) == grown


def _assert_results_topic(bootstrap: str, topic: str, want: pd.DataFrame) -> None:
    """The results topic, as a read_committed consumer sees it: no batch's row twice,
    and the newest row of every window and key is the final result."""
    sent = pd.DataFrame(read_topic(bootstrap, topic, "read_committed"))
    assert not sent.duplicated(["batch_id", "window_start", "key"]).any(), "a batch twice"
    sent["window_start"] = pd.to_datetime(sent["window_start"], utc=True, format="ISO8601")
    newest = sent.sort_values("batch_id").drop_duplicates(["window_start", "key"], keep="last")
    newest = newest.sort_values(["window_start", "key"], ignore_index=True)
    assert list(newest["key"]) == list(want["key"])
    assert list(newest["events"]) == list(want["events"])
    assert list(newest["users"]) == list(want["users"])


CHAOS_SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Sum, Tumbling

source = {{"kafka": {{"bootstrap": "{bootstrap}", "topic": "{topic}",
                      "schema": "user_id long, flag string, amount double, ts timestamp"}}}}
aggregation = Aggregation(
    name="kchaos", key="flag", time="ts", window=Tumbling("1h"), watermark="100h",
    metrics={{"users": Distinct("user_id"), "events": Count(), "total": Sum("amount")}},
    state_partitions=2,
)
"""
KILLS = 5


def _read_back(bootstrap: str, topic: str) -> pd.DataFrame:
    """The topic's well-formed events, read by a Kafka consumer from start to end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ends = topic_ends(bootstrap, topic, "read_committed")  # the client's default
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "oracle"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    rows, seen = [], 0
    try:
        while seen < sum(ends.values()):
            message = consumer.poll(10)
            assert message is not None, "the broker went quiet while reading back"
            if message.error():
                continue
            seen += 1
            try:
                value = json.loads(message.value())
            except ValueError:
                continue  # malformed: not an event
            if "ts" in value:
                rows.append(value)
    finally:
        consumer.close()
    events = pd.DataFrame(rows)
    events["ts"] = pd.to_datetime(events["ts"], utc=True, format="ISO8601")
    return events


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_stream_run_killed_five_times_and_a_broker_lost_equal_the_topic_read_back(
    kafka_topic: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Three brokers, the topic on all three: one is SIGKILLed mid-stream (a lost
    machine) and comes back later, while the driver is SIGKILLed five times."""
    with KafkaCluster(3, tmp_path / "kafka") as kafka:
        _chaos(kafka, kafka_topic, tmp_path, subprocess_env)


def _chaos(
    kafka: KafkaCluster, kafka_topic: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    kafka.create_topic(kafka_topic, partitions=3)
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    spec = tmp_path / "spec.py"
    spec.write_text(CHAOS_SPEC.format(bootstrap=kafka.bootstrap, topic=kafka_topic))
    events = make_events(9000, hours=8, seed=11)
    slices = backlogs(events, KILLS + 1)

    def release(k: int) -> None:  # each start's backlog, a few malformed among it
        _produce(kafka.bootstrap, kafka_topic, slices[k], malformed=1 if k % 2 == 0 else 0)

    command = [
        sys.executable,
        "-m",
        "riverbed.cli.main",
        "stream",
        "run",
        str(spec),
        "--max-records-per-batch",
        "200",  # ~8 batches a backlog: the kill's batch and the ones after it have work
        "--ttl",
        "3",
        "--topic",  # and the results to a Kafka topic, one transaction per batch
        f"kafka://{kafka.bootstrap}/{kafka_topic}-results",
    ]
    batches = Checkpoint(home / "checkpoints" / "kchaos").batches

    def lose_a_broker(k: int) -> None:
        if k == 1:
            kafka.kill(0)  # mid-stream: the others lead its partitions
        elif k == 3:
            kafka.start_node(0)  # back with its log; it catches up

    aimed = kill_mid_batch(
        command,
        env,
        batches,
        kills=KILLS,
        rng=random.Random(7),
        before_start=release,
        before_kill=lose_a_broker,
        logs=tmp_path / "logs",
    )
    assert len(aimed) == KILLS
    release(KILLS)  # the last backlog, for the final run to drain with the rest
    # the last run keeps a longer lease: a driver starved for 3 s on a busy host would
    # rightly stop as fenced, which is not what this run is here to show
    final = [
        *command[: command.index("--ttl")],
        "--ttl",
        "15",
        *command[command.index("--ttl") + 2 :],
    ]
    finished = subprocess.run(
        [*final, "--once"], env=env, capture_output=True, text=True, check=False, timeout=600
    )
    assert finished.returncode == 0, finished.stderr[-2000:]

    want = _assert_results(home / "output" / "kchaos", _read_back(kafka.bootstrap, kafka_topic))
    _assert_results_topic(kafka.bootstrap, f"{kafka_topic}-results", want)
