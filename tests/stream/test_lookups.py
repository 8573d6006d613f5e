"""Lookup joins without Spark: reading a table (Parquet on disk and in a bucket, SQLite,
PostgreSQL), its snapshots, the join, and its refusals; the join against pandas'
merge on generated events and tables."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riverbed.log
from riverbed.storage import open_store
from riverbed.stream import Aggregation, Count, Lookup, Tumbling
from riverbed.stream.derive import compile_for, input_types
from riverbed.stream.errors import StreamValueError
from riverbed.stream.expressions import ExpressionError
from riverbed.stream.layout import LOOKUPS
from riverbed.stream.lookups import (
    LookupTableError,
    Snapshot,
    join,
    plan_snapshots,
    prune_snapshots,
    read_table,
    tables,
)
from riverbed.testing.kafkaserver import KafkaServer

EVENTS = pa.schema(
    [("cid", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("_error", pa.string())]
)


def spec(*lookups: Lookup, **more: object) -> Aggregation:
    return Aggregation(
        name="enriched",
        key=str(more.pop("key", "owner")),
        time="ts",
        window=Tumbling("1h"),
        metrics={"n": Count()},
        lookups=list(lookups),
        **more,  # type: ignore[arg-type]
    )


def campaigns(path: Path, rows: list[tuple[int | None, str | None, float]]) -> Path:
    ids, owners, budgets = zip(*rows, strict=True) if rows else ((), (), ())
    pq.write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int32()),
                "owner": pa.array(owners, pa.string()),
                "budget": pa.array(budgets, pa.float64()),
            }
        ),
        path,
    )
    return path


def sqlite_table(path: Path, rows: list[tuple[int, str]]) -> str:
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS campaigns")
        db.execute("CREATE TABLE campaigns (id INTEGER, owner TEXT)")
        db.executemany("INSERT INTO campaigns VALUES (?, ?)", rows)
    return f"sqlite:///{path}"


# -- the spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"location": "", "on": "cid"}, "needs a table's location"),
        ({"location": "c.parquet", "on": ("a", "b", "c")}, "name one column"),
        ({"location": "c.parquet", "on": "cid", "how": "outer"}, "'left' or 'inner'"),
        ({"location": "c.parquet", "on": "cid", "refresh": "often"}, "'batch'"),
        ({"location": "c.parquet", "on": "cid", "refresh": "0s"}, "or a duration"),
        ({"location": "sqlite:///x.db", "on": "cid"}, "needs table="),
        ({"location": "sqlite:///x.db", "on": "cid", "table": "a; DROP"}, "a SQL table's name"),
        ({"location": "c.parquet", "on": "cid", "table": "t"}, "read whole"),
        ({"location": "c.parquet", "on": "cid", "columns": "owner"}, "is a list"),
        ({"location": "c.parquet", "on": "cid", "columns": []}, "at least one"),
        ({"location": "c.parquet", "on": "cid", "parts": 0}, "a positive number"),
        ({"location": "c.parquet", "on": "cid", "parts": True}, "how many parts"),
    ],
)
def test_a_lookup_that_cannot_be_is_named(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(StreamValueError, match="lookup") as refused:
        Lookup(**kwargs)  # type: ignore[arg-type]
    assert says in str(refused.value)


def test_an_aggregation_takes_lookups_and_refuses_other_things() -> None:
    one = Lookup("c.parquet", on="cid")
    assert spec(one).lookups == (one,) and spec(one).derives
    with pytest.raises(StreamValueError, match=r"lookups must be a list of Lookup"):
        Aggregation(name="a", key="k", window=Tumbling("1h"), metrics={"n": Count()},
                    lookups="c.parquet")  # type: ignore[arg-type]  # fmt: skip
    # a password in a SQL URL is never in a label (errors, status)
    secret = Lookup("postgresql://rb:s3cret@db:5432/app", on="cid", table="campaigns")
    assert "s3cret" not in secret.label and secret.label == "postgresql://db:5432/app#campaigns"


# -- reading a table --------------------------------------------------------------------


def test_a_parquet_file_or_directory_is_read_keyed_and_sorted(tmp_path: Path) -> None:
    campaigns(tmp_path / "c.parquet", [(3, "c", 3.0), (1, "a", 1.0), (None, "x", 0.0)])
    got = read_table(Lookup(str(tmp_path / "c.parquet"), on=("cid", "id"), columns=["owner"]))
    assert got.to_pydict() == {"id": [1, 3], "owner": ["a", "c"]}  # NULL key dropped
    assert got.schema.field("id").type == pa.int32()
    folder = tmp_path / "dir"
    folder.mkdir()
    campaigns(folder / "part-0.parquet", [(1, "a", 1.0)])
    campaigns(folder / "part-1.parquet", [(2, "b", 2.0)])
    (folder / "_SUCCESS").write_text("")
    renamed = Lookup(f"file://{folder}", on="id", columns={"who": "owner"})
    assert read_table(renamed).to_pydict() == {"id": [1, 2], "who": ["a", "b"]}


@pytest.mark.s3
def test_a_parquet_directory_in_a_bucket_is_read(s3_url: str, tmp_path: Path) -> None:
    store = open_store(f"{s3_url}/campaigns")
    local = campaigns(tmp_path / "c.parquet", [(2, "b", 2.0), (1, "a", 1.0)])
    store.put("part-0.parquet", local.read_bytes())
    got = read_table(Lookup(f"{s3_url}/campaigns", on="id"))
    assert got.to_pydict() == {"id": [1, 2], "owner": ["a", "b"], "budget": [1.0, 2.0]}
    one = read_table(Lookup(f"{s3_url}/campaigns/part-0.parquet", on="id"))
    assert one.to_pydict() == got.to_pydict()


def test_sqlite_and_its_types(tmp_path: Path) -> None:
    url = sqlite_table(tmp_path / "c.db", [(2, "b"), (1, "a")])
    got = read_table(Lookup(url, on="id", table="campaigns"))
    assert got.to_pydict() == {"id": [1, 2], "owner": ["a", "b"]}
    assert got.schema == pa.schema([("id", pa.int64()), ("owner", pa.string())])
    empty = sqlite_table(tmp_path / "e.db", [])
    assert read_table(Lookup(empty, on="id", table="campaigns")).num_rows == 0


def test_postgresql(postgres_db: str) -> None:
    with psycopg.connect(postgres_db, autocommit=True) as pg:
        pg.execute("CREATE TABLE campaigns (id BIGINT, owner TEXT, budget NUMERIC(10,2))")
        pg.execute("INSERT INTO campaigns VALUES (7, 'g', 12.50), (5, 'e', NULL)")
    got = read_table(Lookup(postgres_db, on="id", table="campaigns"))
    assert got.column("id").to_pylist() == [5, 7]
    assert got.column("owner").to_pylist() == ["e", "g"]
    assert str(got.column("budget")[1].as_py()) == "12.50"


def test_what_is_wrong_with_a_table_is_named(tmp_path: Path) -> None:
    path = campaigns(tmp_path / "c.parquet", [(1, "a", 1.0), (1, "b", 2.0), (2, "c", 0.0)])
    cases = [
        (Lookup(str(path), on="id"), "1 key(s) of 'id' have more than one row (e.g. [1])"),
        (Lookup(str(path), on="cid"), "no column 'cid' to join on (it has id, owner, budget)"),
        (Lookup(str(path), on="id", columns=["nope"]), "no column(s) ['nope']"),
        (Lookup(str(tmp_path / "none.parquet"), on="id"), "no such file or directory"),
        (Lookup(f"sqlite:///{tmp_path / 'none.db'}", on="id", table="t"), "no SQLite database"),
        (Lookup(sqlite_table(tmp_path / "c.db", []), on="id", table="other"), "no such table"),
        (
            Lookup("postgresql://rb:s3cret@127.0.0.1:1/db", on="id", table="t"),
            "cannot read the table",
        ),
    ]
    for lookup, says in cases:
        with pytest.raises(LookupTableError) as refused:
            read_table(lookup)
        assert says in str(refused.value), str(refused.value)
        assert "s3cret" not in str(refused.value)
    listy = tmp_path / "l.parquet"
    pq.write_table(pa.table({"id": [1], "tags": [["a"]]}), listy)
    with pytest.raises(LookupTableError, match=r"'tags' is list<.*leave it out with columns="):
        read_table(Lookup(str(listy), on="id"))


# -- snapshots --------------------------------------------------------------------------


def test_snapshots_follow_refresh_and_are_written_once_per_content(tmp_path: Path) -> None:
    path = campaigns(tmp_path / "c.parquet", [(1, "a", 1.0)])
    every = Lookup(str(path), on="id")
    slow = Lookup(str(path), on="id", columns=["owner"], refresh="5m")
    store = open_store(f"memory://snapshots-{tmp_path.name}")
    first = plan_snapshots([every, slow], None, store, now_ms=0)
    assert len({s.id for s in first}) == 2 and [s.at_ms for s in first] == [0, 0]
    assert len(store.list(LOOKUPS)) == 2
    # the table unchanged: read again for `every`, same content, no new object
    again = plan_snapshots([every, slow], first, store, now_ms=1000)
    assert again == [Snapshot(first[0].id, 1000), first[1]] and len(store.list(LOOKUPS)) == 2
    campaigns(path, [(1, "z", 1.0)])
    changed = plan_snapshots([every, slow], again, store, now_ms=2000)
    assert changed[0].id != first[0].id and changed[1] == first[1]  # `slow`: not yet
    later = plan_snapshots([every, slow], changed, store, now_ms=300_000)
    assert later[1].id != first[1].id
    (new,) = tables(f"memory://snapshots-{tmp_path.name}", [later[1].id])
    assert new.to_pydict() == {"id": [1], "owner": ["z"]}
    assert prune_snapshots(store, {s.id for s in later}) == 2
    assert {i.key for i in store.list(LOOKUPS)} == {f"{LOOKUPS}{s.id}.arrow" for s in later}


def test_a_table_over_the_limit_is_held_in_parts_and_joins_as_the_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot in parts (riverbed.stream.lookupparts): its id says how many, each
    part an object of its own written once per content; a task reads only the parts
    its events' keys need; the join equals the whole table's; pruning keeps a kept
    snapshot's parts and removes a dropped one's."""
    from riverbed.stream import lookupparts
    from riverbed.stream.lookups import join
    from riverbed.stream.rescale import partition_of

    rows = [(i, f"owner{i % 7}", float(i)) for i in range(1, 400)]
    path = campaigns(tmp_path / "c.parquet", rows)
    whole, parted = Lookup(str(path), on="id"), Lookup(str(path), on="id", parts=4)
    url = f"memory://parts-{tmp_path.name}"
    store = open_store(url)
    (kept,) = plan_snapshots([parted], None, store, now_ms=0)
    assert kept.id.endswith(".p4") and lookupparts.parted(kept.id) == 4
    assert plan_snapshots([parted], None, store, now_ms=1)[0].id == kept.id  # same content
    # over the size limit (lowered here), a table without parts= is held in parts too:
    # the fewest multiple of the state partitions (3) with parts under the limit
    table = tables(url, plan_snapshots([whole], None, store, now_ms=0)[0].id.split())[0]
    monkeypatch.setattr(lookupparts, "WHOLE_BYTES", table.nbytes // 5)
    (auto,) = plan_snapshots([whole], None, store, now_ms=2, partitions=3)
    assert lookupparts.parted(auto.id) == 6

    (held,) = tables(url, [kept.id])
    assert isinstance(held, lookupparts.Parts) and held.schema == table.schema
    keys = [k for k in range(1, 400) if partition_of(str(k).encode(), 4) == 2][:30]
    events = pa.table({"id": pa.array([*keys, 9999, None], pa.int64())})
    got, found = join(events, whole, held)
    want, want_found = join(events, whole, table)
    assert got.equals(want) and found.equals(want_found)
    assert held.reads == 1  # one partition's keys: one part read
    # a process keeps the newest parts it read up to KEPT_BYTES (here: two parts' worth)
    monkeypatch.setattr(lookupparts, "KEPT_BYTES", 2 * held.part(2).nbytes + 64)
    got, _ = join(pa.table({"id": pa.array(range(400), pa.int64())}), whole, held)
    assert held.reads == 1 + 4 and got.column("owner").null_count == 1  # (id 0: no row)

    def of_part(p: int) -> pa.Table:
        ids = [k for k in range(1, 400) if partition_of(str(k).encode(), 4) == p]
        return pa.table({"id": pa.array(ids, pa.int64())})

    join(of_part(3), whole, held)  # the newest: kept
    assert held.reads == 5
    join(of_part(0), whole, held)  # let go for the later ones
    assert held.reads == 6

    assert prune_snapshots(store, {kept.id}) == 6 + 1 + 1  # auto: 6 parts, its schema; whole
    assert {i.key for i in store.list(LOOKUPS)} == {
        f"{LOOKUPS}{kept.id}/{name}.arrow" for name in ("0", "1", "2", "3", "schema")
    }


def test_holding_a_table_in_parts_is_no_change_of_the_aggregation() -> None:
    from riverbed.stream import Aggregation, Count, Tumbling
    from riverbed.stream.changes import shape

    def spec(parts: int | None) -> Aggregation:
        return Aggregation(name="a", key="owner", time="ts", window=Tumbling("1h"),
                           lookups=[Lookup("c.parquet", on="id", parts=parts)],
                           metrics={"n": Count()})  # fmt: skip

    assert shape(spec(None)) == shape(spec(8)) == shape(spec(1))


def test_a_table_that_breaks_keeps_the_version_before_and_a_first_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = campaigns(tmp_path / "c.parquet", [(1, "a", 1.0)])
    lookup = Lookup(str(path), on="id")
    store = open_store(f"memory://broken-{tmp_path.name}")
    first = plan_snapshots([lookup], None, store, now_ms=0)
    schemas = [tables(f"memory://broken-{tmp_path.name}", [first[0].id])[0].schema]
    campaigns(path, [(1, "a", 1.0), (1, "b", 1.0)])  # a key twice
    assert plan_snapshots([lookup], first, store, now_ms=1, schemas=schemas) == first
    assert (
        "more than one row" in caplog.text and "joining with the version read at 0" in caplog.text
    )
    pq.write_table(pa.table({"id": [1], "owner": ["a"]}), path)  # a column gone
    assert plan_snapshots([lookup], first, store, now_ms=2, schemas=schemas) == first
    assert "the table's columns changed since the stream started" in caplog.text
    path.unlink()
    with pytest.raises(LookupTableError, match="no such file"):
        plan_snapshots([lookup], None, store, now_ms=3)


# -- the join ---------------------------------------------------------------------------


def test_compiling_checks_the_key_types_and_the_names(tmp_path: Path) -> None:
    path = campaigns(tmp_path / "c.parquet", [(1, "a", 1.0)])
    table = read_table(Lookup(str(path), on="id"))
    types = input_types(EVENTS.append(pa.field("owner", pa.string())))
    cases = [
        (Lookup(str(path), on=("nope", "id")), "on='nope' is not a field of the events"),
        (Lookup(str(path), on=("owner", "id")), "the events' 'owner' is string but the table's"),
        (Lookup(str(path), on=("cid", "id")), "column 'owner' is already a field of the events"),
    ]
    for lookup, says in cases:
        with pytest.raises(ExpressionError) as refused:
            compile_for(spec(lookup, key="cid"), types, [table.schema])
        assert says in str(refused.value), str(refused.value)
    two = [Lookup(str(path), on=("cid", "id")), Lookup(str(path), on=("cid", "id"))]
    with pytest.raises(ExpressionError, match="already another lookup's"):
        compile_for(spec(*two), input_types(EVENTS), [table.schema, table.schema])
    with pytest.raises(ExpressionError, match=r"no column .nope.; the events have cid, ts, owner"):
        compile_for(spec(two[0], where="nope > 1"), input_types(EVENTS), [table.schema])


def test_join_keeps_rows_in_order_and_matches_any_integer_width() -> None:
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "owner": ["a", "b"]})
    events = pa.table({"cid": pa.array([2, None, 3, 1, 2], pa.int32())})
    lookup = Lookup("t.parquet", on=("cid", "id"))
    joined, found = join(events, lookup, table)
    assert joined.column("owner").to_pylist() == ["b", None, None, "a", "b"]
    assert found.to_pylist() == [True, False, False, True, True]
    text = pa.table({"k": pa.array(["x", "y", "x"]).dictionary_encode()})
    by_text, _ = join(text, Lookup("t.parquet", on="k"), pa.table({"k": ["x"], "v": [9]}))
    assert by_text.column("v").to_pylist() == [9, None, 9]


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.integers(-3, 6)), min_size=0, max_size=40),
    table_keys=st.sets(st.integers(-3, 6), max_size=8),
    how=st.sampled_from(["left", "inner"]),
    threshold=st.integers(0, 60),
)
def test_a_lookup_equals_pandas_merge(
    keys: list[int | None], table_keys: set[int], how: str, threshold: int
) -> None:
    """The derivation's join, then a derived column and a where over the table's
    column, equals pandas: merge (how), compute, filter; unmatched = no row found."""
    table = pa.table(
        {
            "id": pa.array(sorted(table_keys), pa.int64()),
            "budget": pa.array([k * 10 if k % 3 else None for k in sorted(table_keys)], pa.int64()),
        }
    )
    lookup = Lookup("t.parquet", on=("cid", "id"), how=how)  # type: ignore[arg-type]
    aggregation = spec(
        lookup, key="cid", columns={"double": "budget * 2"}, where=f"budget >= {threshold}"
    )
    n = len(keys)
    events = pa.table(
        {
            "cid": pa.array(keys, pa.int64()),
            "ts": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            "_error": pa.nulls(n, pa.string()),
        }
    )
    derived = compile_for(aggregation, input_types(events.schema), [table.schema])
    assert derived is not None
    got, why, kept, unmatched = derived.apply(events, [table])
    assert why.null_count == n
    frame = pd.DataFrame({"cid": keys, "row": range(n)}).astype({"cid": "Int64"})
    right = table.to_pandas().astype({"id": "Int64", "budget": "Int64"})
    merged = frame.merge(right, left_on="cid", right_on="id", how=how)
    merged = merged[merged["budget"] >= threshold]  # NULL budget: dropped, as in SQL
    rows = got.to_pandas()
    chosen = rows[kept.to_numpy(zero_copy_only=False)]
    assert sorted(chosen.index) == sorted(merged["row"])
    assert list(chosen["double"]) == [int(b) * 2 for b in merged.sort_values("row")["budget"]]
    missing = [k is None or k not in table_keys for k in keys]
    assert unmatched is not None and unmatched.to_pylist() == missing


