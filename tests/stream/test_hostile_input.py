"""Hostile input through every source (the cases and their outcomes: hostile.py): the
stream never stops, every record is aggregated by the documented rule or counted as
malformed and sent to the dead-letter topic, and the results equal pandas over the
well-formed events.

Sources: riverbed topics on disk (the log-native path, and the same topic as a Spark
DataFrame through the foreachBatch path), behind a log server, diskless in the tests'
S3 server; a Kafka topic (JSON values, and Avro); a typed topic, whose producer
refuses at the door what does not fit its schema. A malformed value sits at the first
offset of every partition — where the co-location check reads — among the events, and as
the last record."""

from __future__ import annotations

import contextlib
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import riverbed.log
from riverbed.log.errors import RecordRejectedError
from riverbed.log.records import RawRecord, now_ms
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling, register
from riverbed.stream.batchlog import open_batches
from riverbed.stream.dataframe import read_results, start
from riverbed.testing import KafkaServer
from tests.stream.conftest import make_events
from tests.stream.hostile import CASES, SCHEMA, YEAR_1, YEAR_9999, Case, well_formed

pytestmark = pytest.mark.spark

PARTITIONS = 3
NOT_JSON = b"{not json"  # at the first offset of every partition, and the last record


def spec(name: str) -> Aggregation:
    return Aggregation(
        name=name,
        key="flag",
        time="ts",
        window=Tumbling("1h"),
        watermark="100h",
        metrics={
            "events": Count(),
            "users": Distinct("user_id"),
            "total": Sum("amount"),
            "top": Max("amount"),
        },
        state_partitions=PARTITIONS,
    )


def placed(flag: Any) -> int:
    """The partition of a key by its CRC-32 (riverbed's key-hash partitioner and
    librdkafka's default): the topics are co-located with the aggregation."""
    return zlib.crc32(str(flag).encode()) % PARTITIONS


Wire = tuple[bytes | None, bytes | None, dict[str, bytes]]  # key, value, headers


def _event_bytes(row: dict[str, Any]) -> Wire:
    value = {k: v for k, v in row.items() if k != "ts"} | {"ts": row["ts"].isoformat()}
    return row["flag"].encode(), json.dumps(value).encode(), {}


def layout(events: pd.DataFrame, cases: list[Case]) -> dict[int, list[Wire]]:
    """Each partition's records in order: a malformed value first, half its events, the
    cases placed by their event's key (the malformed ones spread), the other half, and
    a malformed value last."""
    parts: dict[int, list[Wire]] = {p: [(None, NOT_JSON, {})] for p in range(PARTITIONS)}
    rows = events.to_dict("records")
    halves = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    for row in halves[0]:
        parts[placed(row["flag"])].append(_event_bytes(row))
    for i, case in enumerate(cases):
        # as a producer keyed by the flag places them (the malformed ones without a key
        # spread); the one whose Kafka key is not its flag goes where its flag belongs
        key = str(case.event["flag"]).encode() if case.event and case.key == b"f1" else case.key
        if case.event:
            where = placed(case.event["flag"])
        else:
            where = i % PARTITIONS if key is None else placed(key.decode())
        parts[where].append((key, case.value, case.headers))
    for row in halves[1]:
        parts[placed(row["flag"])].append(_event_bytes(row))
    parts[PARTITIONS - 1].append((None, NOT_JSON, {}))
    return parts


