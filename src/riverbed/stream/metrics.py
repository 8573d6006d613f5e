"""Metrics: frozen config objects plus the vectorized partial/merge/result logic.

A metric turns a group of events into a *partial* (per batch), merges partials into
the stored value, and reports a result. Partials and stored values are plain
msgpack-able data (numbers or sketch bytes), so they cross Spark and the state store.

Every metric takes ``where`` (Spark SQL, as the aggregation's own): it then counts only
the events of its window and key that the condition is true for — SQL's
``COUNT(*) FILTER (WHERE …)``. The condition is evaluated with the spec's derived
columns (:mod:`riverbed.stream.derive`, as the column :func:`where_column` names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from riverbed.state.sketches import HLL, AdaptiveDistinct, ExactIds
from riverbed.stream.errors import StreamValueError


@dataclass(frozen=True)
class Count:
    where: str | None = None  # Spark SQL: count only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        return n

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, value: Any) -> dict[str, Any]:
        return {"": int(value)}


@dataclass(frozen=True)
class Sum:
    column: str
    where: str | None = None  # Spark SQL: only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        return float(np.nansum(column))

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, value: Any) -> dict[str, Any]:
        return {"": value}


@dataclass(frozen=True)
class Min:
    column: str
    where: str | None = None  # Spark SQL: only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        return _or_none(np.nanmin, column)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)

    def result(self, value: Any) -> dict[str, Any]:
        return {"": value}


@dataclass(frozen=True)
class Max:
    column: str
    where: str | None = None  # Spark SQL: only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        return _or_none(np.nanmax, column)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)

    def result(self, value: Any) -> dict[str, Any]:
        return {"": value}


@dataclass(frozen=True)
class Mean:
    column: str
    where: str | None = None  # Spark SQL: only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        valid = column[~np.isnan(column)] if column.dtype.kind == "f" else column
        return [float(np.sum(valid)), len(valid)]

    def merge(self, a: Any, b: Any) -> Any:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, value: Any) -> dict[str, Any]:
        return {"": value[0] / value[1] if value[1] else None}


@dataclass(frozen=True)
class Distinct:
    """Distinct count of ``column``: ``exact`` (Roaring bitmap / set), ``hll``
    (DataSketches, ``lg_k``) or ``adaptive`` (exact up to ``threshold`` ids, then HLL).
    Results carry ``<name>_is_exact`` and ``<name>_error`` (relative, ~95 % bound)."""

    column: str
    mode: Literal["exact", "hll", "adaptive"] = "exact"
    lg_k: int = 12
    threshold: int = 10_000
    where: str | None = None  # Spark SQL: only the events it is true for

    def __post_init__(self) -> None:
        if self.mode not in ("exact", "hll", "adaptive"):
            raise StreamValueError(
                f"Distinct mode must be exact, hll or adaptive, not {self.mode!r}"
            )

    def _empty(self) -> ExactIds | HLL | AdaptiveDistinct:
        if self.mode == "exact":
            return ExactIds()
        if self.mode == "hll":
            return HLL(self.lg_k)
        return AdaptiveDistinct(self.threshold, self.lg_k)

    def _load(self, data: bytes) -> ExactIds | HLL | AdaptiveDistinct:
        if self.mode == "exact":
            return ExactIds.from_bytes(data)
        if self.mode == "hll":
            return HLL.from_bytes(data)
        return AdaptiveDistinct.from_bytes(data, self.threshold, self.lg_k)

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        values = column[~_isnull(column)]
        if values.dtype.kind == "f" and np.array_equal(values, np.floor(values)):
            # an integer column with nulls reaches pandas as float64: the ids are still
            # integers, and must land in the same bitmap as the batches without nulls
            values = values.astype(np.int64)
        if self.mode == "exact" and (fast := ExactIds.bytes_of(values)) is not None:
            return fast
        return self._empty().update(values).to_bytes()

    def merge(self, a: Any, b: Any) -> Any:
        left = self._load(a)
        left.merge(self._load(b))  # type: ignore[arg-type]
        return left.to_bytes()

    def result(self, value: Any) -> dict[str, Any]:
        count = self._load(value).count()
        return {"": round(count.value), "_is_exact": count.exact, "_error": count.rel_error}


def _or_none(reduce: Any, column: np.ndarray) -> float | None:
    """``reduce`` of the column's values that are not null; None when none is (numpy's
    nanmin of only NaNs is NaN, which ``min`` then keeps or drops by merge order)."""
    if column.dtype.kind == "f":
        column = column[~np.isnan(column)]
    return float(reduce(column)) if len(column) else None


def _isnull(column: np.ndarray) -> np.ndarray:
    if column.dtype.kind == "f":
        mask: np.ndarray = np.isnan(column)
        return mask
    if column.dtype.kind == "O":
        return np.array([v is None for v in column], dtype=bool)
    return np.zeros(len(column), dtype=bool)


Metric = Count | Sum | Min | Max | Mean | Distinct


def where_column(name: str) -> str:
    """The internal column holding metric ``name``'s ``where`` (true: it counts)."""
    return f"_where_{name}"
