"""Rescaling an aggregation's state: ``state_partitions`` from N to M on a checkpoint.

State partition *p* holds the keys with ``crc32(key) % N == p``
(:func:`riverbed.stream.engine.state_partition_of`). A change of N is a **move**: the
state as of one version is read from every old partition, each entry routed by its key
to one of M new partitions, and written there as that same version — in a new *state
generation*, a namespace of its own (:func:`namespace`: ``<name>`` for the first,
``<name>.g<G>.<M>.v<version>`` after), so the old generation is never touched. The move ends with
one create-only record, ``riverbed/generations/<G>.json`` (:func:`~riverbed.stream.
layout.generation_key`): before it, every reader and the next batch use the old
generation; after it, the new one. A kill at any moment of the move leaves the old
generation current and whatever the new one holds unused; the next start moves again,
skipping the new partitions already written (each is one atomic commit of the version).

Which version moves: the state after the newest committed batch (a batch planned and
not committed runs next, on the new generation — co-location is then decided at run
time, since its plan recorded the old count). The move is started by the driver that
holds the aggregation's fence, at start, after ``stream plan`` said so, and runs as
Spark tasks (one per old partition reads and routes, one per new partition writes;
each write fenced) — or in the driver itself without a classic Spark session, and when
the move also changes values (a backfill's; :mod:`riverbed.stream.backfill`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from riverbed.config import adopt, inherited
from riverbed.log import reach_environment
from riverbed.log.partitioners import key_partition
from riverbed.state import StateConfig, StateProvider
from riverbed.storage.base import numbered
from riverbed.stream.batchlog import open_batches
from riverbed.stream.errors import StreamError
from riverbed.stream.layout import GENERATIONS, SPEC, checkpoint_store, generation_key

log = logging.getLogger(__name__)

__all__ = [
    "Change",
    "Generation",
    "Place",
    "abandoned",
    "copy",
    "current",
    "failpoint",
    "generations",
    "key_bytes",
    "move",
    "partition_of",
    "retire",
    "retired",
    "switch",
]


@dataclass(frozen=True)
class Generation:
    """One state generation: its number, partition count and first state version."""

    number: int
    partitions: int
    from_version: int = 0
    # the shape (changes.py) the state was moved for, when the move changed what it
    # holds (metrics backfilled: backfill.py) — what `stream plan` compares with until
    # a batch planned after it names its own
    spec: str | None = None
    backfilled: tuple[str, ...] = ()
    # per metric backfilled: the newest event time retention may have deleted before
    # it was counted (None: nothing was), riverbed.stream.backfill.since
    since: tuple[tuple[str, int | None], ...] = ()

    def namespace(self, name: str) -> str:
        return namespace(name, self.number, self.partitions, self.from_version)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "generation": self.number,
            "state_partitions": self.partitions,
            "from_version": self.from_version,
        }
        if self.spec is not None:
            out |= {"spec": self.spec, "backfilled": list(self.backfilled)}
        if self.since:
            out["since"] = dict(self.since)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Generation:
        return cls(
            int(data["generation"]),
            int(data["state_partitions"]),
            int(data["from_version"]),
            data.get("spec"),
            tuple(data.get("backfilled", ())),
            tuple((m, None if t is None else int(t)) for m, t in data.get("since", {}).items()),
        )


def namespace(name: str, generation: int, partitions: int, from_version: int) -> str:
    """The state namespace of an aggregation's generation (the one owner of the name).
    The count and the version are in it, so what a move abandoned by a kill left (the
    count then changed back and batches ran on) is never mixed into a later move."""
    if generation == 0:
        return name
    return f"{name}.g{generation}.{partitions}.v{from_version}"


def generations(checkpoint: str | Path, default_partitions: int) -> list[Generation]:
    """Every generation of the checkpoint's state, oldest first; the first one's
    partition count is the one ``riverbed/spec.json`` recorded (``default_partitions``
    when nothing is recorded yet)."""
    store = checkpoint_store(checkpoint)
    first = default_partitions
    if store.exists(SPEC):
        first = int(json.loads(store.get(SPEC))["state_partitions"])
    out = [Generation(0, first, 0)]
    keys = [i.key for i in store.list(GENERATIONS)]
    for number in sorted(numbered(keys, GENERATIONS, ".json")):
        out.append(Generation.from_json(json.loads(store.get(generation_key(number)))))
    return out


def current(checkpoint: str | Path, default_partitions: int) -> Generation:
    return generations(checkpoint, default_partitions)[-1]


def for_version(gens: list[Generation], version: int | None) -> Generation:
    """The generation that holds state ``version`` (None: the newest)."""
    if version is None:
        return gens[-1]
    return [g for g in gens if g.from_version <= version][-1]


def retired(gens: list[Generation], keep_from: int) -> list[Generation]:
    """The generations no retained state version lives in any more: generation *i*
    holds the versions from its ``from_version`` up to the next one's, so once the next
    begins at or before ``keep_from`` (the oldest version retention keeps) nothing
    loads it. The current generation is never retired."""
    return [g for g, after in itertools.pairwise(gens) if after.from_version <= keep_from]


def abandoned(gens: list[Generation], name: str, spaces: Iterable[str]) -> list[str]:
    """The namespaces among ``spaces`` that a move of ``name`` began and never switched
    to: of a generation number up to the current one's, yet no recorded generation's
    (the move was killed before its switch, and the start after it moved to another
    count or from a later version). A namespace of a number past the current one may be
    a move under way, and is not among them."""
    recorded = {g.namespace(name) for g in gens}
    current = gens[-1].number
    pattern = re.compile(rf"{re.escape(name)}\.g(\d+)\.\d+\.v\d+")
    return sorted(
        space
        for space in spaces
        if (found := pattern.fullmatch(space)) is not None
        and int(found.group(1)) <= current
        and space not in recorded
    )


_SWEPT: set[tuple[str, str, int]] = set()  # (checkpoint, name, generation) looked at


def retire(checkpoint: str | Path, provider: StateProvider, name: str, keep_from: int) -> list[str]:
    """Delete the state of every :func:`retired` generation of ``name`` that is still
    there (the retention pass calls it: a rescale's old generation goes once retention
    has moved past it), and, once per process and generation, what a move killed before
    its switch left (:func:`abandoned`); the namespaces deleted."""
    gens = generations(checkpoint, 0)
    old = retired(gens, keep_from)
    seen = (str(checkpoint), name, gens[-1].number)
    if not old and (gens[-1].number == 0 or seen in _SWEPT):
        return []  # (most aggregations, every round: no listing of the durable state)
    held = set(provider.namespaces())
    gone = []
    for space in [g.namespace(name) for g in old] + abandoned(gens, name, held):
        if space in held:
            provider.drop(space)
            held.discard(space)
            gone.append(space)
    _SWEPT.add(seen)
    return gone


# -- the pure core: which new partition an entry goes to -------------------------------


def key_bytes(state_key: bytes, sessions: bool) -> bytes:
    """The aggregation key inside a state key (:mod:`riverbed.state.keys`): after the
    8-byte window start; for sessions after the ``0x01`` prefix, or ``0x02`` + end +
    start (an index entry)."""
    if not sessions:
        return state_key[8:]
    if state_key[:1] == b"\x01":
        return state_key[1:]
    if state_key[:1] == b"\x02":
        return state_key[17:]
    raise StreamError(f"state key {state_key[:24]!r} is not a session key or index entry")


def partition_of(key: bytes, partitions: int) -> int:
    """The state partition of a key (bytes of its text): as the engine places it."""
    return key_partition(key, partitions)


# -- the move ---------------------------------------------------------------------------


class Change(Protocol):
    """What a move does besides placing entries (:mod:`riverbed.stream.backfill`)."""

    spec: str  # the shape hash the new generation holds
    backfilled: tuple[str, ...]
    since: tuple[tuple[str, int | None], ...]

    def value(self, key: bytes, value: bytes) -> bytes:
        """An entry's new value."""
        ...

    def before_switch(self, new: Generation) -> None:
        """Write what must exist before the new generation is current (idempotent)."""
        ...