# -- a topic as the table ---------------------------------------------------------------


def test_a_topic_is_a_table_of_the_newest_value_per_key(tmp_path: Path) -> None:
    """A compacted topic's reading: the newest value per key wins, a record without a
    value deletes its key; without a location the aggregation's log is read."""
    url = f"file://{tmp_path / 'log'}"
    log = riverbed.log.open(url)
    log.create_topic("owners", 2)
    send = log.producer("owners").send
    send({"id": 1, "owner": "a"}, key="1")
    send({"id": 2, "owner": "b"}, key="2")
    send({"id": 1, "owner": "a2"}, key="1")  # newer: wins
    send({"id": 3, "owner": "c"}, key="3")
    send(None, key="3")  # a tombstone
    log.close()
    lookup = Lookup(topic="owners", on=("cid", "id"))
    got = read_table(lookup, log_url=url)
    assert got.to_pydict() == {"id": [1, 2], "owner": ["a2", "b"]}
    assert read_table(Lookup(url, topic="owners", on="id")).num_rows == 2
    with pytest.raises(LookupTableError, match="topic nope: no such topic in the log"):
        read_table(Lookup(topic="nope", on="id"), log_url=url)
    with pytest.raises(LookupTableError, match="no log to read it from"):
        read_table(lookup)
    with pytest.raises(StreamValueError, match="not a SQL database"):
        Lookup("sqlite:///x.db", topic="owners", on="id")


