"""Consumer groups: membership, assignment, claims and fenced offsets on the control plane.

(Over 600 lines: one member's protocol — join, lead, assign, claim, fetch, commit — is
one state shared by its threads; the pure parts already live in ``assignors.py``.)

Keys (``G`` = the group)::

    riverbed/registry/log.G/<member>          membership, on the member's session lease
    riverbed/election/log.G/<lease>           the member that computes assignments
    riverbed/loggroup/G/assignment            {"generation": n, "owners": {"topic:p": member}}
    riverbed/loggroup/G/claim/<topic>/<p>     the member processing a partition, on its lease
    riverbed/loggroup/G/offset/<topic>/<p>    {"offset": next to process, "member", "generation"}

Protocol:

1. each member registers and campaigns; the elected member watches membership and
   topic sizes and writes a new assignment (fenced by its election term) whenever the
   assignor's answer changes — on join, leave, death (lease expiry) and new partitions;
2. each member watches the assignment. A partition assigned to it is taken by
   *creating* its claim key (create-if-absent), so **no partition ever has two
   owners**. A partition assigned away is finished, committed and released by its
   owner (cooperative: only moved partitions stop); if the owner died, its claim
   vanishes with its lease. The new owner claims it then, and starts at the
   committed offset;
3. an offset commit is a transaction guarded by the claim's create revision (the
   fencing token): a member that lost its claim — a zombie — cannot commit.

Delivery is **at least once**: offsets are committed after records are processed;
a crash between processing and commit replays those records to the next owner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from riverbed.control import (
    Compare,
    ControlError,
    ControlPlane,
    Delete,
    Election,
    Put,
    Registry,
    Session,
)
from riverbed.durations import epoch_ms
from riverbed.log.base import TopicLog
from riverbed.log.errors import GroupError, LogValueError, OffsetOutOfRangeError
from riverbed.log.group.assignors import ASSIGNORS, Assignor, TopicPartition
from riverbed.log.records import Record

log = logging.getLogger(__name__)
_STORAGE_WAIT_S = 0.25  # longest wait on a storage that wakes consumers on appends


def _tp_name(tp: TopicPartition) -> str:
    return f"{tp[0]}:{tp[1]}"


def _tp_parse(name: str) -> TopicPartition:
    topic, _, p = name.rpartition(":")
    return topic, int(p)


def _read_assignment(cp: ControlPlane, key: str) -> tuple[int, dict[str, str]]:
    """(generation, {"topic:p": member}) of the group's current assignment."""
    current = cp.get(key)
    if current is None:
        return 0, {}
    doc = json.loads(current.value)
    return int(doc["generation"]), dict(doc["owners"])


class _Keys:
    def __init__(self, group: str) -> None:
        if not group or "/" in group or ":" in group:
            raise LogValueError(f"group name {group!r} must be non-empty without '/' or ':'")
        self.group = group
        self.prefix = f"riverbed/loggroup/{group}/"
        self.assignment = self.prefix + "assignment"
        self.registry = f"log.{group}"

    def claim(self, tp: TopicPartition) -> str:
        return f"{self.prefix}claim/{tp[0]}/{tp[1]}"

    def offset(self, tp: TopicPartition) -> str:
        return f"{self.prefix}offset/{tp[0]}/{tp[1]}"


@dataclass
class _Owned:
    claim_revision: int
    position: int
    committed: int
    busy: bool = False  # a run() task is processing it
    # a transform's batch [committed, pending) planned and maybe produced, not committed
    # (riverbed.log.group.transform): the next owner produces exactly that batch again
    pending: int | None = None


@dataclass(frozen=True)
class PartitionState:
    topic: str
    partition: int
    owner: str | None
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return self.end - (self.committed or 0)


@dataclass(frozen=True)
class GroupDescription:
    group: str
    generation: int
    members: list[str]
    leader: str | None
    partitions: list[PartitionState] = field(default_factory=list)


