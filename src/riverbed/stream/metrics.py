"""Metrics: frozen config objects plus the vectorized partial/merge/result logic.

(Over 600 lines: the one catalogue of metrics the engine, the shuffle and the state
read — each metric's partial, merge and result together — with the pick metrics'
all-groups step beside the one-group rule a property test holds it to; the picks could
move to a module of their own, with the value helpers both use.)

A metric turns a group of events into a *partial* (per batch), merges partials into
the stored value, and reports a result. Partials and stored values are plain
msgpack-able data (numbers or sketch bytes), so they cross Spark and the state store.

Every metric takes ``where`` (Spark SQL, as the aggregation's own): it then counts only
the events of its window and key that the condition is true for — SQL's
``COUNT(*) FILTER (WHERE …)``. The condition is evaluated with the spec's derived
columns (:mod:`riverbed.stream.derive`, as the column :func:`where_column` names).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import datasketches as ds
import msgpack
import numpy as np

from riverbed.state.sketches import HLL, AdaptiveDistinct, ExactIds
from riverbed.stream.errors import StreamValueError

# a metric's field that is part of a spec's shape (riverbed.stream.changes) only when it
# is not its default: one added later, so that shapes recorded before it stay equal
SHAPE_IF_SET = "riverbed.shape_if_set"


@dataclass(frozen=True)
class Count:
    where: str | None = None  # Spark SQL: count only the events it is true for

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        return n

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, value: Any) -> dict[str, Any]:
        return {"": int(value)}

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "long")]


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

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "double")]


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

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "double")]


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

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "double")]


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

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "double")]


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
        return self.merge_all([a, b])

    def merge_all(self, values: list[Any]) -> Any:
        """Several partials and stored values as one stored value (in any order: a
        union). Exact integer ids that fit 32 bits make one bitmap at once."""
        if self.mode == "exact" and (fast := ExactIds.merged(values)) is not None:
            return fast
        left = self._load(values[0])
        for value in values[1:]:
            left.merge(self._load(value))  # type: ignore[arg-type]
        return left.to_bytes()

    def result(self, value: Any) -> dict[str, Any]:
        count = self._load(value).count()
        return {"": round(count.value), "_is_exact": count.exact, "_error": count.rel_error}

    def group_partials(
        self, column: np.ndarray, rows: np.ndarray, bounds: list[int], counts: np.ndarray | None
    ) -> list[Any] | None:
        """The partials of every group (group ``i``: ``rows[bounds[i]:bounds[i + 1]]``)
        at once, for exact integer ids that fit 32 bits — what :meth:`partial` gives
        group by group, once merged — else None."""
        if self.mode != "exact" or column.dtype.kind not in "iuf":
            return None
        values = column[rows]
        keep = ~_isnull(values)
        if counts is not None:
            keep &= counts[rows]
        cuts = np.asarray(bounds, dtype=np.int64)
        if not keep.all():
            values = values[keep]
            cuts = np.concatenate(([0], np.cumsum(keep)))[cuts]
        if values.dtype.kind == "f":
            if not np.array_equal(values, np.floor(values)):
                return None  # (group by group: a group of whole numbers takes the bitmap)
            values = values.astype(np.int64)
        return ExactIds.partials_of(values, cuts)

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", "long"), ("_is_exact", "boolean"), ("_error", "double")]


@dataclass(frozen=True)
class Quantile:
    """Quantiles of ``column`` — ``Quantile("price", 0.9)`` or several,
    ``Quantile("price", (0.5, 0.9, 0.99))`` — from a KLL sketch (Apache DataSketches,
    the library Spark 4's ``kll_sketch_*`` functions use): mergeable across batches,
    exact while a window and key holds at most ``k`` values, beyond that within the
    normalized rank error reported in ``<name>_error`` (~1.65/k^0.9... about 1.3 % at
    k=200, with 99 % confidence). One quantile gives ``<name>``; several give
    ``<name>_p50``, ``<name>_p90``, … Each is a value of the column: the smallest whose
    inclusive rank reaches q (no more than a fraction q of the values is below it), as
    Spark's ``percentile_approx`` defines it."""

    column: str
    q: float | tuple[float, ...] = 0.5
    k: int = 200
    where: str | None = None

    def __post_init__(self) -> None:
        qs = self.q if isinstance(self.q, tuple) else (self.q,)
        if not qs or not all(isinstance(q, int | float) and 0 <= q <= 1 for q in qs):
            raise StreamValueError(
                f"Quantile q must be in [0, 1] (or a tuple of them), not {self.q!r}"
            )
        if not 8 <= self.k <= 65_535:
            raise StreamValueError(f"Quantile k must be between 8 and 65535, not {self.k}")

    @property
    def quantiles(self) -> tuple[float, ...]:
        return self.q if isinstance(self.q, tuple) else (self.q,)

    def _suffix(self, q: float) -> str:
        if not isinstance(self.q, tuple):
            return ""
        return "_p" + f"{q * 100:g}".replace(".", "_")

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        values = np.asarray(column, dtype=np.float64)
        sketch = ds.kll_doubles_sketch(self.k)
        values = values[~np.isnan(values)]
        if len(values):
            sketch.update(values)
        return sketch.serialize()

    def merge(self, a: Any, b: Any) -> Any:
        left = ds.kll_doubles_sketch.deserialize(a)
        left.merge(ds.kll_doubles_sketch.deserialize(b))
        return left.serialize()

    def result(self, value: Any) -> dict[str, Any]:
        sketch = ds.kll_doubles_sketch.deserialize(value)
        out: dict[str, Any] = {}
        for q in self.quantiles:
            value = None if sketch.is_empty() else float(sketch.get_quantile(q, inclusive=True))
            out[self._suffix(q)] = value  # the smallest value whose inclusive rank reaches q
        exact = sketch.n <= self.k  # every value still held: the quantile is exact
        out["_error"] = 0.0 if exact else float(sketch.normalized_rank_error(False))
        return out

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [(self._suffix(q), "double") for q in self.quantiles] + [("_error", "double")]


TOP = "array<struct<value:string,count:bigint>>"  # TopK's result: [value, count] pairs


@dataclass(frozen=True)
class TopK:
    """The ``k`` most frequent values of ``column`` (as text) with their counts, most
    frequent first (ties by value): exact while a window and key has at most
    ``threshold`` distinct values, beyond that from a frequent-items sketch (Apache
    DataSketches, ``lg_max_map`` its map's size) whose counts are within
    ``<name>_error`` of the true ones (``<name>_is_exact`` says which)."""

    column: str
    k: int = 10
    threshold: int = 1_000
    lg_max_map: int = 12
    where: str | None = None

    def __post_init__(self) -> None:
        if self.k < 1 or self.threshold < self.k:
            raise StreamValueError(
                f"TopK needs 1 <= k <= threshold, not k={self.k}, threshold={self.threshold}"
            )
        if not 7 <= self.lg_max_map <= 26:  # smaller maps lose counts when sketches merge
            raise StreamValueError(
                f"TopK lg_max_map must be between 7 and 26, not {self.lg_max_map}"
            )

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        assert column is not None
        values = column[~_isnull(column)]
        if values.dtype.kind == "f" and np.array_equal(values, np.floor(values)):
            values = values.astype(np.int64)  # an integer column with nulls, as Distinct
        names, counts = np.unique(values.astype(str), return_counts=True)
        exact = dict(zip(names.tolist(), counts.tolist(), strict=True))
        return self._held(exact)

    def _held(self, counts: dict[str, int]) -> bytes:
        """Exact counts while within ``threshold`` values, else a sketch of them."""
        return self._pack(counts if len(counts) <= self.threshold else self._sketch(counts))

    def _sketch(self, counts: dict[str, int]) -> Any:
        sketch = ds.frequent_strings_sketch(self.lg_max_map)
        for value, count in counts.items():
            sketch.update(value, count)
        return sketch

    def _pack(self, value: Any) -> bytes:
        if isinstance(value, dict):
            data: bytes = msgpack.packb({"e": value})
        else:
            data = msgpack.packb({"s": value.serialize()})
        return data

    def _unpack(self, data: bytes) -> Any:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return value["e"] if "e" in value else ds.frequent_strings_sketch.deserialize(value["s"])

    def merge(self, a: Any, b: Any) -> Any:
        left, right = self._unpack(a), self._unpack(b)
        if isinstance(left, dict) and isinstance(right, dict):
            both = dict(left)
            for value, count in right.items():
                both[value] = both.get(value, 0) + count
            return self._held(both)
        left = self._sketch(left) if isinstance(left, dict) else left
        right = self._sketch(right) if isinstance(right, dict) else right
        left.merge(right)
        return self._pack(left)

    def result(self, value: Any) -> dict[str, Any]:
        held = self._unpack(value)
        if isinstance(held, dict):
            ranked = sorted(held.items(), key=lambda vc: (-vc[1], vc[0]))[: self.k]
            top = [{"value": v, "count": int(c)} for v, c in ranked]
            return {"": top, "_is_exact": True, "_error": 0}
        rows = held.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
        best = sorted(rows, key=lambda r: (-int(r[1]), r[0]))[: self.k]
        top = [{"value": v, "count": int(estimate)} for v, estimate, _, _ in best]
        # how far a reported count can be from the true one (upper - lower bound)
        error = max((int(upper) - int(lower) for _, _, lower, upper in best), default=0)
        return {"": top, "_is_exact": False, "_error": error}

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", TOP), ("_is_exact", "boolean"), ("_error", "long")]


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


def _python(value: Any) -> Any:
    """A value as msgpack stores it: numpy scalars as Python, times as epoch µs."""
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[us]").astype(np.int64))
    if hasattr(value, "to_datetime64") and hasattr(value, "tz_localize"):  # a pandas Timestamp
        # (its .value is ns whatever its unit: µs from the datetime64, UTC when aware)
        return int(value.to_datetime64().astype("datetime64[us]").astype(np.int64))
    if hasattr(value, "item"):
        return value.item()
    return value


def _present(column: np.ndarray) -> np.ndarray:
    present: np.ndarray = ~_isnull(column)
    if column.dtype.kind == "M":
        present &= ~np.isnat(column)
    return present


@dataclass(frozen=True)
class _Picked:
    """A metric that returns one event's value of ``column`` — or, given several
    columns (``ArgMax(["bidder", "price", "ts"], by="price")``), that event's whole row
    of them, each under ``<metric>_<column>``: the event picked by ``_order`` —
    (ordering value, value) pairs compared as tuples, the largest wins. One column:
    among the events whose value and ordering value are present (NULLs are skipped, as
    Spark's ``first(col, ignoreNulls=true)``); several: among the events whose ordering
    value is present (a row may hold NULLs, as Spark's ``max_by(struct(…), by)``).
    Ties go to the smallest value — for a row, compared column by column in the order
    given, NULL first — so every path and merge order picks the same one.

    ``ties="all"``: every event tied for the pick instead (Nexmark q7: all the bids at
    their window's highest price) — ``<metric>`` a list of their values (of several
    columns: of rows, ``{column: value}``), the smallest first, at most ``max_ties`` of
    them (the smallest), and ``<metric>_ties`` how many there were."""

    column: str | tuple[str, ...]
    # (in a spec's shape only when set: shapes recorded before them stay equal)
    ties: str = field(default="smallest", kw_only=True, metadata={SHAPE_IF_SET: True})
    max_ties: int = field(default=1000, kw_only=True, metadata={SHAPE_IF_SET: True})
    returns_value = True  # its result is a value of ``column`` (typed as the column)

    def __post_init__(self) -> None:
        if self.ties not in ("smallest", "all"):
            raise StreamValueError(
                f"{type(self).__name__}: ties must be 'smallest' (one event: the smallest "
                f"value) or 'all' (every tied event, a list), not {self.ties!r}"
            )
        if not isinstance(self.max_ties, int) or self.max_ties < 1:
            raise StreamValueError(
                f"{type(self).__name__}: max_ties must be a whole number, 1 or more, not "
                f"{self.max_ties!r}"
            )
        if isinstance(self.column, list | tuple):
            names = tuple(self.column)
            if not names or not all(isinstance(c, str) and c for c in names):
                raise StreamValueError(
                    f"{type(self).__name__}: column must be a column or a non-empty list of "
                    f"columns: {self.column!r}"
                )
            if len(set(names)) != len(names):
                raise StreamValueError(f"{type(self).__name__} names a column twice: {list(names)}")
            object.__setattr__(self, "column", names[0] if len(names) == 1 else names)
        elif not isinstance(self.column, str) or not self.column:
            raise StreamValueError(
                f"{type(self).__name__}: column must be a column or a list of columns: "
                f"{self.column!r}"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns it returns: one, or a row's several."""
        return self.column if isinstance(self.column, tuple) else (self.column,)

    def _order(self, by: Any, value: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def _value_order(self, value: Any) -> Any:
        """A value as ties compare it: a row column by column, NULL first."""
        if isinstance(self.column, tuple):
            return tuple((v is not None, 0 if v is None else v) for v in value)
        return value

    def partial(
        self, column: np.ndarray | list[np.ndarray] | None, n: int, by: np.ndarray | None = None
    ) -> Any:
        assert column is not None and by is not None
        row = isinstance(self.column, tuple)
        keep = _present(by)
        if row:
            values = [_nullable(c[keep]) for c in column] if len(column) else []
            candidates = zip(_listed(by[keep]), zip(*values, strict=True), strict=True)
        else:
            assert isinstance(column, np.ndarray)
            keep &= _present(column)
            candidates = zip(_listed(by[keep]), _listed(column[keep]), strict=True)
        if self.ties == "all":
            tied: list[Any] | None = None
            for raw_by, raw in candidates:
                b = _python(raw_by)
                v = [_python(x) for x in raw] if row else _python(raw)
                if tied is None or self._rank(b) > self._rank(tied[0]):
                    tied = [b, [v], 1]
                elif self._rank(b) == self._rank(tied[0]):
                    tied[1].append(v)
                    tied[2] += 1
            return None if tied is None else self._kept(tied)
        best: list[Any] | None = None
        best_order: tuple[Any, ...] | None = None
        for b, v in candidates:
            candidate = [_python(b), [_python(x) for x in v] if row else _python(v)]
            order = self._order(candidate[0], self._value_order(candidate[1]))
            if best_order is None or order > best_order:
                best, best_order = candidate, order
        return best

    def _rank(self, by: Any) -> Any:
        """An ordering value as the pick compares it (the largest wins)."""
        return self._order(by, 0)[0]

    def _kept(self, tied: list[Any]) -> list[Any]:
        """A ``ties="all"`` value — [ordering value, tied values, how many] — with the
        values sorted (the smallest first) and the smallest ``max_ties`` kept."""
        values = sorted(tied[1], key=self._value_order)[: self.max_ties]
        return [tied[0], values, tied[2]]

    largest = True  # whether the largest ordering value wins (else the smallest)

    def group_partials(
        self,
        column: np.ndarray | list[np.ndarray],
        by: np.ndarray,
        rows: np.ndarray,
        bounds: list[int],
        counts: np.ndarray | None = None,
    ) -> list[Any]:
        """The partial of every group at once — group ``i`` is ``rows[bounds[i]:bounds[i +
        1]]``, ``counts`` the events a metric's ``where`` keeps — each what ``partial``
        gives it: one sort of the candidates by (group, ordering value); only a group
        whose best ordering value is tied compares values, in Python."""
        row = isinstance(self.column, tuple)
        sizes: np.ndarray = np.diff(np.asarray(bounds, dtype=np.int64))
        group = np.repeat(np.arange(len(sizes)), sizes)
        keep = _present(by[rows])
        if counts is not None:
            keep &= counts[rows]
        if not row:
            assert isinstance(column, np.ndarray)
            keep &= _present(column[rows])
        out: list[Any] = [None] * len(sizes)
        at, group = rows[keep], group[keep]
        if not len(at):
            return out
        ordered = by[at]
        order = np.lexsort((ordered, group))
        at, group, ordered = at[order], group[order], ordered[order]
        firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        ends = np.r_[firsts[1:], len(group)]
        best = ends - 1 if self.largest else firsts
        beside = best - 1 if self.largest else best + 1  # the next best, if in the group
        inside = (beside >= firsts) & (beside < ends)
        tied = np.zeros(len(best), dtype=bool)
        tied[inside] = ordered[beside[inside]] == ordered[best[inside]]
        if self.ties == "all":  # every tied event of each group
            for i in range(len(best)):
                run = np.arange(firsts[i], ends[i]) if tied[i] else np.array([best[i]])
                run = run[ordered[run] == ordered[best[i]]]
                value = self._values(column, at[run])
                out[int(group[firsts[i]])] = self._kept(
                    [_python(_listed(by[at[best[i] : best[i] + 1]])[0]), value, len(run)]
                )
            return out
        winners = at[best]
        for i in np.flatnonzero(tied).tolist():  # the smallest value among the tied
            run = np.arange(firsts[i], ends[i])
            run = run[ordered[run] == ordered[best[i]]]
            picked = self._values(column, at[run])
            smallest = min(range(len(run)), key=lambda j: self._value_order(picked[j]))
            winners[i] = at[run[smallest]]
        values = self._values(column, winners)
        for i, b, v in zip(group[firsts].tolist(), _listed(by[winners]), values, strict=True):
            out[i] = [_python(b), v]
        return out

    def _values(self, column: np.ndarray | list[np.ndarray], at: np.ndarray) -> list[Any]:
        """The values (a row's: a list) of the events at ``at``, as partials hold them."""
        if isinstance(self.column, tuple):
            parts = [[_python(v) for v in _nullable(c[at])] for c in column]
            return [list(r) for r in zip(*parts, strict=True)]
        assert isinstance(column, np.ndarray)
        return [_python(v) for v in _listed(column[at])]

    def merge(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        if self.ties == "all":
            mine, theirs = self._rank(a[0]), self._rank(b[0])
            if mine != theirs:
                return a if mine > theirs else b
            return self._kept([a[0], a[1] + b[1], a[2] + b[2]])
        mine = self._order(a[0], self._value_order(a[1]))
        theirs = self._order(b[0], self._value_order(b[1]))
        return a if mine >= theirs else b

    def result(self, value: Any) -> dict[str, Any]:
        if self.ties == "all":
            values = [] if value is None else value[1]
            if isinstance(self.column, tuple):
                values = [dict(zip(self.column, v, strict=True)) for v in values]
            return {"": values, "_ties": 0 if value is None else int(value[2])}
        if isinstance(self.column, tuple):
            picked = [None] * len(self.column) if value is None else value[1]
            return {f"_{c}": v for c, v in zip(self.column, picked, strict=True)}
        return {"": None if value is None else value[1]}

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        if self.ties == "all":  # a list of values (of rows), and how many were tied
            if isinstance(self.column, tuple):
                fields = ",".join(f"{c}:{types.get(c, 'string')}" for c in self.column)
                return [("", f"array<struct<{fields}>>"), ("_ties", "long")]
            return [("", f"array<{types.get(self.column, 'string')}>"), ("_ties", "long")]
        if isinstance(self.column, tuple):
            return [(f"_{c}", types.get(c, "string")) for c in self.column]
        return [("", types.get(self.column, "string"))]


def _listed(column: np.ndarray) -> list[Any]:
    """A column's values as Python's: times as epoch µs (numpy's ``tolist`` gives a
    ``datetime`` or, at ns precision, an int of ns)."""
    if column.dtype.kind == "M":
        column = column.astype("datetime64[us]").astype(np.int64)
    return column.tolist()  # type: ignore[no-any-return]


def _nullable(column: np.ndarray) -> list[Any]:
    """A column's values with its NULLs (NaN, NaT) as None."""
    present = _present(column)
    values = _listed(column)
    if present.all():
        return values
    return [v if ok else None for v, ok in zip(values, present.tolist(), strict=True)]


@dataclass(frozen=True)
class First(_Picked):
    """The value of ``column`` at the earliest event time of the window and key."""

    where: str | None = None  # Spark SQL: only the events it is true for
    by: str | None = None  # (the event time)

    largest = False

    def _order(self, by: Any, value: Any) -> tuple[Any, ...]:
        return (-by, _desc(value))


@dataclass(frozen=True)
class Last(_Picked):
    """The value of ``column`` at the latest event time of the window and key."""

    where: str | None = None
    by: str | None = None  # (the event time)

    def _order(self, by: Any, value: Any) -> tuple[Any, ...]:
        return (by, _desc(value))


@dataclass(frozen=True)
class ArgMax(_Picked):
    """The value of ``column`` of the event with the largest ``by``."""

    by: str = ""
    where: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.by:
            raise StreamValueError(f"{type(self).__name__} needs by=, the column to compare")

    def _order(self, by: Any, value: Any) -> tuple[Any, ...]:
        return (by, _desc(value))


@dataclass(frozen=True)
class ArgMin(_Picked):
    """The value of ``column`` of the event with the smallest ``by``."""

    by: str = ""
    where: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.by:
            raise StreamValueError(f"{type(self).__name__} needs by=, the column to compare")

    largest = False

    def _order(self, by: Any, value: Any) -> tuple[Any, ...]:
        return (-by if isinstance(by, int | float) else _Reverse(by), _desc(value))


@functools.total_ordering
class _Reverse:
    """Orders its value backwards (for text, which has no negative)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: _Reverse) -> bool:
        return bool(self.value > other.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reverse) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _desc(value: Any) -> Any:
    """A tie goes to the smallest value: compare values backwards."""
    return (
        -value
        if isinstance(value, int | float) and not isinstance(value, bool)
        else _Reverse(value)
    )


@runtime_checkable
class Aggregator(Protocol):
    """A user-defined aggregate: what :class:`Custom` needs to make it a metric with
    exactly-once state, partials, the shuffle and the result table for free.

    ``create`` an empty state; ``update`` it with a batch of a window and key's values
    (an Arrow array, NULLs included — skip them as you see fit); ``merge`` two states
    (in any order, any grouping: riverbed merges partials of tasks, batches and
    restarts as they come, so merge must be associative and commutative); ``result``
    of a state, a value of the metric's ``type``; ``to_bytes``/``from_bytes`` — how a
    state is stored (keep it small: it is written every batch a window changes). The
    object itself is pickled to the tasks: define it at the top level of a module or
    of the spec file. A worked example: ``examples/stddev.py``."""

    def create(self) -> Any: ...

    def update(self, state: Any, values: Any) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...

    def result(self, state: Any) -> Any: ...

    def to_bytes(self, state: Any) -> bytes: ...

    def from_bytes(self, data: bytes) -> Any: ...


CUSTOM_TYPES = ("double", "long", "string", "boolean", "timestamp")


@dataclass(frozen=True)
class Custom:
    """A user-defined metric: ``Custom("latency_ms", StdDev(), type="double")`` —
    ``aggregator`` follows :class:`Aggregator`; its result is the column ``<name>`` of
    ``type`` (one of :data:`CUSTOM_TYPES`). Takes ``where=`` like every metric."""

    column: str
    aggregator: Any
    type: str = "double"
    where: str | None = None

    def __post_init__(self) -> None:
        missing = [
            m
            for m in ("create", "update", "merge", "result", "to_bytes", "from_bytes")
            if not callable(getattr(self.aggregator, m, None))
        ]
        if missing:
            raise StreamValueError(
                f"Custom({self.column!r}, …): the aggregator {type(self.aggregator).__name__} "
                f"has no {', '.join(missing)} (riverbed.stream.Aggregator lists what it needs)"
            )
        if self.type not in CUSTOM_TYPES:
            raise StreamValueError(
                f"Custom({self.column!r}, …): type must be one of {', '.join(CUSTOM_TYPES)}, "
                f"not {self.type!r}"
            )

    def check_shippable(self, name: str) -> None:
        """Refuse, in one line, an aggregator Spark cannot send to its tasks (they get
        it pickled — by value when it is defined in a spec file, with the module-level
        objects it uses)."""
        from pyspark import cloudpickle

        try:
            cloudpickle.dumps(self.aggregator)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise StreamValueError(
                f"metric {name!r}: its aggregator {type(self.aggregator).__name__} cannot be "
                f"sent to Spark's tasks ({type(exc).__name__}: {exc}); keep what it uses in "
                "its own attributes or inside its methods, or import it from a module"
            ) from None

    def partial(self, column: np.ndarray | None, n: int) -> Any:
        import pyarrow as pa

        assert column is not None
        agg = self.aggregator
        values = pa.array(column, from_pandas=True)  # NaN, None: NULL
        return bytes(agg.to_bytes(agg.update(agg.create(), values)))

    def merge(self, a: Any, b: Any) -> Any:
        agg = self.aggregator
        return bytes(agg.to_bytes(agg.merge(agg.from_bytes(a), agg.from_bytes(b))))

    def result(self, value: Any) -> dict[str, Any]:
        return {"": self.aggregator.result(self.aggregator.from_bytes(value))}

    def outputs(self, types: Mapping[str, str]) -> list[tuple[str, str]]:
        return [("", self.type)]


Metric = (
    Count
    | Sum
    | Min
    | Max
    | Mean
    | Distinct
    | Quantile
    | TopK
    | First
    | Last
    | ArgMax
    | ArgMin
    | Custom
)
VALUE_METRICS = (First, Last, ArgMax, ArgMin)  # their result is a value of their column


def where_column(name: str) -> str:
    """The internal column holding metric ``name``'s ``where`` (true: it counts)."""
    return f"_where_{name}"


def result_columns(metric: Any, values: list[Any]) -> dict[str, list[Any]]:
    """What ``metric.result`` gives for each of ``values`` (stored partials), column by
    column: ``{suffix: [result, ...]}``. Counts, sums, minima, maxima and means are
    read straight from the list (their results are the values themselves, or a mean's
    quotient); other metrics give theirs value by value."""
    if isinstance(metric, Count):
        return {"": [int(v) for v in values]}
    if isinstance(metric, Sum | Min | Max):
        return {"": values}
    if isinstance(metric, Distinct) and metric.mode == "exact":
        counts = [ExactIds.count_of(v) for v in values]
        if None not in counts:
            return {"": counts, "_is_exact": [True] * len(values), "_error": [0.0] * len(values)}
    if isinstance(metric, Mean):
        return {"": [v[0] / v[1] if v[1] else None for v in values]}
    columns: dict[str, list[Any]] = {}
    for value in values:
        for suffix, result in metric.result(value).items():
            columns.setdefault(suffix, []).append(result)
    return columns


def values_merger(
    spec: Any,
) -> Callable[[list[dict[str, Any]], dict[str, Any] | None], dict[str, Any]]:
    """``merge(partials, stored)``: one key's partials (in order) and its stored value
    (or None) as the value state keeps, for an aggregation ``spec``'s metrics. A metric
    with ``merge_all`` (Distinct) merges them all at once — its partials may not be
    what state keeps (an exact id set's are its ids) — the others fold the partials in
    order, then merge the stored value with that (a float sum's order is part of its
    result)."""
    metrics = list(spec.metrics.items())
    at_once = {n: m.merge_all for n, m in metrics if isinstance(m, Distinct)}

    def merge(partials: list[dict[str, Any]], stored: dict[str, Any] | None) -> dict[str, Any]:
        if stored is None and len(partials) == 1 and not at_once:
            return partials[0]
        out: dict[str, Any] = {}
        for n, m in metrics:
            if n in at_once:
                values = [p[n] for p in partials]
                out[n] = at_once[n](values if stored is None else [stored[n], *values])
                continue
            value = partials[0][n]
            for p in partials[1:]:
                value = m.merge(value, p[n])
            out[n] = value if stored is None else m.merge(stored[n], value)
        return out

    return merge