def failpoint(at: str, driver: int | None = None) -> None:
    """``RIVERBED_FAULT=kill_in_move:<n>`` (tests): SIGKILL the driver once ``n`` new
    partitions are written; ``kill_in_move:read``: once the old state is read (and a
    backfill's partials computed), before anything is written; ``kill_in_move:switch``:
    before the switch is recorded; ``kill_in_move:done``: right after it. ``driver``:
    its pid, when a Spark task of the move (another process) reaches the point."""
    fault = inherited("RIVERBED_FAULT") or ""
    if fault == f"kill_in_move:{at}":
        os.kill(driver or os.getpid(), signal.SIGKILL)


def version_to_move(checkpoint: str | Path) -> int:
    """The state version after the newest committed batch (0: none committed)."""
    batches = open_batches(checkpoint)
    for b in reversed(batches.ids()):  # newest first: one read, or two (a batch in flight)
        record = batches.get(b)
        if record is not None and record.done:
            return b + 1
    return 0


@dataclass(frozen=True)
class Place:
    """Where state is: a provider's namespace, its partition count, and the version."""

    provider: StateProvider
    namespace: str
    partitions: int
    version: int


@dataclass
class _SparkMove:
    """A move as Spark tasks: one per old partition reads and routes its entries, one
    per new partition sorts and commits what was routed to it (picklable: the state's
    configuration, the fence and the driver's reach of a bucket travel to the tasks)."""

    state: StateConfig
    source: str  # namespaces
    target: str
    partitions: tuple[int, int]  # old, new
    version: int
    sessions: bool
    fence: Callable[[], None]
    driver: int  # the driver's pid: the failpoints kill it, as the in-driver move does
    reach_env: dict[str, str] = field(default_factory=reach_environment, repr=False)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        adopt(state.get("reach_env", {}))

    def read(self, p: int) -> Iterator[tuple[int, tuple[bytes, bytes]]]:
        provider = StateProvider(self.state)
        if not provider.versions(self.source, p):
            return
        store = provider.load(self.source, p, self.version)
        try:
            for k, v in store.scan():
                yield partition_of(key_bytes(k, self.sessions), self.partitions[1]), (k, v)
        finally:
            store.abort()

    def write(
        self, q: int, routed: Iterable[tuple[int, tuple[bytes, bytes]]]
    ) -> Iterator[tuple[int, int]]:
        entries = sorted(kv for _, kv in routed)
        failpoint("read", self.driver)  # every old partition read: nothing written yet
        provider = StateProvider(self.state)
        if self.version not in provider.versions(self.target, q):  # else: before a kill
            self.fence()  # a replaced driver's task writes nothing
            store = provider.load(self.target, q, None)
            try:
                for k, v in entries:
                    store.put(k, v)
                store.commit(self.version)
            except BaseException:
                store.abort()
                raise
            failpoint(str(q + 1), self.driver)
        yield len(entries), sum(len(k) + len(v) for k, v in entries)