class Consumer:
    """One member of a consumer group. Use as a context manager; see the module doc."""

    def __init__(
        self,
        log: TopicLog,
        cp: ControlPlane,
        group: str,
        topics: Sequence[str],
        *,
        member_id: str | None = None,
        assignor: str | Assignor = "range",
        session_ttl: int = 10,
        start_from: Literal["earliest", "latest"] = "earliest",
        metadata_interval: float = 1.0,
    ) -> None:
        self.log = log
        self.cp = cp
        self.keys = _Keys(group)
        self.group = group
        self.topics = list(topics)
        for topic in self.topics:
            log.topic(topic)  # TopicNotFoundError names the fix
        if isinstance(assignor, str):
            if assignor not in ASSIGNORS:
                raise LogValueError(
                    f"unknown assignor {assignor!r}; use one of {', '.join(sorted(ASSIGNORS))} "
                    "or pass a function"
                )
            assignor = ASSIGNORS[assignor]
        self._assign = assignor
        self.start_from = start_from
        self.metadata_interval = metadata_interval
        self.member_id = member_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.session = Session(cp, ttl=session_ttl)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._assigned: set[TopicPartition] = set()
        self._owned: dict[TopicPartition, _Owned] = {}
        self._generation = 0
        self._threads: list[threading.Thread] = []
        self._failure: str | None = None  # a background thread's error, once one failed
        try:
            Registry(cp, self.keys.registry).register(
                self.session,
                self.member_id,
                {"topics": self.topics, "pid": os.getpid(), "host": socket.gethostname()},
            )
        except BaseException:
            self.session.close()
            raise
        self.election = Election(cp, self.keys.registry, self.session)
        for target, name in ((self._lead, "leader"), (self._follow, "member")):
            thread = threading.Thread(
                target=self._guard(target, name),
                name=f"riverbed-group-{group}-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _guard(self, fn: Callable[[], None], name: str) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:
                if not self._stop.is_set():
                    log.exception("consumer %s: %s thread failed", self.member_id, name)
                    self._failure = f"its {name} thread failed: {type(exc).__name__}: {exc}"
                    self.session.lost.set()
                    with self._cond:
                        self._cond.notify_all()

        return run

    # -- the elected member: compute assignments -----------------------------------------
    def _partitions(self, topics: set[str]) -> list[TopicPartition]:
        out: list[TopicPartition] = []
        for topic in sorted(topics):
            with contextlib.suppress(Exception):
                out.extend((topic, p) for p in range(self.log.topic(topic).partitions))
        return out

    def _lead(self) -> None:
        try:
            # Waits in line (watching only its predecessor) until elected; ends with
            # SessionLostError when close() ends the session.
            term = self.election.campaign(self.member_id)
        except ControlError:
            return
        registry = Registry(self.cp, self.keys.registry)
        election_key = self.election.prefix + f"{self.session.lease:x}".encode()
        log.info("consumer %s leads group %s (term %d)", self.member_id, self.group, term)
        members, rev = registry.snapshot()
        with self.cp.watch(registry.prefix, prefix=True, start_revision=rev + 1) as watch:
            while not self._stop.is_set() and self.session.alive:
                members, _ = registry.snapshot()
                topics = {t for m in members for t in m.metadata.get("topics", [])}
                generation, owners = _read_assignment(self.cp, self.keys.assignment)
                previous = {_tp_parse(k): v for k, v in owners.items()}
                wanted = self._assign([m.id for m in members], self._partitions(topics), previous)
                if wanted != previous:
                    new = {
                        "generation": generation + 1,
                        "owners": {_tp_name(tp): m for tp, m in sorted(wanted.items())},
                    }
                    ok = self.cp.txn(
                        [Compare.create(election_key) == term],
                        [Put.of(self.keys.assignment, json.dumps(new))],
                    ).succeeded
                    if not ok:
                        log.warning("consumer %s lost the group lead", self.member_id)
                        return
                # membership changed, or time to look for new partitions
                watch.get(timeout=self.metadata_interval)

    # -- every member: follow the assignment, claim and release ---------------------------
    def _follow(self) -> None:
        with self.cp.watch(self.keys.prefix, prefix=True) as watch:
            while not self._stop.is_set() and self.session.alive:
                generation, owners = _read_assignment(self.cp, self.keys.assignment)
                mine = {_tp_parse(k) for k, m in owners.items() if m == self.member_id}
                with self._cond:
                    self._assigned = mine
                    self._generation = generation
                    wanted = [tp for tp in mine if tp not in self._owned]
                for tp in sorted(wanted):
                    self._try_claim(tp)
                with self._cond:
                    self._cond.notify_all()
                watch.get(timeout=0.5)
                while watch.get(timeout=0) is not None:  # coalesce a burst of changes
                    pass

    def _try_claim(self, tp: TopicPartition) -> None:
        key = self.keys.claim(tp)
        result = self.cp.txn(
            [Compare.version(key) == 0], [Put.of(key, self.member_id, self.session.lease)]
        )
        if not result.succeeded:
            return  # still held by the previous owner; retried when it is released
        committed_kv = self.cp.get(self.keys.offset(tp))
        pending = None
        if committed_kv is not None:
            recorded = json.loads(committed_kv.value)
            committed, pending = int(recorded["offset"]), recorded.get("pending")
        else:
            start, end = self.log.storage.offsets(*tp)
            committed = start if self.start_from == "earliest" else end
        with self._cond:
            self._owned[tp] = _Owned(
                result.revision,
                committed,
                committed,
                pending=None if pending is None else int(pending),
            )
            log.info("consumer %s claimed %s at offset %d", self.member_id, tp, committed)
            self._cond.notify_all()

    # -- commits and releases --------------------------------------------------------------
    def _commit_one(
        self, tp: TopicPartition, owned: _Owned, offset: int, pending: int | None = None
    ) -> bool:
        """Commit ``offset`` (fenced by the claim); with ``pending``, record the batch
        [offset, pending) as planned (a transform's write-ahead) at the same time."""
        if offset <= owned.committed and pending is None:
            return True
        record: dict[str, object] = {
            "offset": offset,
            "member": self.member_id,
            "generation": self._generation,
        }
        if pending is not None:
            record["pending"] = pending
        value = json.dumps(record)
        claim = self.keys.claim(tp)
        ok = self.cp.txn(
            [Compare.create(claim) == owned.claim_revision, Compare.value(claim) == self.member_id],
            [Put.of(self.keys.offset(tp), value)],
        ).succeeded
        if ok:
            owned.committed, owned.pending = offset, pending
        else:
            log.warning("consumer %s lost its claim on %s; commit rejected", self.member_id, tp)
            with self._cond:
                self._owned.pop(tp, None)
        return ok

    def _release(self, tp: TopicPartition) -> None:
        with self._cond:
            owned = self._owned.get(tp)
        if owned is None:
            return
        self._commit_one(tp, owned, owned.position)
        claim = self.keys.claim(tp)
        self.cp.txn([Compare.create(claim) == owned.claim_revision], [Delete.of(claim)])
        with self._cond:
            self._owned.pop(tp, None)
            self._cond.notify_all()
        log.info("consumer %s released %s at offset %d", self.member_id, tp, owned.position)

    def _revoked(self) -> list[TopicPartition]:
        with self._cond:
            return [tp for tp, o in self._owned.items() if tp not in self._assigned and not o.busy]

    def commit(self) -> None:
        """Commit the position of every owned partition (records returned so far)."""
        with self._cond:
            items = list(self._owned.items())
        for tp, owned in items:
            self._commit_one(tp, owned, owned.position)

    def assignment(self) -> set[TopicPartition]:
        """Partitions this member owns (claimed) right now."""
        with self._cond:
            return set(self._owned)

    def positions(self) -> dict[TopicPartition, int]:
        with self._cond:
            return {tp: o.position for tp, o in self._owned.items()}

    # -- poll API --------------------------------------------------------------------------
    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        """Records from owned partitions (each in order). Calling poll again means the
        records it returned before were processed: their offsets are committed then."""
        self._check()
        self.commit()
        for tp in self._revoked():
            self._release(tp)
        deadline = time.monotonic() + timeout
        while True:
            out = self._fetch(max_records)
            if out or time.monotonic() >= deadline:
                return out
            pause = _STORAGE_WAIT_S if self.log.storage.waits else 0.05
            wait = min(pause, max(0.0, deadline - time.monotonic()))
            if self._one_waiting_partition():
                # one read that waits for the append and returns it: a log server
                # answers in one round trip, not a wait and then a read
                out = self._fetch(max_records, wait=wait)
                if out:
                    return out
            else:
                self._idle(wait)
            for tp in self._revoked():
                self._release(tp)

    def _one_waiting_partition(self) -> bool:
        """Whether this member reads one partition, not being processed, from a storage
        that can wait for an append."""
        with self._cond:
            owned = [o for tp, o in self._owned.items() if tp in self._assigned]
        return self.log.storage.waits and len(owned) == 1 and not owned[0].busy

    def _fetch(self, max_records: int, skip_busy: bool = False, wait: float = 0) -> list[Record]:
        with self._cond:
            targets = [
                (tp, o)
                for tp, o in sorted(self._owned.items())
                if tp in self._assigned and not (skip_busy and o.busy)
            ]
        out: list[Record] = []
        for tp, owned in targets:
            if len(out) >= max_records:
                break
            try:
                records = self.log.read(
                    tp[0], tp[1], owned.position, max_records - len(out), wait=wait
                )
            except OffsetOutOfRangeError:
                start, _ = self.log.storage.offsets(*tp)
                log.warning(
                    "%s: offset %d was removed by retention; skipping to %d",
                    tp,
                    owned.position,
                    start,
                )
                owned.position = start
                continue
            if records:
                owned.position = records[-1].offset + 1
                out.extend(records)
        return out

    def _idle(self, wait: float) -> None:
        """Nothing to read: wait for an append to an owned partition where the storage
        can say (a log server, memory), else ``wait`` seconds or a rebalance."""
        storage = self.log.storage
        with self._cond:
            owned = [(tp, o) for tp, o in self._owned.items() if tp in self._assigned]
            if not storage.waits or not owned or any(o.busy for _, o in owned):
                # a partition being processed frees itself through this condition
                self._cond.wait(wait)
                return
        # an append wakes this; a rebalance is seen when it ends
        storage.wait({tp: o.position for tp, o in owned}, wait)

    def _check(self) -> None:
        if self._stop.is_set():
            raise GroupError(f"consumer {self.member_id} is closed")
        if self._failure is not None:
            raise GroupError(
                f"consumer {self.member_id} stopped ({self._failure}); create a new one"
            )
        if not self.session.alive:
            why = self.session.lost_reason or "lease expired"
            raise GroupError(
                f"consumer {self.member_id} lost its session ({why}); create a new one"
            )

    # -- processing API ----------------------------------------------------------------------
    def run(
        self,
        handler: Callable[[Record], Any],
        *,
        max_workers: int = 4,
        retries: int = 3,
        backoff: float = 0.1,
        dead_letter: str | None = None,
        stop: threading.Event | None = None,
        max_records: int = 100,
        idle_wait: float = 0.05,
    ) -> None:
        """Process records until ``stop`` is set (or the session is lost).

        Partitions are processed in parallel (at most ``max_workers`` at once), each in
        order. A record whose handler raises is retried ``retries`` times with
        exponential ``backoff`` — the partition waits, so its order is kept — and then
        sent to the ``dead_letter`` topic (with the error and its source coordinates in
        headers) or, without one, the error is raised. Offsets are committed after each
        processed batch.
        """
        stop = stop or threading.Event()
        dlq = self.log.producer(dead_letter) if dead_letter else None
        errors: list[BaseException] = []
        with ThreadPoolExecutor(max_workers, thread_name_prefix="riverbed-consume") as pool:
            futures: list[Future[None]] = []
            while not stop.is_set() and not errors:
                self._check()
                for tp in self._revoked():
                    self._release(tp)
                with self._cond:
                    ready = [
                        (tp, o)
                        for tp, o in sorted(self._owned.items())
                        if tp in self._assigned and not o.busy
                    ]
                started = False
                for tp, owned in ready:
                    try:
                        records = self.log.read(tp[0], tp[1], owned.position, max_records)
                    except OffsetOutOfRangeError:
                        owned.position = self.log.storage.offsets(*tp)[0]
                        continue
                    if not records:
                        continue
                    owned.busy = True
                    futures.append(
                        pool.submit(
                            self._process,
                            tp,
                            owned,
                            records,
                            handler,
                            retries,
                            backoff,
                            dlq,
                            errors,
                        )
                    )
                    started = True
                futures = [f for f in futures if not f.done()]
                if not started:
                    waits = self.log.storage.waits
                    self._idle(max(idle_wait, _STORAGE_WAIT_S) if waits else idle_wait)
            for f in futures:
                f.result()
        if errors:
            raise errors[0]

    def _process(
        self,
        tp: TopicPartition,
        owned: _Owned,
        records: list[Record],
        handler: Callable[[Record], Any],
        retries: int,
        backoff: float,
        dlq: Any,
        errors: list[BaseException],
    ) -> None:
        try:
            for record in records:
                for attempt in range(retries + 1):
                    try:
                        handler(record)
                        break
                    except Exception as exc:
                        if attempt < retries:
                            time.sleep(backoff * 2**attempt)  # retry backoff, partition waits
                            continue
                        if dlq is None:
                            raise
                        source = f"{record.topic}/{record.partition}@{record.offset}"
                        headers = {"error": repr(exc).encode(), "source": source.encode()}
                        dlq.send(record.value, key=record.key, headers=headers)
                        log.warning(
                            "%r failed %d times; sent to %s", record, retries + 1, dlq.topic
                        )
                owned.position = record.offset + 1
            self._commit_one(tp, owned, owned.position)
        except BaseException as exc:
            errors.append(exc)
        finally:
            owned.busy = False
            with self._cond:
                self._cond.notify_all()

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Commit, release every partition, leave the group."""
        if self._stop.is_set():
            return
        if self.session.alive:
            with contextlib.suppress(ControlError):
                for tp in list(self.assignment()):
                    self._release(tp)
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        with contextlib.suppress(ControlError):
            self.election.resign()
        self.session.close()  # ends a campaign still waiting in line
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()


def describe_group(log_: TopicLog, cp: ControlPlane, group: str) -> GroupDescription:
    """Members, leader, generation, owners, committed offsets and lag per partition."""
    keys = _Keys(group)
    members = [m.id for m in Registry(cp, keys.registry).members()]
    leader_kv = Election(cp, keys.registry).leader()
    generation, owners = _read_assignment(cp, keys.assignment)
    partitions = []
    for name in sorted(owners, key=_tp_parse):
        tp = _tp_parse(name)
        claim = cp.get(keys.claim(tp))
        offset = cp.get(keys.offset(tp))
        end = log_.storage.offsets(*tp)[1]
        partitions.append(
            PartitionState(
                tp[0],
                tp[1],
                claim.text if claim else None,
                int(json.loads(offset.value)["offset"]) if offset else None,
                end,
            )
        )
    return GroupDescription(
        group, generation, members, leader_kv.text if leader_kv else None, partitions
    )


def _time_ms(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as ms since the epoch."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise GroupError(
            f"--to {text!r}: earliest, latest, an offset, or a time such as 2026-11-23T10:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return epoch_ms(when)


def reset_offsets(
    log_: TopicLog, cp: ControlPlane, group: str, to: str, topic: str | None = None
) -> dict[str, int]:
    """Move a group's committed offsets to ``to`` ("earliest", "latest", an offset, or
    an ISO time — each partition's first record at or after it) on every partition it
    has consumed (of ``topic`` only, if given). Refused while the
    group has members: in one transaction that also checks no partition is claimed, so
    a member that joins meanwhile fails the reset rather than racing it. Returns the
    new offset per "topic/partition"."""
    keys = _Keys(group)
    members = [m.id for m in Registry(cp, keys.registry).members()]
    if members:
        raise GroupError(
            f"group '{group}' has {len(members)} live member(s) ({', '.join(members[:3])}): "
            "stop its consumers, then reset (offsets of a running group would be "
            "overwritten by its next commit)"
        )
    at_ms = None
    if to not in ("earliest", "latest") and not to.lstrip("-").isdigit():
        at_ms = _time_ms(to)
    _, owners = _read_assignment(cp, keys.assignment)
    tps = {_tp_parse(name) for name in owners}
    for kv in cp.get_prefix(keys.prefix + "offset/"):
        _, _, rest = kv.key.decode().partition(keys.prefix + "offset/")
        t, _, p = rest.rpartition("/")
        tps.add((t, int(p)))
    if topic is not None:
        tps = {tp for tp in tps if tp[0] == topic}
    if not tps:
        raise GroupError(
            f"group '{group}' has no partitions{f' of topic {topic!r}' if topic else ''} to "
            "reset (it never consumed them); see `riverbed group describe`"
        )
    new: dict[str, int] = {}
    ops = []
    for tp in sorted(tps):
        start, end = log_.storage.offsets(*tp)
        if at_ms is not None:  # the first record at or after that time
            offset = log_.storage.offset_for_time(tp[0], tp[1], at_ms)
        else:
            offset = start if to == "earliest" else end if to == "latest" else int(to)
        if not start <= offset <= end:
            raise GroupError(
                f"offset {offset} is outside {tp[0]}/{tp[1]}'s retained range {start}..{end}"
            )
        new[f"{tp[0]}/{tp[1]}"] = offset
        value = json.dumps({"offset": offset, "member": "reset", "generation": -1})
        ops.append(Put.of(keys.offset(tp), value))
    unclaimed = [Compare.version(keys.claim(tp)) == 0 for tp in sorted(tps)]
    if not cp.txn(unclaimed, ops).succeeded:
        raise GroupError(
            f"a member of group '{group}' claimed a partition while resetting: nothing was "
            "changed; stop its consumers and try again"
        )
    return new


def list_groups(cp: ControlPlane) -> list[str]:
    names = {kv.key.decode().split("/")[2] for kv in cp.get_prefix("riverbed/loggroup/")}
    return sorted(names)
