"""Time-range jobs: long aggregations on Spark in chunks, equal to one pass, resumable.

See docs/timerange.md. A spec file holds ``job = TimeRangeJob(...)``; ``riverbed timerange
run SPEC --from … --to …`` computes it chunk by chunk, publishing each chunk's output
together with its progress marker, and resumes after any crash.
"""

from __future__ import annotations

from riverbed.jobs.timerange.driver import ChunkRecord, Driver, Event
from riverbed.jobs.timerange.errors import (
    BadInputError,
    FencedError,
    MissingInputError,
    RangeError,
    SpecError,
    TimeRangeError,
)
from riverbed.jobs.timerange.job import TimeRangeJob
from riverbed.jobs.timerange.output import Output
from riverbed.jobs.timerange.plan import Progress, format_time, parse_time
from riverbed.jobs.timerange.spec import (
    Cumulative,
    Custom,
    FunctionInput,
    KafkaInput,
    LoadedSpec,
    ParquetInput,
    Rolling,
    Rows,
    TimeRangeSpec,
    TopicInput,
    Tumbling,
    load_spec,
)

__all__ = [
    "BadInputError",
    "ChunkRecord",
    "Cumulative",
    "Custom",
    "Driver",
    "Event",
    "FencedError",
    "FunctionInput",
    "KafkaInput",
    "LoadedSpec",
    "MissingInputError",
    "Output",
    "ParquetInput",
    "Progress",
    "RangeError",
    "Rolling",
    "Rows",
    "SpecError",
    "TimeRangeError",
    "TimeRangeJob",
    "TimeRangeSpec",
    "TopicInput",
    "Tumbling",
    "format_time",
    "load_spec",
    "parse_time",
]
