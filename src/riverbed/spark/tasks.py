"""riverbed's own Spark jobs — a list of work items run as tasks, and a two-stage
shuffle — on a classic session (RDDs) or over Spark Connect (DataFrames whose Python
runs on the server: ``mapInArrow``, ``repartition``). The one owner of how riverbed's
work becomes Spark tasks, so the log-native path, backfills and state moves run the
same on both.

Over Connect every item and result crosses as a pickled cell of a binary column
(PySpark's ``cloudpickle``, as the classic path pickles them too); the functions run in
the server's Python workers, which need riverbed installed as the driver does
(docs/stream.md, "Spark Connect"). Jobs there are tagged rather than grouped
(:func:`tag`, :func:`interrupt`: Connect has no job groups), carry no description, and
run no task in the driver process (the driver is not where the server's tasks run).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from riverbed.spark import is_connect
from riverbed.spark.lazy import DeferredSession, unstarted

__all__ = [
    "CONNECT_MASTER",
    "describe",
    "in_threads",
    "interrupt",
    "map_items",
    "master",
    "parallelism",
    "shuffle_job",
    "tag",
]

# what :func:`master` says of a Connect session: no task runs in this process or (as far
# as riverbed can tell) on this machine
CONNECT_MASTER = "connect"


# the driver's own task threads: a pool for each thread that hands out work (a query's
# driver thread), kept from batch to batch. (A pool a batch started its threads again
# each batch, each start waiting for the GIL behind the threads already working: ~5 %
# of a joined query's driver thread in Nexmark q4.) A pool's threads end with the
# thread that owns it (an executor no longer referenced lets its threads go).
_OWN = threading.local()


def _forget_pools() -> None:  # a forked child has none of its parent's threads
    global _OWN
    _OWN = threading.local()


os.register_at_fork(after_in_child=_forget_pools)


def in_threads(fn: Callable[[Any], Any], items: Iterable[Any], threads: int = 4) -> list[Any]:
    """``fn`` of each item, run by the calling thread's own pool (``threads`` threads,
    or as many as an earlier call of that thread asked for when more), results in the
    items' order; once every item has ended, the first failed item's exception is
    raised here (nothing of the call still runs)."""
    items = list(items)
    if len(items) <= 1 or threads <= 1:
        return [fn(i) for i in items]
    pool = getattr(_OWN, "pool", None)
    if pool is None or _OWN.size < threads:
        if pool is not None:
            pool.shutdown(wait=False)
        pool = _OWN.pool = ThreadPoolExecutor(threads, thread_name_prefix="riverbed-task")
        _OWN.size = threads
    futures = [pool.submit(fn, i) for i in items]
    wait(futures)
    return [f.result() for f in futures]


def master(spark: Any) -> str:
    """The session's master URL (:data:`CONNECT_MASTER` over Connect: the server's
    master says where its tasks run, not where this driver is)."""
    if unstarted(spark):  # a deferred session (riverbed.spark.lazy): not started for this
        return str(spark.master)
    return CONNECT_MASTER if is_connect(spark) else str(spark.sparkContext.master)


def parallelism(spark: Any) -> int:
    """How many tasks run at once: the context's default parallelism, or over Connect
    the server's ``spark.default.parallelism``, else its local master's thread count,
    else this machine's cores."""
    if unstarted(spark):
        return int(spark.parallelism)
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    found = spark.conf.get("spark.default.parallelism", None)
    if found:
        return max(1, int(found))
    local = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", str(spark.conf.get("spark.master", "")))
    return max(1, int(local.group(1)) if local else os.cpu_count() or 1)


def describe(spark: Any, text: str | None) -> None:
    """Name the next jobs in the Spark UI (classic sessions; Connect has no such call)."""
    if isinstance(spark, DeferredSession):
        spark.describe(text)  # set in this thread when it reaches the session
    elif not is_connect(spark):
        spark.sparkContext.setJobDescription(text)


def tag(spark: Any, name: str, description: str) -> None:
    """Put this thread's jobs in ``name``, so :func:`interrupt` can cancel them (a job
    group described so in the Spark UI on a classic session, a tag over Connect)."""
    if isinstance(spark, DeferredSession):
        spark.tag(name, description)  # set in this thread when it reaches the session
    elif is_connect(spark):
        spark.addTag(name)
    else:
        spark.sparkContext.setJobGroup(name, description, interruptOnCancel=True)


def interrupt(spark: Any, name: str) -> None:
    """Cancel the running jobs :func:`tag` put in ``name``."""
    if unstarted(spark):
        return  # no job ever ran
    if is_connect(spark):
        spark.interruptTag(name)
    else:
        spark.sparkContext.cancelJobGroup(name)


def _pickle() -> Any:
    from pyspark import cloudpickle

    return cloudpickle


def _items_frame(spark: Any, items: Sequence[Any]) -> Any:
    """``items`` as a DataFrame of (index, pickled item), one partition per item."""
    import pandas as pd

    pickle = _pickle()
    frame = pd.DataFrame({"i": range(len(items)), "item": [pickle.dumps(x) for x in items]})
    df = spark.createDataFrame(frame, schema="i long, item binary")
    return df.repartitionByRange(len(items), "i")


