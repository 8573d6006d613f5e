"""What riverbed's own trigger loop runs for a log-native aggregation: a
:class:`Pipeline` — its head (an aggregation over a topic, or a join over two) and the
aggregations its driver runs after it, each over the rows of the one before
(:mod:`riverbed.stream.chain`). :func:`riverbed.stream.dataframe.start` builds one and
starts the loop that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from riverbed.stream.nativeconfig import DirectConfig


@dataclass(frozen=True)
class Pipeline:
    """``head``: a topic aggregation's :class:`DirectConfig` or a join's ``JoinConfig``;
    ``after``: the aggregations over its rows, in order."""

    head: Any
    after: tuple[DirectConfig, ...] = ()

    @property
    def last(self) -> DirectConfig:
        """The aggregation whose rows the pipeline ends with (the query's)."""
        if self.after:
            return self.after[-1]
        if not isinstance(self.head, DirectConfig):
            raise TypeError("a join's pipeline ends with an aggregation")  # never built
        return self.head

    @property
    def output_schema(self) -> pa.Schema:
        """The columns of the rows it ends with: its last aggregation's result rows."""
        from riverbed.stream.results import output_arrow_schema

        return output_arrow_schema(self.last.engine.spec)


__all__ = ["Pipeline"]
