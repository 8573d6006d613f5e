"""Typed topics: the schema is kept with the topic, producers refuse values that do not fit
it (naming record, field and reason) and write nothing of a refused call."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert (
        "stdin line 2: topic 'clicks' refused field 'user_id' is 'x', which is not a long; "
        "the 1 records before it were produced" in produced.stderr
    )
    assert "Traceback" not in produced.stderr
    line = '{"user_id": 2, "flag": "b", "ts": "2026-11-23T05:00:00Z"}\n'
    assert run(tmp_path, "produce", "clicks", stdin=line).returncode == 0
    consumed = run(
        tmp_path, "consume", "clicks", "--group", "g", "--from-beginning", "--timeout", "1"
    )
    assert consumed.returncode == 0, consumed.stderr
    values = sorted(
        (json.loads(x)["value"] for x in consumed.stdout.splitlines()), key=lambda v: v["user_id"]
    )
    assert values == [
        {"user_id": 1, "flag": "a", "ts": None},
        {"user_id": 2, "flag": "b", "ts": "2026-11-23T05:00:00+00:00"},
    ]


def test_a_typed_topic_stores_columns_and_reads_back_typed_values(log: Log) -> None:
    import pyarrow as pa

    from riverbed.log.schema import TIMESTAMP

    log.create_topic("clicks", 1, schema="user_id long, flag string, ts timestamp, w double")
    sent = {"user_id": 7, "flag": "a", "ts": "2026-11-23T01:02:03Z", "w": 2}
    log.producer("clicks").send_batch([sent, {"user_id": 8}])
    sent["user_id"] = 99  # the caller's dict is not the stored record
    buffered = {"user_id": 9}
    with log.producer("clicks") as producer:
        producer.buffer(buffered)
        buffered["user_id"] = 10  # changed before the flush: the buffered value stays
    columns = log.storage.read_columns("clicks", 0, 0, 3)
    assert columns.values.type == pa.struct(
        [("user_id", pa.int64()), ("flag", pa.string()), ("ts", TIMESTAMP), ("w", pa.float64())]
    )
    assert columns.values.field("user_id").to_pylist() == [7, 8, 9]
    first, second, _ = (r.value for r in log.read("clicks", 0, 0, 10))
    assert first == {
        "user_id": 7,
        "flag": "a",
        "ts": datetime(2026, 11, 23, 1, 2, 3, tzinfo=UTC),
        "w": 2.0,
    }
    assert second == {"user_id": 8, "flag": None, "ts": None, "w": None}


def test_the_storage_itself_refuses_what_does_not_fit(log: Log) -> None:
    """Writers that bypass producers (storage.append) meet the same check."""
    from riverbed.log.records import RawRecord

    log.create_topic("clicks", 1, schema=SCHEMA)
    good = RawRecord(0, None, {"user_id": 1})
    bad = RawRecord(0, None, {"user_id": 1.5})
    with pytest.raises(RecordRejectedError, match=r"record 1: field 'user_id' is 1\.5"):
        log.storage.append("clicks", 0, [good, bad])
    assert ends(log, "clicks") == [0]
    log.storage.append("clicks", 0, [good])
    assert [r.value["user_id"] for r in log.read("clicks", 0, 0, 10)] == [1]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "n": st.integers(-(2**63), 2**63 - 1),
                "s": st.text(max_size=8),
                "b": st.booleans(),
                "f": st.floats(allow_nan=False),
            },
        ),
        min_size=1,
        max_size=30,
    ),
    cut=st.integers(0, 30),
)
def test_typed_frames_round_trip_any_values(rows: list[dict[str, Any]], cut: int) -> None:
    """encode/decode of format 3, sliced anywhere, gives back every value (absent = null)."""
    from riverbed.log.records import RawRecord, decode_batch, encode_batch, read_header
    from riverbed.log.schema import parse_schema, to_batch

    schema = parse_schema("n long, s string, b boolean, f double")
    records = [RawRecord(i, None if i % 3 else b"k", row) for i, row in enumerate(rows)]
    frame = encode_batch(5, records, to_batch(rows, schema))
    batch = decode_batch(frame, 0, read_header(frame, 0))
    got = batch.rows()
    want = [{name: row.get(name) for name in schema.names} for row in rows]
    assert [r.value for r in got] == want
    assert [r.key for r in got] == [r.key for r in records]
    cut = min(cut, len(rows))
    assert batch.slice(cut, len(rows)).values.to_pylist() == want[cut:]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(-(2**40), 2**40),
            st.sampled_from(["a", "b", "c", "é", ""]),
            st.integers(0, 2**41),  # ms since the epoch
        ),
        min_size=1,
        max_size=40,
    ),
    by_time=st.booleans(),
    unit=st.sampled_from(["us", "ns", "ms"]),
)
def test_an_arrow_table_goes_as_columns_and_stores_what_the_row_path_stores(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[int, str, int]],
    by_time: bool,
    unit: str,
) -> None:
    """A table of the topic's types, keyed by a column, is written without a Python object
    per record on a file log; partition, offset, key, value and (with a timestamp field)
    timestamp of every record are what sending its rows as dicts gives."""
    import pyarrow as pa

    log = riverbed.log.open(tmp_path_factory.mktemp("log"))
    for name in ("columns", "rows"):
        log.create_topic(name, 3, schema=SCHEMA)
    table = pa.table(
        {
            "user_id": pa.array([r[0] for r in rows], pa.int64()),
            "flag": pa.array([r[1] for r in rows]),
            "ts": pa.array([r[2] for r in rows], pa.int64())
            .cast(pa.timestamp("ms", tz="UTC"))
            .cast(pa.timestamp(unit, tz="UTC")),
        }
    )
    stamp = "ts" if by_time else None
    producer = log.producer("columns")
    assert producer._columns(table, "flag", stamp) is not None  # the columnar path is taken
    got = producer.send_batch(table, key_field="flag", timestamp_field=stamp)
    want = log.producer("rows").send_batch(
        table.to_pylist(), key_field="flag", timestamp_field=stamp
    )
    assert [(m.partition, m.offset) for m in got] == [(m.partition, m.offset) for m in want]
    for p in range(3):
        a, b = log.read("columns", p, 0, 100), log.read("rows", p, 0, 100)
        assert [(r.key, r.value) for r in a] == [(r.key, r.value) for r in b]
        if by_time:
            assert [r.timestamp for r in a] == [r.timestamp for r in b]


def test_a_table_the_columns_cannot_take_goes_the_row_path_and_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """Wrong column types, an unknown column, a null key: the row path, which names the
    record and field, and writes nothing."""
    import pyarrow as pa

    log = riverbed.log.open(tmp_path / "log")
    log.create_topic("clicks", 2, schema=SCHEMA)
    producer = log.producer("clicks")
    ints_as_text = pa.table({"user_id": ["1", "x"], "flag": ["a", "b"]})
    assert producer._columns(ints_as_text, "flag", None) is None
    with pytest.raises(RecordRejectedError, match="record 0: field 'user_id' is '1'"):
        producer.send_batch(ints_as_text, key_field="flag")
    extra = pa.table({"user_id": [1], "flag": ["a"], "flga": ["a"]})
    with pytest.raises(RecordRejectedError, match="field 'flga' is not in"):
        producer.send_batch(extra, key_field="flag")
    null_key = pa.table({"user_id": [1, 2], "flag": ["a", None]})
    assert producer._columns(null_key, "flag", None) is None
    assert sum(ends(log, "clicks")) == 0
    producer.send_batch(null_key, key_field="flag")  # the row path: a null key is no key
    assert sum(ends(log, "clicks")) == 2
