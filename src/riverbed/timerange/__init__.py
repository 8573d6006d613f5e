"""Time-range jobs: long aggregations on Spark in chunks, equal to one pass, resumable.

The engine, beside :mod:`riverbed.stream` and below :mod:`riverbed.jobs`, which runs it
as a job (:mod:`riverbed.jobs.timerange`: ``TimeRangeJob``, the name users import, with
everything here). See docs/timerange.md. A spec file holds ``job = TimeRangeJob(...)``;
``riverbed timerange run SPEC --from … --to …`` computes it chunk by chunk, publishing
each chunk's output together with its progress marker, and resumes after any crash.
"""

from __future__ import annotations

from riverbed.timerange.driver import ChunkRecord, Driver, Event
from riverbed.timerange.errors import (
    BadInputError,
    FencedError,
    MissingInputError,
    RangeError,
    SpecError,
    TimeRangeError,
)
from riverbed.timerange.output import Output, TimeRangeOutput
from riverbed.timerange.plan import Progress, format_time, parse_time
from riverbed.timerange.spec import (
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
    "TimeRangeOutput",
    "TimeRangeSpec",
    "TopicInput",
    "Tumbling",
    "format_time",
    "load_spec",
    "parse_time",
]
