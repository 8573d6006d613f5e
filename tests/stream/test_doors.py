"""The stream's front doors (riverbed.stream.doors): what ``start`` accepts as a source
and as sinks, and the clear errors for what it does not. The end-to-end runs of each
door are in test_sinks.py (a topic and a DataFrame into the result table, SQL and a
topic) and test_kafka_source.py (Kafka in and out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.stream import (
    Frame,
    Kafka,
    ResultsTopic,
    ResultTable,
    Sink,
    Source,
    SqlTable,
    Topic,
)
from riverbed.stream.doors import as_source, split_sinks
from riverbed.stream.errors import StreamValueError


class Streaming:
    """Looks like a streaming DataFrame to ``as_source`` (it asks only this)."""

    isStreaming = True


def test_the_old_spellings_become_source_objects() -> None:
    topic = as_source({"topic": "clicks", "log": "file:///l", "maxRecordsPerBatch": 10})
    assert topic == Topic("clicks", "file:///l", {"maxRecordsPerBatch": 10})
    kafka = as_source({"kafka": {"bootstrap": "b:9092", "topic": "t", "schema": "a int"}})
    assert kafka == Kafka(bootstrap="b:9092", topic="t", schema="a int")
    frame = Streaming()
    assert as_source(frame) == Frame(frame)
    door = Topic("x")
    assert as_source(door) is door
    assert all(isinstance(s, Source) for s in (topic, kafka, Frame(frame)))


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ({"log": "file:///l"}, "a topic source names its topic"),
        ({"kafka": "b:9092"}, 'takes a dict: {"bootstrap"'),
        ("clicks", "cannot read events from str: give a source"),
        (object(), "Topic\\('clicks'\\), Kafka\\(bootstrap"),
    ],
)
def test_what_is_no_source_is_named_with_the_fix(source: object, says: str) -> None:
    with pytest.raises(Exception, match=says) as caught:
        as_source(source)
    assert "Traceback" not in str(caught.value)


def test_sinks_and_the_old_keywords_mean_the_same(tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'r.db'}"
    old = split_sinks([], tmp_path / "out", sql=sql, topic="results")
    new = split_sinks([ResultTable(tmp_path / "out"), SqlTable(sql), ResultsTopic("results")], None)
    assert old == new == (tmp_path / "out", (SqlTable(sql), ResultsTopic("results")))
    assert all(isinstance(s, Sink) for s in new[1])
    assert ResultsTopic("kafka://b:9092/r").kafka and not ResultsTopic("r").kafka


def test_one_result_table_exactly(tmp_path: Path) -> None:
    with pytest.raises(StreamValueError, match=r"one result table.*got 0"):
        split_sinks([SqlTable(f"sqlite:///{tmp_path / 'r.db'}")], None)
    with pytest.raises(StreamValueError, match="got 2"):
        split_sinks([ResultTable(tmp_path / "a")], tmp_path / "b")


def test_what_is_no_sink_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StreamValueError, match="'results' is not a sink: give ResultTable"):
        split_sinks(["results"], tmp_path / "out")
    with pytest.raises(Exception, match="unsupported SQL sink 'mysql://h/db'"):
        SqlTable("mysql://h/db")  # named when written down, not at the first batch
