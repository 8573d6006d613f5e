"""Exactly once from a consumer group's partitions to a topic: :func:`transform`.

For each input partition the member owns, batch after batch:

1. **plan** — the batch's end goes into the partition's offset record beside the
   committed offset, fenced by the claim like every commit: ``[offset, pending)``;
2. **produce** — the handler's outputs for those records go to the output topic, one
   append per output partition, under this input partition's producer id and the
   batch's first offset as the sequence;
3. **commit** — the offset moves to the batch's end; the plan is cleared with it.

A member killed after 1 or during 2 leaves the plan: the partition's next owner (or the
member, restarted) produces exactly that batch again under the same producer id and
sequence, and the output topic writes only the appends it had not written — diskless
topics recognise a retried (producer, sequence) (:meth:`~riverbed.log.LogStorage.
append_once`, recorded in the append's own control-plane transaction). A member that
lost its claim (a zombie) can neither plan nor commit; an append it still makes of a
planned batch is the same append the new owner makes, written once.

So every output is written once and none is lost — **provided the handler gives the same
outputs for the same records** (no clock, no randomness in what it returns): the batch
replayed after a crash must be the batch that was partly written. The output topic must
be one whose log recognises retried appends: diskless topics (``s3://…``, or servers of
them), typed or not (a typed topic's outputs are checked against its schema before
anything of the batch is produced: a value that does not fit stops the transform with
the error, nothing of that batch written).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from riverbed.log.base import Sender
from riverbed.log.errors import LogValueError, OffsetOutOfRangeError
from riverbed.log.group.assignors import TopicPartition
from riverbed.log.records import Record

if TYPE_CHECKING:
    from riverbed.log.group.consumer import Consumer, _Owned

__all__ = ["producer_id", "transform"]


def producer_id(group: str, tp: TopicPartition) -> str:
    """The producer id of one input partition's outputs (at most 64 characters, no '/')."""
    digest = hashlib.sha256(f"{group}/{tp[0]}/{tp[1]}".encode()).hexdigest()[:32]
    return f"xf-{digest}"


def transform(
    consumer: Consumer,
    handler: Callable[[Record], Iterable[Any] | None],
    output: str,
    *,
    key_field: str | None = None,
    stop: threading.Event | None = None,
    max_records: int = 100,
    idle_wait: float = 0.05,
) -> None:
    """Until ``stop`` is set: ``handler(record)`` returns the values to write to
    ``output`` for each record (an iterable, or None), and each is written there once
    however members are killed or partitions move — given the same outputs for the same
    records (see the module doc). ``key_field``: the output values' key, which places them
    by the output topic's partitioner."""
    storage = consumer.log.storage
    if not storage.idempotent:
        raise LogValueError(
            f"exactly-once output needs a log that recognises a retried append — diskless "
            f"topics (s3://bucket/prefix, or their log servers); {storage.url} does not"
        )
    out = consumer.log.producer(output)
    stop = stop or threading.Event()
    while not stop.is_set():
        consumer._check()
        for tp in consumer._revoked():
            consumer._release(tp)
        with consumer._cond:
            ready = [
                (tp, o) for tp, o in sorted(consumer._owned.items()) if tp in consumer._assigned
            ]
        worked = False
        for tp, owned in ready:
            if stop.is_set():
                break
            worked |= _step(consumer, tp, owned, handler, out, key_field, max_records)
        if not worked:
            consumer._idle(idle_wait)


def _step(
    consumer: Consumer,
    tp: TopicPartition,
    owned: _Owned,
    handler: Callable[[Record], Iterable[Any] | None],
    out: Sender,
    key_field: str | None,
    max_records: int,
) -> bool:
    """One batch of one partition: planned (or the plan found), produced, committed.
    False when there was nothing to do (or the claim was lost)."""
    start = owned.committed
    end = owned.pending if owned.pending is not None and owned.pending > start else None
    try:
        if end is None:  # a new batch: plan it before anything of it is produced
            records = consumer.log.read(tp[0], tp[1], start, max_records)
            if not records:
                return False
            end = records[-1].offset + 1
            if not consumer._commit_one(tp, owned, start, pending=end):
                return False  # the claim is lost: the next owner takes it from here
        else:  # a planned batch a crash interrupted: exactly that batch again
            records = _read_range(consumer, tp, start, end)
    except OffsetOutOfRangeError:  # retention removed them: go on from the first kept
        first = consumer.log.storage.offsets(*tp)[0]
        consumer._commit_one(tp, owned, first)
        owned.position = first
        return True
    outputs: list[Any] = []
    for record in records:
        outputs.extend(handler(record) or ())
    if outputs:
        producer = producer_id(consumer.group, tp)
        for partition, batch in out.batches(outputs, key_field):
            consumer.log.storage.append_once(out.topic, partition, batch, producer, start)
    if consumer._commit_one(tp, owned, end):
        owned.position = end
    return True


def _read_range(consumer: Consumer, tp: TopicPartition, start: int, end: int) -> list[Record]:
    records: list[Record] = []
    at = start
    while at < end:
        got = consumer.log.read(tp[0], tp[1], at, end - at)
        if not got:
            break
        records.extend(r for r in got if r.offset < end)
        at = got[-1].offset + 1
    return records
