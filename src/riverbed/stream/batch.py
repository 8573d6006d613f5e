"""How a batch ends, for both paths — the log-native one (:mod:`riverbed.stream.lognative`)
and the DataFrame one (:mod:`riverbed.stream.dataframe`): the side topics (late and
malformed records), then :func:`finish` — the result table, the optional sinks (a SQL
table, a results topic) and the batch record marked done (:func:`finish_batch`), with
the periodic :func:`maintain`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import pandas as pd
import pyarrow as pa

from riverbed.state import StateProvider
from riverbed.stream.batchlog import COUNTS, Batches, BatchRecord, summed_totals
from riverbed.stream.engine import EngineConfig
from riverbed.stream.fencing import DriverFencedError
from riverbed.stream.rescale import retire
from riverbed.stream.results import compact_output, write_output
from riverbed.stream.sinks import plain

log = logging.getLogger(__name__)

SIDE_LIMIT = 100_000  # late / malformed records written per batch to the side topics


class SideTopics(Protocol):
    """What writing a query's side topics needs of it: an aggregation's
    :class:`~riverbed.stream.engine.EngineConfig`, a join's ``JoinConfig``."""

    @property
    def name(self) -> str: ...  # the topics are <name>.dlq and <name>.late

    @property
    def log_url(self) -> str | None: ...

    def fence(self) -> None: ...


def side_outputs(
    config: SideTopics,
    batch_id: int,
    batches: Batches,
    dlq: pd.DataFrame | None,
    late: pd.DataFrame | None,
) -> None:
    """Write up to SIDE_LIMIT records each to <name>.dlq and <name>.late, once per batch."""
    if all(frame is None or frame.empty for frame in (dlq, late)):
        return
    if config.log_url is None or side_outputs_written(batches, batch_id):
        return
    config.fence()
    import riverbed.log

    log_ = riverbed.log.open(config.log_url)
    try:
        for suffix, frame in ((".dlq", dlq), (".late", late)):
            if frame is None or frame.empty:
                continue
            topic = config.name + suffix
            if topic not in log_.topics():
                log_.create_topic(topic, 1)
            log_.producer(topic).send_batch(
                [
                    {k: plain(v) for k, v in row.items()} | {"batch_id": batch_id}
                    for row in frame.head(SIDE_LIMIT).to_dict("records")
                ]
            )
    finally:
        log_.close()
    batches.update(batch_id, side_outputs_written=True)


def side_outputs_written(batches: Batches, batch_id: int) -> bool:
    """Whether this batch's late and malformed records went to their topics already
    (a re-run of the batch writes them once)."""
    record = batches.get(batch_id)
    return record is not None and record.side_outputs_written


def publish(config: EngineConfig, batch_id: int, rows: pd.DataFrame) -> None:
    """The batch's rows to the sinks besides the result table (riverbed.stream.doors),
    each after a fence check of its own: a driver paused while it wrote the result
    table, and replaced, stops here instead of writing the sinks."""
    for sink in config.sinks:
        config.fence()
        sink.write(config, batch_id, rows)