@pytest.mark.kafka
def test_a_kafka_topic_is_a_table(kafka_server: KafkaServer, kafka_topic: str) -> None:
    from confluent_kafka import Producer

    kafka_server.create_topic(kafka_topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap, "acks": "all"})
    for key, value in [("7", {"owner": "x"}), ("8", {"owner": "y"}), ("7", {"owner": "z"})]:
        producer.produce(kafka_topic, key=key, value=json.dumps(value))
    producer.produce(kafka_topic, key="8", value=None)  # Kafka's tombstone
    assert producer.flush(60) == 0
    url = f"kafka://{kafka_server.bootstrap}?serde=json"
    got = read_table(Lookup(url, topic=kafka_topic, on="id"))  # the key: the record's
    assert got.to_pydict() == {"id": ["7"], "owner": ["z"]}


@pytest.mark.parametrize("small_text", [0, 250_000])
def test_text_keys_join_the_same_through_either_index(
    small_text: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text keys of small tables go through Arrow's index_in, of big ones through a
    pandas index built once (benchmarks/lookups.py): both give the same rows."""
    from riverbed.stream import lookupindex

    monkeypatch.setattr(lookupindex.KeyIndex, "SMALL_TEXT", small_text)
    monkeypatch.setattr(lookupindex, "_INDEXES", {})
    table = pa.table({"k": ["b", "a", "é", ""], "v": [2, 1, 3, 0]})
    events = pa.table({"k": pa.array(["a", None, "é", "zz", "", "b"])})
    joined, found = join(events, Lookup("t.parquet", on="k"), table)
    assert joined.column("v").to_pylist() == [1, None, 3, None, 0, 2]
    assert found.to_pylist() == [True, False, True, False, True, True]


def test_a_key_index_probed_by_many_threads_at_once_answers_each() -> None:
    """A lookup table's key index, new, probed by four tasks' threads at once: each
    gets every row (pandas fills an index's hash table on first use; threads that first
    use it together saw it half-filled and failed — 163 of 200 tries before)."""
    import threading

    import numpy as np

    from riverbed.stream.lookupindex import KeyIndex as _KeyIndex

    probe = pa.array(np.arange(0, 100_000, 3, dtype=np.int64))
    for _ in range(20):
        index = _KeyIndex(pa.array(np.arange(50_000, dtype=np.int64)))
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda i=index, out=results: out.append(i.positions(probe)))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4
        for found in results:
            assert found.null_count == len(probe) - 16_667  # the keys under 50,000 found
