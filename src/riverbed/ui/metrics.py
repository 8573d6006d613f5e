"""Prometheus text exposition (format 0.0.4) of what the console knows.

Pure: :class:`Family` values in, text out. Ids go in labels, never in metric names
(``riverbed_group_lag{topic="clicks",group="g",partition="3"}``), so one scrape config
and one dashboard cover every topic, group, stream and job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass
class Family:
    """One metric: its name, help, type and samples (labels → value)."""

    name: str
    help: str
    type: str = "gauge"
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric name {self.name!r} is not a Prometheus name")
        if self.type not in ("gauge", "counter"):
            raise ValueError(f"metric type {self.type!r}: gauge or counter")

    def add(self, value: float, **labels: object) -> None:
        self.samples.append(({k: str(v) for k, v in labels.items()}, float(value)))


def escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def exposition(families: Iterable[Family]) -> str:
    lines: list[str] = []
    for fam in families:
        help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {fam.name} {help_text}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            for key in labels:
                if not _LABEL.match(key) or key.startswith("__"):
                    raise ValueError(f"label name {key!r} of {fam.name} is not a Prometheus label")
            text = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
            head = f"{fam.name}{{{text}}}" if text else fam.name
            lines.append(f"{head} {_number(value)}")
    return "\n".join(lines) + "\n"


def families(sample: Mapping[str, Any]) -> list[Family]:
    """The console's sample (:meth:`riverbed.ui.console.Console.sample`) as metrics."""
    end = Family("riverbed_topic_end_offset", "Next offset of a topic partition", "counter")
    start = Family("riverbed_topic_start_offset", "First retained offset of a topic partition")
    size = Family("riverbed_topic_bytes", "Bytes a topic partition takes in storage")
    for t in sample.get("topics", []):
        for p in t["partitions"]:
            end.add(p["end"], topic=t["name"], partition=p["partition"])
            start.add(p["start"], topic=t["name"], partition=p["partition"])
            if p["bytes"] is not None:
                size.add(p["bytes"], topic=t["name"], partition=p["partition"])
    lag = Family("riverbed_group_lag", "Records between a group's committed offset and the end")
    members = Family("riverbed_group_members", "Live members of a consumer group")
    generation = Family("riverbed_group_generation", "A consumer group's assignment generation")
    for g in sample.get("groups", []):
        members.add(len(g["members"]), group=g["group"])
        generation.add(g["generation"], group=g["group"])
        for p in g["partitions"]:
            lag.add(p["lag"], group=g["group"], topic=p["topic"], partition=p["partition"])
    batches = Family("riverbed_stream_batches", "Micro-batches a stream finished", "counter")
    records = Family("riverbed_stream_input_records", "Records a stream took in", "counter")
    late = Family("riverbed_stream_late_records", "Records dropped as late", "counter")
    malformed = Family("riverbed_stream_malformed_records", "Records set aside", "counter")
    duration = Family("riverbed_stream_batch_duration_seconds", "The newest batch's time, by phase")
    gap = Family("riverbed_stream_watermark_gap_seconds", "Wall clock minus the watermark")
    slag = Family("riverbed_stream_lag", "Records of a stream's topic not processed yet")
    active = Family("riverbed_stream_driver_active", "1 when an active driver holds the lease")
    standbys = Family("riverbed_stream_standbys", "Drivers standing by")
    state = Family("riverbed_state_bytes", "Bytes of a stream's local state databases")
    for s in sample.get("streams", []):
        name = s["name"]
        for fam, field_name in (
            (batches, "batches"),
            (records, "input_records"),
            (late, "late"),
            (malformed, "malformed"),
            (state, "state_bytes"),
        ):
            if s.get(field_name) is not None:
                fam.add(s[field_name], stream=name)
        for phase, ms in ((s.get("last_batch") or {}).get("ms") or {}).items():
            duration.add(ms / 1000, stream=name, phase=phase)
        if s.get("watermark_gap_s") is not None:
            gap.add(s["watermark_gap_s"], stream=name)
        for partition, n in (s.get("lag") or {}).items():
            slag.add(n, stream=name, partition=partition)
        active.add(1 if s["driver"]["active"] else 0, stream=name)
        standbys.add(s["driver"]["standbys"], stream=name)
    chunks = Family("riverbed_job_chunks", "Job chunks by state")
    for st, n in (sample.get("jobs") or {}).get("counts", {}).items():
        chunks.add(n, state=st)
    disk = Family("riverbed_disk_bytes", "Bytes on disk by what riverbed keeps there")
    for what, n in (sample.get("disk") or {}).items():
        if n is not None:
            disk.add(n, what=what)
    objects = sample.get("objects") or {}
    log_objects = Family("riverbed_log_objects_per_second", "Diskless topics: objects written")
    per_object = Family("riverbed_log_bytes_per_object", "Diskless topics: mean object size")
    flush = Family("riverbed_log_flush_seconds", "Diskless topics: a flush's mean time")
    hits = Family("riverbed_log_cache_hit_ratio", "Diskless topics: read cache hits / reads")
    for fam, key, scale in (
        (log_objects, "objects_per_s", 1.0),
        (per_object, "bytes_per_object", 1.0),
        (flush, "flush_ms", 0.001),
        (hits, "cache_hit_ratio", 1.0),
    ):
        if objects.get(key) is not None:
            fam.add(objects[key] * scale)
    backlog = objects.get("compaction_backlog") or {}
    behind = Family(
        "riverbed_log_compaction_backlog_batches",
        "Diskless topics: batches still in shared flush objects after the last compaction pass",
    )
    behind_bytes = Family(
        "riverbed_log_compaction_backlog_bytes",
        "Diskless topics: bytes still in shared flush objects after the last compaction pass",
    )
    for topic, n in sorted((backlog.get("topics") or {}).items()):
        behind.add(n, topic=topic)
    if backlog:
        behind_bytes.add(backlog["bytes"])
    took = Family("riverbed_ui_sample_seconds", "How long the console's last sample took")
    took.add(sample.get("took_s", 0))
    return [end, start, size, lag, members, generation, batches, records, late, malformed,
            duration, gap, slag, active, standbys, state, chunks, disk, log_objects, per_object,
            flush, hits, behind, behind_bytes, took]  # fmt: skip
