"""Distinct-count sketches: error bounds, exactness, merges, bytes, Spark interop."""

from __future__ import annotations

from typing import Any

import datasketches as ds
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.state.sketches import HLL, AdaptiveDistinct, ExactIds, bit_length, hll_registers


@pytest.mark.parametrize("n", [1_000, 10_000, 100_000, 1_000_000])
@pytest.mark.parametrize("lg_k", [10, 12, 14])
def test_hll_error_within_three_published_standard_errors(n: int, lg_k: int) -> None:
    ids = np.random.default_rng(n + lg_k).permutation(n * 3)[:n]  # n distinct ids
    hll = HLL.from_bytes(HLL(lg_k).update(np.concatenate([ids, ids[: n // 2]])).to_bytes())
    count = hll.count()
    assert not count.exact
    assert abs(count.value - n) / n <= 3 * HLL.relative_standard_error(lg_k)
    assert count.lower <= count.value <= count.upper


def test_hll_merge_equals_one_sketch_of_the_union() -> None:
    a = np.arange(0, 60_000)
    b = np.arange(40_000, 100_000)  # overlaps a
    merged = HLL().update(a).merge(HLL().update(b))
    single = HLL().update(np.concatenate([a, b]))

    def registers(h: HLL) -> bytes:
        # HLL_8 image: a 40-byte preamble (incl. estimator state), then one byte a register
        union = ds.hll_union(12)
        union.update(h._s)
        image: bytes = union.get_result(ds.tgt_hll_type.HLL_8).serialize_compact()
        return image[40:]

    assert registers(merged) == registers(single)
    assert registers(HLL().update(b).merge(HLL().update(a))) == registers(merged)
    assert abs(merged.count().value - 100_000) / 100_000 < 3 * HLL.relative_standard_error(12)


@given(
    st.sampled_from([4, 8, 12, 14]),
    st.integers(3_000, 30_000),
    st.sampled_from([(0, 500_000), (-(2**63), 2**63 - 1), (0, 2**40)]),
    st.integers(0, 2**32),
)
@settings(max_examples=25, deadline=None)
def test_numpy_hll_registers_are_datasketches_own(
    lg_k: int, n: int, bounds: tuple[int, int], seed: int
) -> None:
    """The vectorized update (MurmurHash3 and the coupon rule in numpy) sets exactly the
    registers DataSketches sets with one update() per id — so sketches stay Spark's."""
    ids = np.random.default_rng(seed).integers(bounds[0], bounds[1], n, endpoint=True)
    reference = ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_8)
    for item in ids.tolist():
        reference.update(item)
    image = reference.serialize_updatable()
    assert image[7] & 3 == 2  # in HLL mode: one byte a register after a 40-byte preamble
    expected = np.frombuffer(image, np.uint8, 1 << lg_k, 40)
    assert np.array_equal(hll_registers(ids, lg_k), expected)
    vector = HLL(lg_k).update(ids)
    per_item = HLL(lg_k).update(ids.tolist())
    union = ds.hll_union(lg_k)
    union.update(vector._s)
    merged = np.frombuffer(union.get_result(ds.tgt_hll_type.HLL_8).serialize_compact(), np.uint8)
    union = ds.hll_union(lg_k)
    union.update(per_item._s)
    ref = np.frombuffer(union.get_result(ds.tgt_hll_type.HLL_8).serialize_compact(), np.uint8)
    assert np.array_equal(merged[40:], ref[40:])


def test_bit_length_is_exact_at_every_power_of_two() -> None:
    edges = [0, 1, 3] + [2**k + d for k in range(1, 64) for d in (-1, 0, 1)] + [2**64 - 1]
    assert bit_length(np.array(edges, np.uint64)).tolist() == [v.bit_length() for v in edges]


def test_hll_strings_and_compact_size() -> None:
    hll = HLL(12).update([f"user-{i}" for i in range(5_000)])
    data = hll.to_bytes()
    assert len(data) < 2_200  # HLL_4 compact at lg_k=12 is ~2 KB
    assert abs(HLL.from_bytes(data).count().value - 5_000) / 5_000 < 0.05


def test_exact_ids_ints_and_strings() -> None:
    ints = ExactIds().update(np.array([5, 1, 5, 2**40, 1], dtype=np.int64))
    ints.merge(ExactIds().update([7, 1]))
    assert ints.count().value == 4 and ints.count().exact
    assert ExactIds.from_bytes(ints.to_bytes()).ids() == [1, 5, 7, 2**40]
    strs = ExactIds().update(["b", "a", "b"]).merge(ExactIds().update(["c"]))
    assert ExactIds.from_bytes(strs.to_bytes()).ids() == ["a", "b", "c"]
    with pytest.raises(ValueError, match="past 64 bits"):
        ExactIds().update([2**64])
    with pytest.raises(ValueError, match="cannot merge"):
        strs.merge(ints)


INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.lists(INT64, max_size=60), st.lists(INT64, max_size=60), st.booleans())
@settings(max_examples=200, deadline=None)
def test_exact_ids_count_any_64_bit_ids_negative_ones_too(
    left: list[int], right: list[int], as_array: bool
) -> None:
    """Every signed 64-bit id counts exactly (a negative user id once stopped a stream:
    "integer ids must be >= 0"), whether given as an array or one by one, through
    bytes and merges; the HyperLogLog it becomes counts the same ids."""
    first = ExactIds().update(np.array(left, dtype=np.int64) if as_array else left)
    second = ExactIds().update(np.array(right, dtype=np.int64))
    merged = ExactIds.from_bytes(first.to_bytes()).merge(ExactIds.from_bytes(second.to_bytes()))
    assert merged.ids() == sorted({*left, *right})
    assert merged.count().value == len({*left, *right})
    if left or right:
        hll = HLL(12).update(sorted({*left, *right}))
        assert merged.to_hll(12).count().value == pytest.approx(hll.count().value)


def test_adaptive_switches_to_hll_past_its_threshold_and_says_so() -> None:
    d = AdaptiveDistinct(threshold=1_000)
    d.update(np.arange(800))
    assert d.exact and d.count().value == 800 and d.count().rel_error == 0
    again = AdaptiveDistinct.from_bytes(d.to_bytes(), threshold=1_000)
    again.update(np.arange(500, 1_500))
    count = again.count()
    assert not again.exact and not count.exact
    assert abs(count.value - 1_500) / 1_500 < 0.05 and 0 < count.rel_error < 0.1
    restored = AdaptiveDistinct.from_bytes(again.to_bytes(), threshold=1_000)
    assert not restored.exact and restored.count().value == count.value
    # merging an exact partial into a sketch keeps it approximate and adds the ids
    restored.merge(AdaptiveDistinct(threshold=1_000).update(np.arange(1_500, 1_600)))
    assert abs(restored.count().value - 1_600) / 1_600 < 0.05


@pytest.mark.spark
def test_spark_sketches_load_in_python_and_python_sketches_load_in_spark(spark: Any) -> None:
    from pyspark.sql import functions as F

    n = 20_000
    df = spark.range(0, n).withColumn("s", F.concat(F.lit("u"), F.col("id").cast("string")))
    row = df.agg(
        F.hll_sketch_agg("id", 12).alias("ids"), F.hll_sketch_agg("s", 12).alias("strs")
    ).first()
    for column, python_ids in [("ids", np.arange(n)), ("strs", [f"u{i}" for i in range(n)])]:
        spark_blob = bytes(row[column])
        from_spark = HLL.from_bytes(spark_blob)
        spark_estimate = (
            spark.createDataFrame([(spark_blob,)], "b binary")
            .select(F.hll_sketch_estimate("b"))
            .first()[0]
        )
        assert round(from_spark.count().value) == spark_estimate
        # same hashing: Python's sketch of the same ids unions with Spark's to ~n, not ~2n
        ours = HLL(12).update(python_ids)
        union = HLL.from_bytes(spark_blob).merge(ours).count().value
        assert abs(union - n) / n < 3 * HLL.relative_standard_error(12)
        # and Spark reads ours (compact HLL_4)
        back = (
            spark.createDataFrame([(ours.to_bytes(),)], "b binary")
            .select(F.hll_sketch_estimate("b"))
            .first()[0]
        )
        assert back == round(HLL.from_bytes(ours.to_bytes()).count().value)


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=3000),
    st.sampled_from([np.int64, np.uint64, np.int32, np.uint32]),
)
@settings(max_examples=200, deadline=None)
def test_exact_ids_of_32_bit_ids_hold_what_the_general_way_holds(
    ids: list[int], dtype: Any
) -> None:
    """The fast partial (a 32-bit bitmap behind the 64-bit format's one-bucket header)
    loads as the general way's set, merges with it, and is never bigger (the 32-bit
    bitmap built from an array picks run containers where they are smaller)."""
    values = np.array(ids, dtype=np.uint64).astype(dtype)
    if dtype in (np.int32,) and values.size and (np.array(ids) > 2**31 - 1).any():
        return  # not representable: no such column
    fast = ExactIds.bytes_of(values)
    general = ExactIds().update(values).to_bytes()
    if not ids:
        assert fast is None
        return
    assert fast is not None and len(fast) <= len(general)
    assert ExactIds.from_bytes(fast).ids() == ExactIds.from_bytes(general).ids()
    assert ExactIds.from_bytes(fast).ids() == sorted(set(ids))
    other = ExactIds().update(np.array([7, 2**40], dtype=np.uint64))
    merged = ExactIds.from_bytes(fast).merge(other)
    assert merged.ids() == sorted({*ids, 7, 2**40})


def test_dense_ids_take_run_containers_on_the_fast_way() -> None:
    ids = np.arange(0, 200_000)
    fast = ExactIds.bytes_of(ids)
    assert fast is not None and len(fast) < 100  # runs, not 4 bitmap containers
    assert ExactIds.from_bytes(fast).count().value == 200_000


def test_ids_past_32_bits_or_negative_take_the_general_way() -> None:
    assert ExactIds.bytes_of(np.array([1, 2**32], dtype=np.uint64)) is None
    assert ExactIds.bytes_of(np.array([-1, 2], dtype=np.int64)) is None
    assert ExactIds.bytes_of(np.array(["a"], dtype=object)) is None
    big = ExactIds().update(np.array([1, 2**40], dtype=np.uint64))
    assert ExactIds.from_bytes(big.to_bytes()).ids() == [1, 2**40]


def test_an_empty_exact_set_takes_either_kind_after_a_round_trip() -> None:
    """A partial of only NULLs is an empty set, stored as an empty bitmap: it says
    nothing of the ids' kind, so strings merge into it and it into strings."""
    empty = ExactIds.from_bytes(ExactIds().to_bytes())
    assert empty.merge(ExactIds().update(["a"])).ids() == ["a"]
    assert ExactIds().update(["b"]).merge(ExactIds.from_bytes(ExactIds().to_bytes())).ids() == ["b"]
    again = ExactIds.from_bytes(ExactIds().to_bytes()).update(["c", "d"])
    assert again.ids() == ["c", "d"]
    ints = ExactIds.from_bytes(ExactIds().to_bytes()).update(np.array([], dtype=object))
    assert ints.update([3]).ids() == [3]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["stored", "fast", "ids", "empty"]),
            st.lists(st.integers(0, 2**32 - 1), max_size=50),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_exact_ids_merged_at_once_hold_the_union_of_what_they_merge(
    parts: list[tuple[str, list[int]]],
) -> None:
    """``ExactIds.merged`` — several stored values and partials (a key's, from several
    tasks) as one bitmap — holds what merging them one by one holds, is read back by
    ``from_bytes`` as any stored value, and ``count_of`` counts it."""
    values = []
    for kind, ids in parts:
        array_ = np.array(ids, dtype=np.int64)
        if kind == "stored":
            values.append(ExactIds().update(array_).to_bytes())
        elif kind == "fast":
            values.append(ExactIds.bytes_of(array_) or ExactIds().to_bytes())
        elif kind == "ids":  # a group's partial, cut from one array
            (partial,) = ExactIds.partials_of(array_, np.array([0, len(ids)])) or [None]
            values.append(partial)
        else:
            values.append(ExactIds().to_bytes())
    want = ExactIds.from_bytes(values[0])
    for value in values[1:]:
        want.merge(ExactIds.from_bytes(value))
    got = ExactIds.merged(values)
    assert got is not None
    assert got[0] == 0  # a bitmap, as state keeps it: never the partials' ids
    held = {i for kind, ids in parts if kind != "empty" for i in ids}
    assert ExactIds.from_bytes(got).ids() == want.ids() == sorted(held)
    assert ExactIds.count_of(got) == len(want.ids())


