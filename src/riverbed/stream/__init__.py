"""Stream aggregations on Spark Structured Streaming (in progress: the source)."""

from riverbed.stream.source import RiverbedDataSource, register

__all__ = ["RiverbedDataSource", "register"]