class Maintenance:
    """:func:`maintain` off a driver's batch loop: one round at a time in a thread of
    its own, so the purge and the result table's compaction (~150 ms every 100
    batches here) do not lengthen the trigger they fall in. A round due while the last
    one still runs is kept — only the newest such, since a round after a later batch
    purges all an earlier one would — and runs as soon as that one ends, so the
    records and snapshots kept stay within ``retain_versions`` + ``snapshot_every``
    however fast batches come; :meth:`wait` before the loop ends runs it too."""

    def __init__(
        self, name: str, run: Callable[[EngineConfig, Batches, int], None] | None = None
    ) -> None:
        self.name = name
        self._run = run or maintain_beside
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next: tuple[EngineConfig, Batches, int] | None = None  # due while one runs

    def submit(self, config: EngineConfig, batches: Batches, batch_id: int) -> bool:
        """Start a round after ``batch_id``; False when one still runs, and this one
        follows it (replacing any older one waiting)."""
        with self._lock:
            if self._thread is not None:
                if self._next is not None:
                    log.info(
                        "maintenance of %s after batch %d folded into the one after %d",
                        self.name,
                        self._next[2],
                        batch_id,
                    )
                self._next = (config, batches, batch_id)
                return False
            self._thread = threading.Thread(
                target=self._rounds,
                args=(config, batches, batch_id),
                name=f"riverbed-maintain-{self.name}",
                daemon=True,
            )
            self._thread.start()
            return True

    def _rounds(self, config: EngineConfig, batches: Batches, batch_id: int) -> None:
        round_: tuple[EngineConfig, Batches, int] | None = (config, batches, batch_id)
        while round_ is not None:
            try:
                self._run(*round_)
            except DriverFencedError:  # the loop stops on its next write, and says why
                log.info("maintenance of %s: a newer driver took over", self.name)
            except Exception:  # maintain() logs its own; a round must not end the thread
                log.exception("maintenance of %s after batch %d failed", self.name, round_[2])
            with self._lock:
                round_, self._next = self._next, None
                if round_ is None:
                    self._thread = None

    def wait(self) -> None:
        """Return once no round runs or waits."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()


def finish(
    config: EngineConfig,
    batches: Batches,
    batch_id: int,
    record: BatchRecord,
    rows: pd.DataFrame | pa.Table,
    *,
    outputs_from: float | None = None,
    maintenance: Maintenance | None = None,
    emitted: Callable[[pa.Table], None] | None = None,
) -> None:
    """The end of every batch, whichever path ran it — the one place it is written:

    1. check the driver's fence: a replaced driver publishes nothing;
    2. store the result table's file of the batch (atomic, once: a re-run's same rows
       leave it, :func:`~riverbed.stream.results.store_batch`);
    3. upsert into the SQL table and append to the results topic, if asked (both
       idempotent per batch id);
    4. mark the batch record done, with running totals — the commit — and every
       ``snapshot_every`` batches run the maintenance (:func:`finish_batch`).

    With ``outputs_from`` (a ``time.perf_counter()`` reading), the time since then is
    recorded as the batch's ``ms.outputs``; with ``maintenance``, the maintenance runs
    there, in the background. ``emitted`` is given the rows as the result table holds
    them, before the commit (an aggregation reading them in the same driver:
    :mod:`riverbed.stream.chain`)."""
    config.fence()
    written = write_output(config.output, config.spec, batch_id, rows, fence=config.fence)
    if config.sinks:
        publish(config, batch_id, rows if isinstance(rows, pd.DataFrame) else written.to_pandas())
    if emitted is not None:
        emitted(written)
    if outputs_from is not None:
        record.ms["outputs"] = round((time.perf_counter() - outputs_from) * 1000)
    finish_batch(config, batches, batch_id, record, maintenance)


def finish_batch(
    config: EngineConfig,
    batches: Batches,
    batch_id: int,
    record: BatchRecord,
    maintenance: Maintenance | None = None,
) -> None:
    """Record the batch as done (durably, before Spark commits it: the next batch's
    watermark comes from it), with running totals; then, every ``snapshot_every``
    batches, run :func:`maintain` (in ``maintenance``'s thread, if given)."""
    prev = batches.previous(batch_id)
    if prev is not None and prev.totals is not None:
        totals = dict(prev.totals)
    else:  # the first batch, or records from before totals existed: count them once
        totals = summed_totals(
            r for b in batches.ids() if b < batch_id and (r := batches.get(b)) is not None
        )
    for c in COUNTS:
        totals[c] = int(totals.get(c, 0)) + record.counted(c)
    if record.unmatched is not None:  # only aggregations with lookups count it
        totals["unmatched"] = int(totals.get("unmatched", 0)) + record.unmatched
    totals["batches"] = int(totals.get("batches", 0)) + 1
    term = config.term if config.term is not None else record.term  # which driver ran it
    batches.put(batch_id, replace(record, term=term, done=True, totals=totals))
    if (batch_id + 1) % config.state.snapshot_every == 0:
        if maintenance is not None:
            # the sweep of snapshot files no manifest names runs here, between batches: a
            # snapshot written beside it may reuse such a file before its manifest names it
            sweep_state(config)
            maintenance.submit(config, batches, batch_id)
        else:
            maintain(config, batches, batch_id)


def sweep_state(config: EngineConfig) -> None:
    """Sweep every state partition's leftovers (:meth:`StateProvider.sweep`); on the
    driver, between batches. A failure is logged, never fails the query."""
    config.fence()
    try:
        provider = StateProvider(config.state)
        for partition in range(config.spec.state_partitions):
            provider.sweep(config.namespace, partition)
    except Exception as exc:  # maintenance must not stop the query
        log.warning("sweep of %s failed (retried next round): %s", config.spec.name, exc)


def maintain_beside(config: EngineConfig, batches: Batches, batch_id: int) -> None:
    """:func:`maintain` in :class:`Maintenance`'s thread, beside the next batches: all
    of it but the sweep, which :func:`finish_batch` ran between batches."""
    maintain(config, batches, batch_id, sweep=False)


def maintain(config: EngineConfig, batches: Batches, batch_id: int, sweep: bool = True) -> None:
    """Purge state snapshots and changelogs, and batch records, that no version among
    the newest ``retain_versions`` needs, and compact the result table
    (:func:`compact_output`). Runs on the driver without opening any state
    partition, so it never competes with the state tasks; a failure is logged and
    retried at the next round, never fails the query."""
    spec = config.spec
    config.fence()  # a replaced driver purges nothing
    try:
        provider = StateProvider(config.state)
        for partition in range(spec.state_partitions):
            provider.purge(config.namespace, partition, sweep_after=3600.0 if sweep else None)
        batches.prune(batch_id + 1 - config.state.retain_versions)
        # a rescale's old state generation, once no retained version lives in it, and
        # what a move killed before its switch left
        for space in retire(
            config.checkpoint, provider, spec.name, batch_id + 1 - config.state.retain_versions
        ):
            log.info(
                "state of %s: old generation %s deleted (no retained version needs it)",
                spec.name,
                space,
            )
        if batch_id > 0:  # the batch before this one is committed: fold the table into it
            compact_output(config.output, spec, batch_id - 1)
    except Exception as exc:  # maintenance must not stop the query
        log.warning(
            "maintenance of %s after batch %d failed (retried in %d batches): %s",
            spec.name,
            batch_id,
            config.state.snapshot_every,
            exc,
        )


__all__ = [
    "SIDE_LIMIT",
    "Maintenance",
    "finish",
    "finish_batch",
    "maintain",
    "maintain_beside",
    "publish",
    "side_outputs",
    "side_outputs_written",
    "sweep_state",
]
