"""Distinct counting as state values: exact bitmaps, HyperLogLog, and adaptive.

Every sketch is a mergeable partial: build one per (window, key) from a batch,
``merge`` it into the stored one, store ``to_bytes()``. Reads report whether the
value is exact and its error bounds.

* :class:`ExactIds`  — exact; integer ids in a Roaring bitmap (built from numpy
  arrays at ~15-20M ids/s), other ids (str/bytes) in a sorted set.
* :class:`HLL`       — Apache DataSketches HyperLogLog (``lg_k`` 4..21, default 12:
  ~1.6 % relative standard error, ~2 KB). Stored as the compact HLL_4 image, which
  Spark's ``hll_sketch_estimate``/``hll_union`` read; Spark's ``hll_sketch_agg``
  output (HLL_8) loads here — the hashes are the same.
* :class:`AdaptiveDistinct` — exact while it holds at most ``threshold`` ids, then
  converts itself to HLL.

DataSketches' Python ``update`` takes one item per call (no array form, ~8M ids/s
measured). Large arrays of integer ids are hashed here instead, with numpy: the same
MurmurHash3 (x64, 128 bits, seed 9001) and coupon → register rule as DataSketches, the
registers' maxima written as a DataSketches HLL_8 image and unioned in — the same
registers as one ``update`` per id (a Hypothesis property), so Spark reads the result as
ever. Smaller arrays, and str/bytes ids, take ``update`` per item (DataSketches keeps
small sets as exact coupon lists). Bitmaps are built from the array directly.
"""

from __future__ import annotations

import array
import itertools
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

import datasketches as ds
import msgpack
import numpy as np
import pyroaring

from riverbed.state.errors import CorruptStateError, StateValueError

_EXACT_INT, _EXACT_STR, _HLL = 0, 1, 2
# a partial only, never stored (ExactIds.merged turns it into a bitmap): the ids as
# little-endian uint32, in any order and repeated — cut from one array for all groups
_EXACT_IDS32 = 3
_IDS_AS_THEY_ARE = 256  # a group of more ids gets its bitmap in its partial
_TOP = 1 << 63  # ids are signed 64-bit: [-_TOP, _TOP)
_ONE_LOW_BUCKET = struct.pack("<QI", 1, 0)  # a 64-bit bitmap's one bucket, high bits 0
_NO_BUCKETS = struct.pack("<Q", 0)  # an empty 64-bit bitmap
Ids = Union[np.ndarray, Iterable[int], Iterable[str], Iterable[bytes]]  # noqa: UP007


@dataclass(frozen=True)
class DistinctCount:
    """A distinct count: ``value`` with bounds; ``exact`` when lower == value == upper."""

    value: float
    exact: bool
    lower: float
    upper: float

    @property
    def rel_error(self) -> float:
        """Half-width of the bounds relative to the value (0 when exact)."""
        if self.exact or self.value == 0:
            return 0.0
        return (self.upper - self.lower) / 2 / self.value


def _as_list(ids: Ids) -> list[Any]:
    if isinstance(ids, np.ndarray):
        out: list[Any] = ids.tolist()
        return out
    return list(ids)


_SEED = np.uint64(9001)  # DataSketches' default hash seed
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_OUT_OF_ORDER = 16  # DataSketches' preamble flag: registers not built in update order
_HLL_MODE, _HLL_8 = 2, 2


def _fmix(k: np.ndarray) -> np.ndarray:
    k ^= k >> np.uint64(33)
    k *= _F1
    k ^= k >> np.uint64(33)
    k *= _F2
    k ^= k >> np.uint64(33)
    return k