@dataclass
class Bed:
    """A source of one kind: how to append records as bytes, and the source to run."""

    kind: str
    url: str  # the log's URL (side topics go to a file log for Kafka)
    side: str
    kafka: KafkaServer | None = None
    topic: str = "events"

    def create(self) -> None:
        if self.kafka is not None:
            self.kafka.create_topic(self.topic, PARTITIONS)
            return
        log = riverbed.log.open(self.url)
        log.create_topic(self.topic, PARTITIONS)
        log.close()

    def append(self, parts: dict[int, list[Wire]]) -> None:
        if self.kafka is not None:
            from confluent_kafka import Producer

            producer = Producer(
                {"bootstrap.servers": self.kafka.bootstrap, "message.max.bytes": 16 << 20}
            )
            for p, records in parts.items():
                for key, value, headers in records:
                    producer.produce(
                        self.topic, value=value, key=key, partition=p,
                        headers=list(headers.items()) or None,
                    )  # fmt: skip
            assert producer.flush(60) == 0
            return
        log = riverbed.log.open(self.url)
        try:
            for p, records in parts.items():
                assert all(value is not None for _, value, _ in records)
                log.storage.append(
                    self.topic,
                    p,
                    [RawRecord(now_ms(), key, value, headers) for key, value, headers in records],
                )
        finally:
            log.close()

    def source(self, spark: Any) -> Any:
        if self.kind == "kafka":
            assert self.kafka is not None
            return {"kafka": {"bootstrap": self.kafka.bootstrap, "topic": self.topic,
                              "schema": SCHEMA}}  # fmt: skip
        options = {"topic": self.topic, "log": self.url, "schema": SCHEMA}
        if self.kind != "dataframe":
            return options
        register(spark)
        reader = spark.readStream.format("riverbed")
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()


BEDS = [
    "file",
    "dataframe",
    "flight",
    pytest.param("diskless", marks=pytest.mark.s3),
    pytest.param("kafka", marks=pytest.mark.kafka),
]


@contextlib.contextmanager
def open_bed(
    kind: str, log: str, request: pytest.FixtureRequest, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Bed]:  # fmt: skip
    """A source of ``kind``; ``log`` (a file log) holds the topic for the file kinds and
    the side topics (.dlq, .late) for every kind."""
    if kind in ("file", "dataframe"):
        yield Bed(kind, log, log)
    elif kind == "flight":  # a log server in this process, over files of its own
        from riverbed.log.file import FileLogStorage
        from riverbed.log.server import LogServer

        server = LogServer(FileLogStorage(tmp_path / "served"))
        try:
            yield Bed(kind, server.url, log)
        finally:
            server.shutdown()
            server.storage.close()
    elif kind == "diskless":  # in the tests' bucket (s3_url sets the AWS settings)
        s3_url = request.getfixturevalue("s3_url")
        monkeypatch.setenv("RIVERBED_CONTROL", f"sqlite:///{tmp_path / 'control.db'}")
        yield Bed(kind, s3_url, log)
    else:
        kafka = request.getfixturevalue("kafka_server")
        topic = request.getfixturevalue("kafka_topic")
        yield Bed(kind, log, log, kafka=kafka, topic=topic)


@pytest.fixture(params=BEDS)
def bed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Bed]:
    with open_bed(request.param, f"file://{tmp_path / 'log'}", request, tmp_path, monkeypatch) as b:
        yield b


