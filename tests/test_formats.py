"""Stored formats carry their version (riverbed/formats.py): what this riverbed writes
says so, and data a newer riverbed wrote is refused in one line naming both versions —
before anything is read past it or written — in every place a format is kept."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import riverbed.log
from riverbed import __version__
from riverbed.checksum import crc32
from riverbed.errors import NewerFormatError
from riverbed.formats import CURRENT
from riverbed.state.changelog import Changelog
from riverbed.state.errors import CorruptStateError
from riverbed.state.objects import ObjectStorage
from riverbed.storage import open_store
from riverbed.stream import Aggregation, Count, Tumbling, layout, specrecord
from riverbed.stream.results import empty_rows, read_table, write_output

SPEC = Aggregation(name="agg", key="k", time="ts", window=Tumbling("1h"), metrics={"n": Count()})


def _newer(kind: str) -> str:
    return re.escape(
        f"{kind} format is version {CURRENT[kind] + 1}, newer than riverbed {__version__} "
        f"reads (version {CURRENT[kind]})"
    )


def test_a_checkpoint_records_its_format_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    specrecord.start(checkpoint, SPEC)
    marker = checkpoint / layout.FORMAT
    assert json.loads(marker.read_text())["format"] == CURRENT["checkpoint"]
    newer = tmp_path / "newer"
    (newer / "riverbed").mkdir(parents=True)
    (newer / layout.FORMAT).write_text(json.dumps({"format": CURRENT["checkpoint"] + 1}))
    before = sorted(p.name for p in newer.rglob("*"))
    with pytest.raises(NewerFormatError, match=_newer("checkpoint")) as raised:
        specrecord.start(newer, SPEC)
    assert str(newer) in str(raised.value) and "\n" not in str(raised.value)
    assert sorted(p.name for p in newer.rglob("*")) == before  # nothing written


def test_a_newer_spec_shape_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    digest, _ = specrecord.start(checkpoint, SPEC)
    layout.checkpoint_store(checkpoint)  # the shape's file, rewritten by "a newer riverbed"
    shape_file = checkpoint / layout.spec_key(digest)
    shape = json.loads(shape_file.read_text())
    shape_file.write_text(json.dumps({**shape, "version": CURRENT["spec shape"] + 1}))
    from riverbed.stream.batchlog import BatchRecord, open_batches

    open_batches(checkpoint).put(0, BatchRecord(spec=digest, slices={"0": [0, 1]}))
    with pytest.raises(NewerFormatError, match=_newer("spec shape")):
        specrecord.plan_start(checkpoint, SPEC)


def test_result_files_carry_their_format_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    write_output(output, SPEC, 0, empty_rows(SPEC))
    written = next((tmp_path / "out").rglob("*.parquet"))
    meta = pq.read_schema(written).metadata
    assert meta[b"riverbed.format"] == str(CURRENT["result table"]).encode()
    assert read_table(output) is not None
    table = pq.read_table(written)
    newer = {**meta, b"riverbed.format": str(CURRENT["result table"] + 1).encode()}
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(newer), sink)
    (tmp_path / "out" / "batch_id=1").mkdir()
    (tmp_path / "out" / "batch_id=1" / "part-00000.parquet").write_bytes(sink.getvalue())
    with pytest.raises(NewerFormatError, match=_newer("result table")) as raised:
        read_table(output)
    assert "batch_id=1/part-00000.parquet" in str(raised.value)


def test_a_newer_state_changelog_is_refused_not_taken_for_damage() -> None:
    raw = Changelog(3, 2, 0, [("put", b"k", b"v")]).encode()
    assert Changelog.decode(raw).version == 3
    newer = raw[:4] + bytes([CURRENT["state changelog"] + 1]) + raw[5:]
    with pytest.raises(NewerFormatError, match=_newer("state changelog")):
        Changelog.decode(newer, "ns/0/changelog/3")


def test_a_changelog_is_compressed_and_one_written_before_is_still_read() -> None:
    """Format 3 compresses the body (zstd); format 2 — what riverbed wrote before — is
    the same header over the plain msgpack body, and still decodes."""
    ops = [("put", f"window|{i % 7}".encode(), b"x" * 40) for i in range(500)]
    new = Changelog(9, 8, 77, ops).encode()
    assert new[4] == CURRENT["state changelog"] == 3
    packed = msgpack.packb([list(op) for op in ops])
    assert len(new) < len(packed) / 5  # repetitive state compresses
    body = b"RBCL\x02" + new[5 : len(b"RBCL") + 1 + 20] + packed
    old = body + crc32(body).to_bytes(4, "big")
    for raw in (new, old):
        back = Changelog.decode(raw)
        assert (back.version, back.base, back.base_tag, back.ops) == (9, 8, 77, ops)
        assert back.tag == int.from_bytes(raw[-4:], "big")  # the file's own tag, kept
    torn = new[:30] + bytes([new[30] ^ 0xFF]) + new[31:]
    with pytest.raises(CorruptStateError, match="checksum"):
        Changelog.decode(torn)


def test_a_newer_snapshot_manifest_is_refused_and_stops_the_sweep(tmp_path: Path) -> None:
    storage = ObjectStorage(open_store(f"file://{tmp_path / 'state'}"))
    local = tmp_path / "snap"
    local.mkdir()
    (local / "CURRENT").write_text("x")
    storage.upload_dir(local, "ns/0/snapshot/5-1")
    manifest_key = "ns/0/snapshot/5-1/MANIFEST.riverbed.json"
    manifest = json.loads(storage.read(manifest_key))
    assert manifest["format"] == CURRENT["state snapshot"]
    newer = {**manifest, "format": CURRENT["state snapshot"] + 1}
    storage.store.put(manifest_key, json.dumps(newer).encode())
    with pytest.raises(NewerFormatError, match=_newer("state snapshot")):
        storage.download_dir("ns/0/snapshot/5-1", tmp_path / "back")
    # its files may be named otherwise than this riverbed knows: none is swept
    with pytest.raises(NewerFormatError):
        storage.sweep("ns/0", older_than=0)
    assert storage.store.list("ns/0/shared/")


def test_a_newer_topic_is_refused(tmp_path: Path) -> None:
    log = riverbed.log.open(tmp_path)
    log.create_topic("t", 1)
    config = json.loads((tmp_path / "t" / "topic.json").read_text())
    # a topic never altered is written as version 1 (the riverbed before alters reads it)
    assert config["format"] == 1 and "epochs" not in config
    log.alter_partitions("t", 2)
    log.close()
    config = json.loads((tmp_path / "t" / "topic.json").read_text())
    assert config["format"] == CURRENT["topic"] == 2
    assert config["epochs"] == [{"partitions": 2, "starts": [0]}]
    config["format"] = CURRENT["topic"] + 1
    (tmp_path / "t" / "topic.json").write_text(json.dumps(config))
    log = riverbed.log.open(tmp_path)
    with pytest.raises(NewerFormatError, match=_newer("topic")):
        log.producer("t").send({"a": 1})
    log.close()


def test_a_newer_savepoint_is_refused(tmp_path: Path) -> None:
    from riverbed.stream import savepoints

    checkpoint = tmp_path / "ck"
    (checkpoint / "riverbed" / "savepoints").mkdir(parents=True)
    (checkpoint / layout.savepoint_key("s")).write_text(
        json.dumps({"name": "s", "format": CURRENT["savepoint"] + 1})
    )
    with pytest.raises(NewerFormatError, match=_newer("savepoint")):
        savepoints.read(checkpoint, "s")


def test_a_newer_jobs_database_is_refused_without_its_password(tmp_path: Path) -> None:
    from riverbed.jobs.schema import Database

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    Database(url).create()
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        conn.execute("UPDATE rb_jobs_meta SET schema_version = ?", (CURRENT["jobs database"] + 1,))
    with pytest.raises(NewerFormatError, match=_newer("jobs database")):
        Database(url).create()
    assert "secret" not in repr(Database("postgresql://rb:secret@db:5432/jobs"))


def test_a_join_records_its_state_format_reads_an_older_one_and_refuses_a_newer(
    tmp_path: Path,
) -> None:
    from riverbed.stream.joinquery import _check_shape
    from riverbed.stream.joins import Join

    join = Join(name="j", left="a", right="b", on="k", window="1m")
    checkpoint = tmp_path / "ck"
    _check_shape(str(checkpoint), join)
    shape_file = checkpoint / layout.JOIN
    recorded = json.loads(shape_file.read_text())
    assert recorded["format"] == CURRENT["join state"] == 2
    # format 1 (no number: before the Arrow segments) is read, the record raised
    shape_file.write_text(json.dumps({k: v for k, v in recorded.items() if k != "format"}))
    _check_shape(str(checkpoint), join)
    assert json.loads(shape_file.read_text()) == recorded
    shape_file.write_text(json.dumps({**recorded, "format": CURRENT["join state"] + 1}))
    before = shape_file.read_text()
    with pytest.raises(NewerFormatError, match=_newer("join state")):
        _check_shape(str(checkpoint), join)
    assert shape_file.read_text() == before


def test_every_format_has_a_positive_version() -> None:
    assert CURRENT and all(isinstance(v, int) and v >= 1 for v in CURRENT.values())
    assert pa is not None