def murmur3_int64(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MurmurHash3_x64_128 of each int64 (its 8 little-endian bytes), seed 9001: what
    DataSketches hashes an integer item with."""
    k1 = np.ascontiguousarray(ids, dtype="<i8").view(np.uint64).copy()
    with np.errstate(over="ignore"):
        k1 *= _C1
        k1 = (k1 << np.uint64(31)) | (k1 >> np.uint64(33))
        k1 *= _C2
        h1 = k1 ^ _SEED
        h1 ^= np.uint64(8)
        h2 = np.full_like(h1, _SEED ^ np.uint64(8))
        h1 += h2
        h2 += h1
        h1 = _fmix(h1)
        h2 = _fmix(h2)
        h1 += h2
        h2 += h1
    return h1, h2


def bit_length(x: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 (0 for 0), exactly: a float64's exponent, one less
    where rounding to 53 bits carried the value up to the next power of two."""
    e = np.frexp(x.astype(np.float64))[1].astype(np.uint64)
    carried = (e > 0) & ((x >> np.maximum(e, np.uint64(1)) - np.uint64(1)) == 0)
    out: np.ndarray = (e - carried).astype(np.int64)
    return out


def hll_registers(ids: np.ndarray, lg_k: int) -> np.ndarray:
    """The HLL_8 registers (2^lg_k bytes) of integer ``ids``, as DataSketches sets them:
    slot = the hash's low lg_k bits, value = leading zeros of its second half + 1."""
    h1, h2 = murmur3_int64(ids)
    slots = (h1 & np.uint64((1 << lg_k) - 1)).astype(np.int64)
    values = (np.minimum(64 - bit_length(h2), 62) + 1).astype(np.uint8)
    registers = np.zeros(1 << lg_k, np.uint8)
    np.maximum.at(registers, slots, values)
    return registers


def _hll8_image(lg_k: int, registers: np.ndarray) -> bytes:
    """A DataSketches HLL_8 sketch image in HLL mode holding ``registers``."""
    inverse = np.ldexp(1.0, -registers.astype(np.int64))
    high = registers >= 32
    header = bytes([10, 1, 7, lg_k, 0, _OUT_OF_ORDER, 0, _HLL_MODE | (_HLL_8 << 2)])
    fields = struct.pack(
        "<dddii",
        0.0,  # HIP accumulator: unused out of order
        float(inverse[~high].sum()),
        float(inverse[high].sum()),
        int((registers == 0).sum()),  # at the current minimum, 0 in HLL_8
        0,
    )
    return header + fields + registers.tobytes()


_VECTOR_MIN = 2048  # below this many ids, per-item updates (exact coupon lists)


def _int64_safe(ids: np.ndarray) -> bool:
    """Integer ids that are int64 values (what DataSketches hashes as 8 bytes)."""
    return ids.dtype.kind == "i" or (ids.dtype.kind == "u" and ids.dtype.itemsize < 8)


class HLL:
    """HyperLogLog (Apache DataSketches), Spark-compatible."""

    def __init__(self, lg_k: int = 12, sketch: Any = None) -> None:
        if not 4 <= lg_k <= 21:
            raise StateValueError(f"lg_k must be between 4 and 21, got {lg_k}")
        self.lg_k = lg_k
        self._s = sketch if sketch is not None else ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_4)

    @classmethod
    def from_bytes(cls, data: bytes) -> HLL:
        try:
            sketch = ds.hll_sketch.deserialize(data)
        except (RuntimeError, ValueError) as exc:
            raise CorruptStateError(f"not a DataSketches HLL image ({exc})") from exc
        return cls(sketch.lg_config_k, sketch)

    def update(self, ids: Ids) -> HLL:
        if isinstance(ids, np.ndarray) and len(ids) >= _VECTOR_MIN and _int64_safe(ids):
            image = _hll8_image(self.lg_k, hll_registers(ids.astype(np.int64), self.lg_k))
            return self.merge(HLL(self.lg_k, ds.hll_sketch.deserialize(image)))
        update = self._s.update
        for item in _as_list(ids):
            update(item)
        return self

    def merge(self, other: HLL) -> HLL:
        union = ds.hll_union(max(self.lg_k, other.lg_k))
        union.update(self._s)
        union.update(other._s)
        self._s = union.get_result(ds.tgt_hll_type.HLL_4)
        self.lg_k = self._s.lg_config_k
        return self

    def count(self) -> DistinctCount:
        return DistinctCount(
            value=self._s.get_estimate(),
            exact=False,
            lower=self._s.get_lower_bound(2),
            upper=self._s.get_upper_bound(2),
        )

    def to_bytes(self) -> bytes:
        data: bytes = self._s.serialize_compact()
        return data

    @staticmethod
    def relative_standard_error(lg_k: int) -> float:
        """Published RSE of HLL_4 at ``lg_k`` (1.04 / sqrt(K))."""
        return 1.04 / math.sqrt(1 << lg_k)