def _run(spark: Any, bed: Bed, aggregation: Aggregation, root: Path) -> None:
    query = start(
        spark,
        aggregation,
        bed.source(spark),
        checkpoint=root / "ckpt",
        output=root / "out",
        log_url=bed.side,
        trigger={"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def _oracle(events: pd.DataFrame) -> pd.DataFrame:
    return (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(
            events=("user_id", "size"),
            users=("user_id", "nunique"),
            total=("amount", "sum"),
            top=("amount", "max"),
        )
        .reset_index()
        .rename(columns={"flag": "key"})
        .sort_values(["window_start", "key"], ignore_index=True)
    )


def _assert_equal(output: Path, events: pd.DataFrame) -> None:
    got = read_results(output).sort_values(["window_start", "key"], ignore_index=True)
    want = _oracle(events)
    assert list(got["key"]) == list(want["key"])
    assert list(got["window_start"].dt.as_unit("us")) == list(want["window_start"].dt.as_unit("us"))
    assert list(got["events"]) == list(want["events"]), "double or missing counts"
    assert list(got["users"]) == list(want["users"])
    assert list(got["total"]) == pytest.approx(list(want["total"]))
    assert list(got["top"]) == list(want["top"])


def _counts(root: Path) -> dict[str, int]:
    """The running totals of the newest batch."""
    batches = open_batches(root / "ckpt")
    newest = batches.get(batches.ids()[-1])
    assert newest is not None and newest.done and newest.totals is not None
    return {c: newest.totals[c] for c in ("input", "malformed", "late")}


def _dlq(bed: Bed, name: str) -> list[dict[str, Any]]:
    log = riverbed.log.open(bed.side)
    try:
        return [r.value for r in log.iter_records(f"{name}.dlq", 0)]
    finally:
        log.close()


def test_hostile_records_are_aggregated_by_the_rules_or_malformed_and_never_stop_a_stream(
    bed: Bed, spark: Any, tmp_path: Path
) -> None:
    name = f"hostile_{bed.kind}"
    aggregation = spec(name)
    cases = [c for c in CASES if bed.kafka is not None or not c.kafka_only]
    events = make_events(600, hours=5, seed=17)
    bed.create()
    parts = layout(events, cases)
    bed.append(parts)
    _run(spark, bed, aggregation, tmp_path)

    events = events.assign(ts=events["ts"].dt.as_unit("us"))  # beside year 9999's
    counted = pd.concat([events, well_formed(cases)], ignore_index=True)
    _assert_equal(tmp_path / "out", counted)
    malformed = sum(c.outcome == "malformed" for c in cases) + PARTITIONS + 1
    records = sum(map(len, parts.values()))
    assert _counts(tmp_path) == {"input": records, "malformed": malformed, "late": 0}
    dlq = _dlq(bed, name)
    assert len(dlq) == malformed and all(row["_error"] for row in dlq)
    assert {"partition", "offset"} <= set(dlq[0])  # where to find the record
    if bed.kind != "dataframe":  # the first offsets' bad values did not stop co-location
        batches = open_batches(tmp_path / "ckpt")
        assert {batches.get(b).co_located for b in batches.ids()} == {True}

    # the ends of the calendar: year 1 is before 1970 (malformed), year 9999 is counted
    # (last: it closes every window before it)
    bed.append({placed("f1"): [(b"f1", YEAR_1.value, {}), (b"f1", YEAR_9999.value, {})]})
    _run(spark, bed, aggregation, tmp_path)
    _assert_equal(tmp_path / "out", pd.concat([counted, well_formed([YEAR_9999])]))
    assert _counts(tmp_path) == {"input": records + 2, "malformed": malformed + 1, "late": 0}


# what a typed topic refuses though a JSON topic's reader takes it: a field outside the
# schema, a number for a string (a typed topic's fields have one type each)
STRICTER = {"a field it does not read", "a number for the key"}


def test_a_typed_topic_refuses_at_the_door_what_does_not_fit_and_counts_the_rest(
    spark: Any, tmp_path: Path
) -> None:
    """A typed topic checks values against its schema when they are produced: a case
    that does not fit is refused there (naming the field and the reason) and nothing
    is stored; what it takes, the stream aggregates by the same rules."""
    url = f"file://{tmp_path / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("events", PARTITIONS, schema=SCHEMA)
    producer = log.producer("events")
    events = make_events(300, hours=3, seed=5).assign(ts=lambda f: f["ts"].dt.as_unit("us"))
    producer.send_batch(events.to_dict("records"), key_field="flag")
    refused, taken, unusable = [], [], []
    for case in CASES:
        try:
            value = json.loads(case.value) if case.value is not None else None
        except ValueError:
            continue  # not JSON: a typed topic's producer takes values, not bytes
        if not isinstance(value, dict):
            with pytest.raises(RecordRejectedError):
                producer.send(value, key="f1")
            refused.append(case)
            continue
        try:
            producer.send(value, key=str(value.get("flag")))
        except RecordRejectedError as exc:
            assert case.outcome == "malformed" or case.name in STRICTER, (case, exc)
            assert str(exc), case
            refused.append(case)
            continue
        (taken if case.outcome == "aggregated" else unusable).append(case)
    log.close()
    assert refused and taken  # both happen: the door holds, and lets good events in
    assert {c.name for c in refused} >= STRICTER
    # what fit the schema but not the aggregation (no key, no time, a window out of the
    # calendar, NaN) is counted malformed by the stream, as on JSON topics
    assert {c.name for c in unusable} <= {
        "no key", "no time", "a null key", "a null time", "a window past year 9999",
        "a time before 1970", "NaN", "Infinity", "a double past 1e308",
    }  # fmt: skip
    options = {"topic": "events", "log": url}  # the topic's own schema
    query = start(
        spark, spec("typed"), options, checkpoint=tmp_path / "ckpt", output=tmp_path / "out",
        log_url=url, trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    _assert_equal(tmp_path / "out", pd.concat([events, well_formed(taken)], ignore_index=True))
    assert _counts(tmp_path)["malformed"] == len(unusable)


AVRO = {
    "type": "record",
    "name": "Click",
    "fields": [
        {"name": "user_id", "type": "long"},
        {"name": "flag", "type": ["null", "string"]},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


@pytest.mark.kafka
def test_hostile_avro_values_are_malformed_and_never_stop_a_stream(
    kafka_server: KafkaServer, kafka_topic: str, spark: Any, tmp_path: Path
) -> None:
    """Avro values through Spark's connector: what is not a datum of the schema (a null
    value, empty, cut short, another schema's) and datums the aggregation cannot count
    (a null key, a NaN, a window past year 9999) are malformed; the rest is exact."""
    import fastavro
    from confluent_kafka import Producer

    parsed = fastavro.parse_schema(AVRO)

    def datum(**fields: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, fields)
        return out.getvalue()

    events = make_events(900, hours=4, seed=29).assign(ts=lambda f: f["ts"].dt.as_unit("us"))
    kafka_server.create_topic(kafka_topic, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap})
    ms = events["ts"].astype("int64") // 1000
    good = [
        datum(user_id=int(u), flag=f, amount=float(a), ts=int(t))
        for u, f, a, t in zip(events["user_id"], events["flag"], events["amount"], ms, strict=True)
    ]
    at = int(ms.iloc[0])
    other = fastavro.parse_schema({"type": "record", "name": "O", "fields": [
        {"name": "x", "type": "string"}]})  # fmt: skip
    foreign = io.BytesIO()
    fastavro.schemaless_writer(foreign, other, {"x": "a string, not a click"})
    bad = [
        None,  # a tombstone
        b"",
        b"\xff",  # a varint cut short
        foreign.getvalue(),
        datum(user_id=1, flag=None, amount=1.0, ts=at),  # no key
        datum(user_id=1, flag="f1", amount=float("nan"), ts=at),
        datum(user_id=1, flag="f1", amount=float("inf"), ts=at),
        datum(user_id=1, flag="f1", amount=1.0, ts=253_402_300_000_000),  # 9999-12-31T23:46
    ]
    for i, value in enumerate([bad[0], *good[:450], *bad[1:], *good[450:]]):
        producer.produce(kafka_topic, key=b"f1", value=value, partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    source = {"kafka": {"bootstrap": kafka_server.bootstrap, "topic": kafka_topic,
                        "format": "avro", "schema": json.dumps(AVRO)}}  # fmt: skip
    query = start(
        spark, spec("avro"), source, checkpoint=tmp_path / "ckpt", output=tmp_path / "out",
        log_url=f"file://{tmp_path / 'side'}", trigger={"availableNow": True},
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    _assert_equal(tmp_path / "out", events)
    counts = _counts(tmp_path)
    assert counts["malformed"] == len(bad) and counts["input"] == len(events) + len(bad)
