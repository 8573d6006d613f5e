"""Typed topics: the schema is kept with the topic, producers refuse values that do not fit
it (naming record, field and reason) and write nothing of a refused call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import riverbed.log
from riverbed.log import Log
from riverbed.log.errors import RecordRejectedError
from tests.log.test_cli import run

SCHEMA = "user_id long, flag string, ts timestamp"


def ends(log: Log, topic: str) -> list[int]:
    return [o.end for o in log.offsets(topic)]


def test_a_typed_topic_keeps_its_schema_and_takes_values_that_fit(log: Log) -> None:
    config = log.create_topic("clicks", 2, schema="user_id BIGINT, flag string, ts: timestamp")
    assert config.schema == SCHEMA  # canonical spelling
    assert log.topic("clicks").schema == SCHEMA
    producer = log.producer("clicks")
    producer.send({"user_id": 7, "flag": "a", "ts": "2026-11-23T00:00:00Z"}, key="a")
    producer.send_batch([{"user_id": i, "flag": "b"} for i in range(5)], key_field="flag")
    producer.buffer({"user_id": 8, "flag": "c"})
    producer.flush()
    assert sum(ends(log, "clicks")) == 7
    values = [r.value for p in range(2) for r in log.read("clicks", p, 0, 100)]
    assert sorted(v["user_id"] for v in values) == [0, 1, 2, 3, 4, 7, 8]


def test_a_value_that_does_not_fit_is_refused_and_nothing_of_the_call_is_written(
    log: Log,
) -> None:
    log.create_topic("clicks", 2, schema=SCHEMA)
    producer = log.producer("clicks")
    with pytest.raises(RecordRejectedError) as caught:
        producer.send({"user_id": "seven", "flag": "a"})
    assert str(caught.value).startswith(
        f"topic 'clicks' ({SCHEMA}) refused field 'user_id' is 'seven', which is not a long"
    )
    batch = [{"user_id": i, "flag": "x"} for i in range(10)]
    batch[6] = {"user_id": 6, "flga": "x"}
    with pytest.raises(RecordRejectedError, match="refused record 6: field 'flga' is not in"):
        producer.send_batch(batch)
    assert caught.value.field == "user_id"
    with pytest.raises(RecordRejectedError, match="not a timestamp"):
        producer.buffer({"user_id": 1, "ts": "soon"})
    assert sum(ends(log, "clicks")) == 0
    producer.send_batch(batch[:6])  # the producer is still usable
    assert sum(ends(log, "clicks")) == 6


def test_untyped_topics_are_unchanged_and_bad_schemas_are_refused(log: Log) -> None:
    config = log.create_topic("raw", 1)
    assert config.schema is None and "schema" not in config.to_dict()
    log.producer("raw").send({"anything": ["goes"]})
    with pytest.raises(ValueError, match="field 'a' has type 'lng'"):
        log.create_topic("bad", 1, schema="a lng")
    with pytest.raises(ValueError, match="serde 'bytes' holds raw bytes"):
        log.create_topic("bad", 1, serde="bytes", schema="a long")
    assert "bad" not in log.topics()


def test_the_schema_survives_reopening_a_file_log(tmp_path: Path) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("clicks", 1, schema=SCHEMA)
    log.close()
    stored = json.loads((tmp_path / "clicks" / "topic.json").read_text())
    assert stored["schema"] == SCHEMA
    reopened = riverbed.log.open(tmp_path)
    with pytest.raises(RecordRejectedError):
        reopened.producer("clicks").send({"user_id": 1.5})
    reopened.close()


def test_typed_topics_from_the_cli(tmp_path: Path) -> None:
    made = run(tmp_path, "topic", "create", "clicks", "--partitions", "2", "--schema", SCHEMA)
    assert made.returncode == 0, made.stderr
    assert f"typed: {SCHEMA}" in made.stdout
    described = run(tmp_path, "topic", "describe", "clicks")
    assert f"schema: {SCHEMA}" in described.stdout
    bad = run(tmp_path, "topic", "create", "x", "--partitions", "1", "--schema", "a lng")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "field 'a' has type 'lng'" in bad.stderr
    produced = run(
        tmp_path, "produce", "clicks", stdin='{"user_id": 1, "flag": "a"}\n{"user_id": "x"}\n'
    )
    assert produced.returncode != 0
    assert "field 'user_id' is 'x', which is not a long" in produced.stderr
    assert "Traceback" not in produced.stderr