class ExactIds:
    """Exact distinct ids: a 64-bit Roaring bitmap for integers, a set otherwise.

    A signed id is kept as the unsigned 64-bit number of the same bits (two's
    complement: -1 is 2**64 - 1), a one-to-one mapping, so negative ids count exactly
    and an id stored by earlier versions (never negative) keeps its place; :meth:`ids`
    and :meth:`to_hll` read them back as the signed ids they were."""

    def __init__(self, bitmap: pyroaring.BitMap64 | None = None, items: set[Any] | None = None):
        self._bitmap = bitmap
        self._items = items

    def update(self, ids: Ids) -> ExactIds:
        if isinstance(ids, np.ndarray) and len(ids) == 0:  # no ids say nothing of their kind
            return self
        if self._bitmap is not None and not self._bitmap:
            self._bitmap = None  # empty (as an empty set is stored): no kind yet
        if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu" and self._items is None:
            if self._bitmap is None:
                self._bitmap = pyroaring.BitMap64()
            bits = (
                ids.astype(np.int64, copy=False).view(np.uint64) if ids.dtype.kind == "i" else ids
            )
            # through an array.array: pyroaring reads its buffer, where an ndarray is
            # iterated as Python objects (86 vs 117 ns an id here)
            self._bitmap.update(array.array("Q", bits.astype(np.uint64, copy=False).tobytes()))
            return self
        values = _as_list(ids)
        if not values:  # no ids say nothing of their kind
            return self
        if self._bitmap is not None or (
            self._items is None and values and all(isinstance(v, int) for v in values)
        ):
            if self._bitmap is None:
                self._bitmap = pyroaring.BitMap64()
            if not all(isinstance(v, int) and -_TOP <= v < 2 * _TOP for v in values):
                raise StateValueError(
                    "cannot mix non-integer ids, or integers past 64 bits, into an integer id set"
                )
            self._bitmap.update([v % (2 * _TOP) for v in values])
            return self
        if self._items is None:
            self._items = set()
        self._items.update(values)
        return self

    def merge(self, other: ExactIds) -> ExactIds:
        # an empty bitmap (how an empty set is stored: a partial of only NULLs) says
        # nothing of the ids' kind
        if self._bitmap is not None and not self._bitmap and other._items is not None:
            self._bitmap = None
        if other._bitmap is not None and not other._bitmap:
            return self
        if other._bitmap is not None:
            if self._items is not None:
                raise StateValueError("cannot merge integer ids into a set of string ids")
            self._bitmap = (self._bitmap or pyroaring.BitMap64()) | other._bitmap
        if other._items is not None:
            if self._bitmap is not None:
                raise StateValueError("cannot merge string ids into an integer id bitmap")
            self._items = (self._items or set()) | other._items
        return self

    def __len__(self) -> int:
        if self._bitmap is not None:
            return len(self._bitmap)
        return len(self._items or ())

    def ids(self) -> list[Any]:
        if self._bitmap is not None:
            return sorted(self._signed().tolist())
        return sorted(self._items or ())

    def _signed(self) -> np.ndarray:
        """The bitmap's ids as the signed 64-bit ids they were stored from."""
        assert self._bitmap is not None
        unsigned = np.frombuffer(self._bitmap.to_array(), dtype=np.uint64)
        return unsigned.view(np.int64)

    def count(self) -> DistinctCount:
        n = float(len(self))
        return DistinctCount(n, True, n, n)

    def to_hll(self, lg_k: int) -> HLL:
        if self._bitmap is not None:
            return HLL(lg_k).update(self._signed())
        return HLL(lg_k).update(sorted(self._items or ()))

    def to_bytes(self) -> bytes:
        if self._items is not None:
            packed: bytes = msgpack.packb(sorted(self._items))
            return bytes([_EXACT_STR]) + packed
        bitmap = self._bitmap or pyroaring.BitMap64()
        return bytes([_EXACT_INT]) + bitmap.serialize()

    @staticmethod
    def bytes_of(ids: np.ndarray) -> bytes | None:
        """``ExactIds().update(ids).to_bytes()`` for integer ids that all fit 32 bits,
        built three times as fast (a 32-bit bitmap reads its array's buffer; a 64-bit
        one takes ids one by one): the 64-bit portable format is a count of buckets,
        then each bucket's high 32 bits and its 32-bit bitmap (the Roaring format
        spec's 64-bit extension), so one bucket of high bits 0 is the 32-bit bitmap
        behind a 12-byte header. None when the ids do not fit: take the general way."""
        if ids.dtype.kind not in "iu" or not ids.size:
            return None
        if ids.min() < 0 or ids.max() > 0xFFFFFFFF:
            return None
        bitmap = pyroaring.BitMap(array.array("I", ids.astype(np.uint32).tobytes()))
        return bytes([_EXACT_INT]) + _ONE_LOW_BUCKET + bitmap.serialize()

    @staticmethod
    def partials_of(ids: np.ndarray, bounds: np.ndarray) -> list[bytes] | None:
        """The partials of consecutive groups of integer ids — group ``i`` is
        ``ids[bounds[i]:bounds[i + 1]]`` — each the group's ids as they are (a bitmap
        each costs ~3 µs a group; a slice of one buffer ~0.3 µs): :meth:`merged` makes
        the bitmap, once per key, of every partial it merges; a group of many ids (a
        hot key's: they repeat) gets its bitmap here. None when the ids are not
        integers that all fit 32 bits."""
        if ids.dtype.kind not in "iu":
            return None
        if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
            return None
        data = ids.astype("<u4").tobytes()
        head = bytes([_EXACT_IDS32])
        out = []
        for a, b in itertools.pairwise(np.asarray(bounds, dtype=np.int64).tolist()):
            if b - a <= _IDS_AS_THEY_ARE:
                out.append(head + data[4 * a : 4 * b])
            else:  # built here, in parallel tasks; smaller to ship than its ids
                bitmap = ExactIds.bytes_of(ids[a:b])
                assert bitmap is not None  # (they fit 32 bits: checked above)
                out.append(bitmap)
        return out

    @staticmethod
    def merged(values: list[bytes]) -> bytes | None:
        """The stored value of several exact values and partials of integer ids — one
        bitmap, built once — when every id fits 32 bits (a bitmap of one low bucket,
        or :meth:`partials_of`'s), else None: merge them one by one. The 64-bit
        format of one bucket of high bits 0 is that header and the 32-bit bitmap, so
        :meth:`from_bytes` reads it as any stored value."""
        if len(values) == 1 and values[0][0] == _EXACT_INT:
            return values[0]  # stored as it is
        bitmaps: list[pyroaring.BitMap] = []
        ids = array.array("I")
        for value in values:
            kind = value[0]
            if kind == _EXACT_IDS32:
                ids.frombytes(memoryview(value)[1:])
            elif kind != _EXACT_INT:
                return None
            elif value[1:13] == _ONE_LOW_BUCKET:
                bitmaps.append(pyroaring.BitMap.deserialize(value[13:]))
            elif value[1:] != _NO_BUCKETS:
                return None
        if ids:
            bitmaps.append(pyroaring.BitMap(ids))
        if len(bitmaps) > 1:  # (BitMap.union of no bitmaps raises)
            bitmaps = [pyroaring.BitMap.union(*bitmaps)]
        if not bitmaps or not bitmaps[0]:
            return bytes([_EXACT_INT]) + _NO_BUCKETS
        return bytes([_EXACT_INT]) + _ONE_LOW_BUCKET + bitmaps[0].serialize()

    @staticmethod
    def count_of(value: bytes) -> int | None:
        """How many ids a stored value holds, read without a 64-bit bitmap when they fit
        32 bits; None for other values."""
        if value[0] != _EXACT_INT:
            return None
        if value[1:13] == _ONE_LOW_BUCKET:
            return len(pyroaring.BitMap.deserialize(value[13:]))
        return 0 if value[1:] == _NO_BUCKETS else None

    @classmethod
    def from_bytes(cls, data: bytes) -> ExactIds:
        kind, payload = data[0], data[1:]
        if kind == _EXACT_INT:
            return cls(bitmap=pyroaring.BitMap64.deserialize(payload))
        if kind == _EXACT_IDS32:
            ids = np.frombuffer(payload, dtype="<u4").astype(np.int64)
            return cls().update(ids) if len(ids) else cls(bitmap=pyroaring.BitMap64())
        if kind == _EXACT_STR:
            return cls(items=set(msgpack.unpackb(payload)))
        raise CorruptStateError(f"not an exact id set (kind byte {kind})")


