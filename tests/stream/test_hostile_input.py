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

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import riverbed.log
from riverbed.log.records import RawRecord, now_ms
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling, register
from riverbed.stream.dataframe import read_results, start
from riverbed.stream.records import open_batches
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


BEDS = ["file", "dataframe", "flight", "diskless", "kafka"]


@pytest.fixture(params=BEDS)
def bed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Bed]:
    kind = request.param
    side = f"file://{tmp_path / 'side'}"
    if kind in ("file", "dataframe"):
        yield Bed(kind, f"file://{tmp_path / 'log'}", f"file://{tmp_path / 'log'}")
    elif kind == "flight":
        from riverbed.log.file import FileLogStorage
        from riverbed.log.server import LogServer

        server = LogServer(FileLogStorage(tmp_path / "served"))
        try:
            yield Bed(kind, server.url, side)
        finally:
            server.shutdown()
            server.storage.close()
    elif kind == "diskless":
        s3_url = request.getfixturevalue("s3_url")
        monkeypatch.setenv("RIVERBED_CONTROL", f"sqlite:///{tmp_path / 'control.db'}")
        yield Bed(kind, s3_url, side)
    else:
        kafka = request.getfixturevalue("kafka_server")
        topic = request.getfixturevalue("kafka_topic")
        yield Bed(kind, side, side, kafka=kafka, topic=topic)


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

    # the ends of the calendar: year 1 is late by now, year 9999 is counted (last: it
    # closes every window before it)
    bed.append({placed("f1"): [(b"f1", YEAR_1.value, {}), (b"f1", YEAR_9999.value, {})]})
    _run(spark, bed, aggregation, tmp_path)
    _assert_equal(tmp_path / "out", pd.concat([counted, well_formed([YEAR_9999])]))
    assert _counts(tmp_path) == {"input": records + 2, "malformed": malformed, "late": 1}