def _copy_on_spark(
    spark: Any, source: Place, target: Place, sessions: bool, fence: Callable[[], None]
) -> tuple[int, int]:
    task = _SparkMove(
        source.provider.config,
        source.namespace,
        target.namespace,
        (source.partitions, target.partitions),
        target.version,
        sessions,
        fence,
        os.getpid(),
    )
    fence()
    from riverbed.spark import tasks

    def merge(q: int, values: Iterator[tuple[bytes, bytes]]) -> tuple[int, int]:
        return next(task.write(q, ((q, kv) for kv in values)))

    tasks.describe(
        spark, f"riverbed: state {source.namespace} moved to {target.partitions} partitions"
    )
    try:
        counts, _ = tasks.shuffle_job(
            spark,
            list(range(source.partitions)),
            None,
            lambda p: [] if p is None else list(task.read(p)),
            target.partitions,
            merge,
        )
    finally:
        tasks.describe(spark, None)  # the batches' jobs after it describe themselves
    return sum(n for n, _ in counts), sum(b for _, b in counts)


def copy(
    source: Place,
    target: Place,
    sessions: bool,
    fence: Callable[[], None],
    value: Callable[[bytes, bytes], bytes] | None = None,
    spark: Any = None,
) -> tuple[int, int]:
    """Every entry of ``source`` (as of its version), routed by its key to one of
    ``target``'s partitions (``value``: its new value), committed there as
    ``target``'s version; a target partition that holds that version already (written
    before a kill) is skipped. Returns the entries and bytes copied. The rescale's
    move, a savepoint and a restore from one (:mod:`riverbed.stream.savepoints`).
    ``spark`` (a classic or Connect session; not with ``value``): in parallel Spark tasks, one per
    old partition and one per new one, else in this process, one partition after
    another. ``fence`` is called where each new partition is written: with ``spark``,
    in a task (so it must pickle: :func:`riverbed.stream.fencing.check_term`)."""
    if spark is not None and value is None:
        return _copy_on_spark(spark, source, target, sessions, fence)
    placed = [[] for _ in range(target.partitions)]  # type: list[list[tuple[bytes, bytes]]]
    nbytes = 0
    for p in range(source.partitions):
        if not source.provider.versions(source.namespace, p):
            continue
        store = source.provider.load(source.namespace, p, source.version)
        try:
            for k, v in store.scan():
                if value is not None:
                    v = value(k, v)
                placed[partition_of(key_bytes(k, sessions), target.partitions)].append((k, v))
                nbytes += len(k) + len(v)
        finally:
            store.abort()
    failpoint("read")
    for q in range(target.partitions):
        if target.version in target.provider.versions(target.namespace, q):
            continue  # written before a kill
        fence()  # a replaced driver writes nothing
        store = target.provider.load(target.namespace, q, None)
        try:
            for k, v in sorted(placed[q]):
                store.put(k, v)
            store.commit(target.version)
        except BaseException:
            store.abort()
            raise
        failpoint(str(q + 1))
    return sum(len(m) for m in placed), nbytes