class AdaptiveDistinct:
    """Exact while small (<= ``threshold`` ids), HyperLogLog beyond.

    Stored as one kind byte then the payload, so one state column can hold both.
    """

    def __init__(self, threshold: int = 10_000, lg_k: int = 12) -> None:
        self.threshold = threshold
        self.lg_k = lg_k
        self._exact: ExactIds | None = ExactIds()
        self._hll: HLL | None = None

    @property
    def exact(self) -> bool:
        return self._exact is not None

    def _spill(self) -> None:
        if self._exact is not None and len(self._exact) > self.threshold:
            self._hll = self._exact.to_hll(self.lg_k)
            self._exact = None

    def update(self, ids: Ids) -> AdaptiveDistinct:
        if self._exact is not None:
            self._exact.update(ids)
            self._spill()
        else:
            assert self._hll is not None
            self._hll.update(ids)
        return self

    def merge(self, other: AdaptiveDistinct) -> AdaptiveDistinct:
        if self._exact is not None and other._exact is not None:
            self._exact.merge(other._exact)
            self._spill()
            return self
        mine = self._hll if self._hll is not None else self._as_hll()
        theirs = other._hll if other._hll is not None else other._as_hll()
        self._hll, self._exact = mine.merge(theirs), None
        return self

    def _as_hll(self) -> HLL:
        assert self._exact is not None
        return self._exact.to_hll(self.lg_k)

    def count(self) -> DistinctCount:
        if self._exact is not None:
            return self._exact.count()
        assert self._hll is not None
        return self._hll.count()

    def to_bytes(self) -> bytes:
        if self._exact is not None:
            return self._exact.to_bytes()
        assert self._hll is not None
        return bytes([_HLL]) + self._hll.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, threshold: int = 10_000, lg_k: int = 12) -> AdaptiveDistinct:
        out = cls(threshold, lg_k)
        if data[:1] == bytes([_HLL]):
            out._hll, out._exact = HLL.from_bytes(data[1:]), None
        else:
            out._exact = ExactIds.from_bytes(data)
        return out
