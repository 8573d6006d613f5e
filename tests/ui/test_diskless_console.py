"""The console over diskless topics: what the log's processes wrote to and read from
the bucket, on the topics page and in /metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import riverbed.log
from riverbed.config import load_config
from riverbed.inspect import Sources
from riverbed.log.diskless import PUBLISH_S, summarize
from riverbed.ui.app import create_app
from riverbed.ui.console import Console


def test_the_summary_adds_up_live_processes_and_leaves_out_quiet_ones() -> None:
    now = 1000.0
    published = [
        {"at": now - 1, "interval_s": 5, "objects": 50, "bytes": 5000, "flush_ms": 500,
         "hits": 3, "misses": 1},
        {"at": now - 2, "interval_s": 10, "objects": 50, "bytes": 15000, "flush_ms": 1500,
         "hits": 0, "misses": 0},
        {"at": now - 4 * PUBLISH_S, "interval_s": 5, "objects": 999, "bytes": 1, "flush_ms": 1,
         "hits": 0, "misses": 99},
    ]  # fmt: skip
    got = summarize(published, now)
    assert got == {
        "processes": 2,
        "objects_per_s": 15.0,  # 50/5 + 50/10
        "bytes_per_object": 200.0,
        "flush_ms": 20.0,
        "cache_hit_ratio": 0.75,
    }
    assert summarize([], now)["bytes_per_object"] is None


def test_topics_page_and_metrics_show_what_diskless_processes_did(
    tmp_path: Path, s3_url: str, etcd_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIVERBED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIVERBED_LOG", s3_url)
    monkeypatch.setenv("RIVERBED_CONTROL", etcd_server.url)
    writer = riverbed.log.open(s3_url, control=etcd_server.url)
    writer.create_topic("clicks", 3)
    producer = writer.producer("clicks")
    for i in range(5):
        producer.send_batch([{"i": i * 10 + j} for j in range(10)])
    assert len(writer.read("clicks", 0, 0, 100)) > 0
    measured = writer.storage.measure_backlog(["clicks"])  # as a log server's maintenance
    assert measured["batches"] > 0
    writer.close()  # says what it did

    sources = Sources(load_config())
    try:
        console = Console(sources, interval=3600)
        console.sample()
        with TestClient(create_app(console, sample=False)) as client:
            metrics = client.get("/metrics").text
            rate = re.search(r"^riverbed_log_objects_per_second (\S+)$", metrics, re.M)
            assert rate is not None and float(rate.group(1)) > 0, metrics[-1500:]
            size = re.search(r"^riverbed_log_bytes_per_object (\S+)$", metrics, re.M)
            assert size is not None and float(size.group(1)) > 0
            assert re.search(r"^riverbed_log_cache_hit_ratio ", metrics, re.M)
            behind = re.search(
                r'^riverbed_log_compaction_backlog_batches\{topic="clicks"\} (\S+)$', metrics, re.M
            )
            assert behind is not None and float(behind.group(1)) == measured["batches"]
            page = client.get("/topics").text
            assert "Diskless topics" in page and "objects/s" in page
            assert f'compaction backlog <span class="backlog">{measured["batches"]}</span>' in page
            assert client.get("/api/topics").json()[0]["records"] == 50
    finally:
        sources.close()