def map_items(spark: Any, items: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``[fn(x) for x in items]``, each item a Spark task, in order."""
    if not items:
        return []
    if not is_connect(spark):
        return list(spark.sparkContext.parallelize(list(items), len(items)).map(fn).collect())
    pickle = _pickle()

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            out = [
                (i, pickle.dumps(fn(pickle.loads(item))))
                for i, item in zip(
                    batch.column("i").to_pylist(), batch.column("item").to_pylist(), strict=True
                )
            ]
            yield pa.RecordBatch.from_pydict(
                {"i": [i for i, _ in out], "out": [o for _, o in out]},
                schema=pa.schema([("i", pa.int64()), ("out", pa.binary())]),
            )

    rows = _items_frame(spark, items).mapInArrow(run, "i long, out binary").collect()
    return [pickle.loads(r["out"]) for r in sorted(rows, key=lambda r: r["i"])]


def shuffle_job(
    spark: Any,
    work: list[Any],
    nothing: Any,
    stage1: Callable[[Any], list[tuple[int, Any]]],
    n: int,
    merge: Callable[[int, Iterator[Any]], Any],
) -> tuple[list[Any], list[Any]]:
    """A shuffled job of two stages: ``stage1`` maps each piece of ``work`` (``nothing``
    when there is none: the second stage runs all the same) to (state partition, value)
    pairs and one (``n``, report) pair; the values are brought together by partition,
    every partition *p* < ``n`` — also one without values — is merged by ``merge(p,
    values)``, and partition ``n`` is the driver's channel. Returns the merges' results
    and every report.

    Classic: an RDD ``partitionBy(n + 1)`` (AQE never coalesces it: a task per
    partition). Connect: ``repartition(n + 1, "p")`` of (p, value) rows, with one empty
    row per partition so every one is merged; a task merges each partition it holds
    (AQE may give one task several)."""
    if not is_connect(spark):
        shuffled = (
            spark.sparkContext.parallelize(work or [nothing], max(1, len(work)))
            .flatMap(stage1)
            .partitionBy(n + 1, lambda p: p)
        )

        def by_index(index: int, items: Iterator[tuple[int, Any]]) -> Iterator[tuple[str, Any]]:
            if index == n:  # the driver's channel
                yield ("reports", [v for _, v in items])
            else:
                yield ("merged", merge(index, (v for _, v in items)))

        found = shuffled.mapPartitionsWithIndex(by_index).collect()
    else:
        found = _connect_shuffle(spark, work, nothing, stage1, n, merge)
    return _split(found)


def _split(found: list[tuple[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The merges' results and every report, from a shuffle's (kind, value) results."""
    merged: list[Any] = []
    reports: list[Any] = []
    for kind, value in found:
        if kind == "merged":
            merged.append(value)
        else:
            reports += value
    return merged, reports


def _connect_shuffle(
    spark: Any,
    work: list[Any],
    nothing: Any,
    stage1: Callable[[Any], list[tuple[int, Any]]],
    n: int,
    merge: Callable[[int, Iterator[Any]], Any],
) -> list[tuple[str, Any]]:
    """:func:`shuffle_job` over Connect: its (kind, value) results."""
    pickle = _pickle()

    def first(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        schema = pa.schema([("p", pa.int64()), ("v", pa.binary())])
        for batch in batches:
            for i, item in zip(
                batch.column("i").to_pylist(), batch.column("item").to_pylist(), strict=True
            ):
                out = [(p, pickle.dumps(v)) for p, v in stage1(pickle.loads(item))]
                if i == 0:  # every partition appears once, values or not
                    out += [(p, None) for p in range(n + 1)]
                yield pa.RecordBatch.from_pydict(
                    {"p": [p for p, _ in out], "v": [v for _, v in out]}, schema=schema
                )

    staged = _items_frame(spark, work or [nothing]).mapInArrow(first, "p long, v binary")
    return _by_partition(staged, n, merge)


def _by_partition(
    staged: Any, n: int, merge: Callable[[int, Iterator[Any]], Any]
) -> list[tuple[str, Any]]:
    """The second stage of a shuffle over DataFrames: ``staged``'s (p, pickled value)
    rows — every partition 0..n among them at least once, a null value for none —
    brought together by partition and merged; partition ``n``'s values are reports."""
    pickle = _pickle()

    def second(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        held: dict[int, list[bytes]] = {}
        for batch in batches:
            for p, v in zip(
                batch.column("p").to_pylist(), batch.column("v").to_pylist(), strict=True
            ):
                values = held.setdefault(int(p), [])
                if v is not None:
                    values.append(v)
        kinds, outs = [], []
        for p, values in sorted(held.items()):
            loaded = (pickle.loads(v) for v in values)
            if p == n:
                kinds.append("reports")
                outs.append(pickle.dumps(list(loaded)))
            else:
                kinds.append("merged")
                outs.append(pickle.dumps(merge(p, loaded)))
        yield pa.RecordBatch.from_pydict(
            {"kind": kinds, "out": outs},
            schema=pa.schema([("kind", pa.string()), ("out", pa.binary())]),
        )

    rows = staged.repartition(n + 1, "p").mapInArrow(second, "kind string, out binary").collect()
    return [(row["kind"], pickle.loads(row["out"])) for row in rows]


def frame_shuffle(
    spark: Any,
    staged: Any,
    n: int,
    merge: Callable[[int, Iterator[Any]], Any],
) -> tuple[list[Any], list[Any]]:
    """:func:`shuffle_job` whose first stage is a DataFrame's own (``staged``: (p long,
    v binary) rows, each value pickled — a ``mapInArrow`` over the DataFrame's rows):
    every partition *p* < ``n`` is merged, values or not; partition ``n``'s values are
    the reports. Classic and Connect alike."""
    every = spark.createDataFrame([(p, None) for p in range(n + 1)], "p long, v binary")
    return _split(_by_partition(staged.unionByName(every), n, merge))