def switch(
    checkpoint: str | Path, name: str, new: Generation, old: Generation, fence: Callable[[], None]
) -> None:
    """Make ``new`` the current generation, every partition of it written: its
    create-only record (a replaced driver records nothing)."""
    failpoint("switch")  # every new partition written, the switch not yet recorded
    fence()
    record = json.dumps(new.to_json() | {"was": old.to_json()}).encode()
    if not checkpoint_store(checkpoint).put_if_absent(generation_key(new.number), record):
        raise StreamError(
            f"aggregation {name!r}: another driver moved its state meanwhile (generation "
            f"{new.number} exists); start it again"
        )
    failpoint("done")


def move(
    checkpoint: str | Path,
    state: StateConfig,
    name: str,
    sessions: bool,
    old: Generation,
    partitions: int,
    fence: Callable[[], None],
    say: Callable[[str], None] = log.info,
    version: int | None = None,
    change: Change | None = None,
    spark: Any = None,
) -> Generation:
    """Move the state of generation ``old`` to ``partitions`` partitions as a new
    generation, and make it current (see the module doc); returns it. ``version``:
    the state version to move (default: the one after the newest committed batch).
    ``change``: what else the move does to the state (metrics backfilled). ``spark``:
    a classic session to move it in parallel tasks (:func:`copy`)."""
    version = version_to_move(checkpoint) if version is None else version
    new = Generation(old.number + 1, partitions, version)
    if change is not None:
        new = replace(new, spec=change.spec, backfilled=change.backfilled, since=change.since)
    provider = StateProvider(state)
    started = time.monotonic()
    entries = nbytes = 0
    if version > 0:  # version 0: no batch committed, nothing to move
        entries, nbytes = copy(
            Place(provider, old.namespace(name), old.partitions, version),
            Place(provider, new.namespace(name), partitions, version),
            sessions,
            fence,
            change.value if change is not None else None,
            spark,
        )
    if change is not None:
        change.before_switch(new)
    switch(checkpoint, name, new, old, fence)
    what = f" with {', '.join(new.backfilled)} backfilled" if new.backfilled else ""
    how = "Spark tasks" if spark is not None and change is None else "the driver"
    say(
        f"state of {name} moved from {old.partitions} to {partitions} partitions{what}: "
        f"{entries:,} entries, {nbytes / 1e6:.1f} MB at version {version} in "
        f"{time.monotonic() - started:.1f} s ({how})"
    )
    return new
