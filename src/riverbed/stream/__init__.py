"""Stream aggregations on Spark Structured Streaming, exactly-once into versioned state.

See docs/stream.md. The pieces::

    from riverbed.stream import Aggregation, Tumbling, Distinct, Count, start, read_results

``read_live`` answers from the state store as of a batch instead of the result table.

Names load on first use (PEP 562): Spark imports ``riverbed.spark.source`` in a fresh
Python process for every streaming query it starts, and that should not pay for pandas
and the engine.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from riverbed.spark.source import RiverbedDataSource, register
    from riverbed.stream.aggregation import Aggregation
    from riverbed.stream.dataframe import read_live, read_results, start
    from riverbed.stream.doors import (
        Chained,
        Delta,
        Frame,
        Iceberg,
        Joined,
        Kafka,
        ResultsTopic,
        ResultTable,
        Sink,
        Source,
        SqlTable,
        Topic,
    )
    from riverbed.stream.joinquery import read_joined, start_join
    from riverbed.stream.joins import Join, Lookup
    from riverbed.stream.metrics import (
        Aggregator,
        ArgMax,
        ArgMin,
        Count,
        Custom,
        Distinct,
        First,
        Last,
        Max,
        Mean,
        Min,
        Quantile,
        Sum,
        TopK,
    )
    from riverbed.stream.selects import Select
    from riverbed.windows import Hopping, Session, Sliding, Tumbling

_WHERE = {
    "Chained": "doors",
    "Frame": "doors",
    "Joined": "doors",
    "Kafka": "doors",
    "ResultTable": "doors",
    "ResultsTopic": "doors",
    "Sink": "doors",
    "Source": "doors",
    "SqlTable": "doors",
    "Topic": "doors",
    "Aggregator": "metrics",
    "ArgMax": "metrics",
    "ArgMin": "metrics",
    "First": "metrics",
    "Last": "metrics",
    "Join": "joins",
    "Lookup": "joins",
    "Select": "selects",
    "Aggregation": "aggregation",
    "Count": "metrics",
    "Custom": "metrics",
    "Delta": "doors",
    "Iceberg": "doors",
    "Distinct": "metrics",
    "Max": "metrics",
    "Mean": "metrics",
    "Min": "metrics",
    "Quantile": "metrics",
    "Sum": "metrics",
    "TopK": "metrics",
    "read_live": "dataframe",
    "read_results": "dataframe",
    "start": "dataframe",
    "read_joined": "joinquery",
    "start_join": "joinquery",
    "RiverbedDataSource": "riverbed.spark.source",
    "register": "riverbed.spark.source",
    "Hopping": "riverbed.windows",
    "Session": "riverbed.windows",
    "Sliding": "riverbed.windows",
    "Tumbling": "riverbed.windows",
}

__all__ = [
    "Aggregation",
    "Aggregator",
    "ArgMax",
    "ArgMin",
    "Chained",
    "Count",
    "Custom",
    "Delta",
    "Distinct",
    "First",
    "Frame",
    "Hopping",
    "Iceberg",
    "Join",
    "Joined",
    "Kafka",
    "Last",
    "Lookup",
    "Max",
    "Mean",
    "Min",
    "Quantile",
    "ResultTable",
    "ResultsTopic",
    "RiverbedDataSource",
    "Select",
    "Session",
    "Sink",
    "Sliding",
    "Source",
    "SqlTable",
    "Sum",
    "TopK",
    "Topic",
    "Tumbling",
    "read_joined",
    "read_live",
    "read_results",
    "register",
    "start",
    "start_join",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'riverbed.stream' has no attribute {name!r}")
    where = _WHERE[name]
    module = where if "." in where else f"riverbed.stream.{where}"
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