def test_exact_ids_merged_at_once_leave_ids_past_32_bits_and_strings_to_the_general_way() -> None:
    wide = ExactIds().update(np.array([1, 2**40], dtype=np.int64)).to_bytes()
    small = ExactIds.bytes_of(np.array([3], dtype=np.int64))
    assert small is not None
    assert ExactIds.merged([small, wide]) is None
    assert ExactIds.merged([small, ExactIds().update(["a"]).to_bytes()]) is None
    assert ExactIds.count_of(wide) is None
    assert ExactIds.partials_of(np.array([-1, 2], dtype=np.int64), np.array([0, 2])) is None
    assert ExactIds.partials_of(np.array([2**32], dtype=np.int64), np.array([0, 1])) is None
    assert ExactIds.partials_of(np.array(["a"], dtype=object), np.array([0, 1])) is None
    # a partial of ids read on its own (as a merge of one-by-one would) holds them too
    (partial,) = ExactIds.partials_of(np.array([5, 5, 9], dtype=np.int64), np.array([0, 3])) or []
    assert ExactIds.from_bytes(partial).ids() == [5, 9]
    assert ExactIds.from_bytes(ExactIds.merged([partial]) or b"").ids() == [5, 9]


def test_a_group_of_many_ids_gets_its_bitmap_in_its_partial() -> None:
    """A hot key's group (many ids, repeated) ships a bitmap, not its ids; small groups
    their ids; both merge into the same stored value."""
    many = np.arange(1000, dtype=np.int64) % 300
    ids = np.concatenate([many, np.array([7, 7, 400], dtype=np.int64)])
    big, small = ExactIds.partials_of(ids, np.array([0, 1000, 1003])) or []
    assert big[0] == 0 and len(big) < 1000  # a bitmap (runs), not 4,000 bytes of ids
    assert small[0] == 3 and len(small) == 1 + 3 * 4
    merged = ExactIds.merged([big, small])
    assert merged is not None and ExactIds.from_bytes(merged).ids() == [*range(300), 400]
