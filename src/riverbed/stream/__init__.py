"""Stream aggregations on Spark Structured Streaming, exactly-once into versioned state.

See docs/stream.md. The pieces::

    from riverbed.stream import Aggregation, Tumbling, Distinct, Count, start, read_results

``read_live`` answers from the state store as of a batch instead of the result table.
"""

from riverbed.stream.aggregation import Aggregation
from riverbed.stream.metrics import Count, Distinct, Max, Mean, Min, Sum
from riverbed.stream.runner import read_live, read_results, start
from riverbed.stream.source import RiverbedDataSource, register
from riverbed.stream.windows import Hopping, Sliding, Tumbling

__all__ = [
    "Aggregation",
    "Count",
    "Distinct",
    "Hopping",
    "Max",
    "Mean",
    "Min",
    "RiverbedDataSource",
    "Sliding",
    "Sum",
    "Tumbling",
    "read_live",
    "read_results",
    "register",
    "start",
]
