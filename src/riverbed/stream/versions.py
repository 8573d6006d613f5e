"""Versions of an aggregation: a changed spec computed again from the retained log
beside the running one, and one create-only record that switches readers to it.

A change the running state cannot carry (another key, window or time column, a
redefined metric) — or one that would otherwise apply only from the next batch on (a
filter, a derived column, the watermark) — can run as a **new version**: ``riverbed
stream run SPEC --new-version`` starts the aggregation ``<name>-v<N>`` (its own
checkpoint, state and result table; :func:`version_name`) from the oldest records the
source still holds, while version *N - 1* keeps running and serving results. After
each of its batches the new version compares where it is with where the current one
is; once it has caught up (:func:`caught_up`: at or past the current version's newest
committed batch in every partition) it writes the one record that makes it current::

    <checkpoints>/<name>/riverbed/versions/<N:06d>.json   created once, never replaced

Readers resolve ``<name>`` to the newest record's aggregation (:func:`current`; none:
``<name>`` itself, version 1) and read that version's results alone, so they see the
old results or the new ones, never a mix. The old version's driver sees the record at
its next look and stops, saying it was replaced. Its checkpoint and results are left
(a rollback reads them); nothing is deleted by the switch.

The decisions are pure (:func:`caught_up`, :func:`newest`, :func:`next_number`;
Hypothesis-tested); the I/O around them reads the base aggregation's checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from riverbed.stream.aggregation import base_of, is_version_name, version_name
from riverbed.stream.errors import StreamValueError
from riverbed.stream.layout import VERSIONS, checkpoint_store, version_key

__all__ = [
    "Current",
    "Version",
    "caught_up",
    "current",
    "delete",
    "listed",
    "newest",
    "next_number",
    "plan_new_version",
    "read_versions",
    "replaced",
    "resolve",
    "switch",
    "try_switch",
    "version_status",
]


@dataclass(frozen=True)
class Version:
    """One switch record: version ``number`` (computed by ``aggregation`` with spec
    shape ``spec``) became current at ``at`` (wall-clock seconds), when its batches
    had reached ``ends`` (per source partition) and the version before it's ``was``."""

    number: int
    aggregation: str
    spec: str | None
    at: float
    ends: dict[int, int]
    was: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.number,
            "aggregation": self.aggregation,
            "spec": self.spec,
            "at": self.at,
            "ends": {str(p): o for p, o in sorted(self.ends.items())},
            "was": {str(p): o for p, o in sorted(self.was.items())},
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Version:
        return Version(
            number=int(data["version"]),
            aggregation=str(data["aggregation"]),
            spec=data.get("spec"),
            at=float(data.get("at", 0.0)),
            ends={int(p): int(o) for p, o in dict(data.get("ends") or {}).items()},
            was={int(p): int(o) for p, o in dict(data.get("was") or {}).items()},
        )


@dataclass(frozen=True)
class Current:
    """What a reader of ``name`` reads now: version ``number``, computed by
    ``aggregation`` (``name`` itself for version 1)."""

    name: str
    number: int
    aggregation: str


# -- the pure decisions -----------------------------------------------------------------


def caught_up(current_ends: Mapping[int, int], mine: Mapping[int, int]) -> bool:
    """Whether a new version whose batches have reached ``mine`` (end offset per source
    partition) covers everything the current version has committed (``current_ends``):
    at or past it in every partition the current version has read."""
    return all(mine.get(p, 0) >= end for p, end in current_ends.items())


def newest(records: Iterable[Version]) -> Version | None:
    """The record that rules: the highest version number switched in."""
    return max(records, key=lambda v: v.number, default=None)


def next_number(switched: int, shadows: Mapping[int, str | None], spec: str) -> tuple[int, bool]:
    """The version a new-version run of spec shape ``spec`` computes, and whether it
    resumes one already begun: a version after the current one (``switched``) begun
    with the same shape is resumed (a restart of the same command, after a kill); else
    the next number after every version begun (one begun with another shape and never
    switched in is left as it is)."""
    same = [n for n, s in shadows.items() if n > switched and s == spec]
    if same:
        return max(same), True
    return max([switched, *shadows]) + 1, False


# -- the I/O around them ----------------------------------------------------------------


def read_versions(base_checkpoint: str | Path) -> list[Version]:
    """Every switch record of the aggregation whose checkpoint is ``base_checkpoint``."""
    store = checkpoint_store(base_checkpoint)
    out = []
    for entry in store.entries(VERSIONS):
        if entry.endswith(".json"):
            out.append(Version.from_json(json.loads(store.get(f"{VERSIONS}{entry}"))))
    return out


def current(base_checkpoint: str | Path, name: str) -> Current:
    """The version of ``name`` readers read now (its checkpoint: ``base_checkpoint``)."""
    ruling = newest(read_versions(base_checkpoint))
    if ruling is None:
        return Current(name, 1, name)
    return Current(name, ruling.number, ruling.aggregation)


def switch(base_checkpoint: str | Path, version: Version) -> Version:
    """Make ``version`` current: its record, created once. Returns the record that is
    there now — ``version``, or the one a driver of the same version wrote first (a
    re-run after a kill between writing it and saying so)."""
    store = checkpoint_store(base_checkpoint)
    key = version_key(version.number)
    if not store.put_if_absent(key, json.dumps(version.to_json(), indent=1).encode()):
        return Version.from_json(json.loads(store.get(key)))
    return version


def record(
    number: int, aggregation: str, spec: str | None, ends: Mapping[int, int], was: Mapping[int, int]
) -> Version:
    """A switch record made now."""
    return Version(number, aggregation, spec, time.time(), dict(ends), dict(was))


# -- what a run does: the version it computes, when it switches, when it stops ---------


def _spec_hash(was: Mapping[str, Any] | None, name: str) -> str | None:
    """A recorded shape's hash as version-free: the same spec under any version's name
    hashes the same — and under either state layout (panes or windows: a checkpoint's,
    not the spec's)."""
    from riverbed.stream.changes import STATE_LAYOUT, shape_hash

    if was is None:
        return None
    same = dict(was)
    if same.pop(STATE_LAYOUT, None) is not None:  # (its format: 2 for panes only)
        same["version"] = 1
    return shape_hash({**same, "name": name})


@dataclass(frozen=True)
class Plan:
    """What ``stream run SPEC --new-version`` computes: version ``number`` of ``name``
    (the aggregation ``aggregation``), beside ``current``; ``resumed``: begun before
    (a restart); ``is_current``: it is the current version already (it runs on)."""

    name: str
    number: int
    aggregation: str
    current: Current
    resumed: bool
    is_current: bool
    spec: str

    def text(self) -> str:
        if self.is_current:
            return (
                f"{self.name}: version {self.number} ({self.aggregation}) computes this spec "
                "and is the current one: it runs on"
            )
        began = "resumed" if self.resumed else "begun"
        return (
            f"{self.name}: new version {self.number} ({self.aggregation}) {began}: computed "
            f"from the oldest records its source holds, beside version {self.current.number} "
            f"({self.current.aggregation}), which keeps serving results; readers switch to it "
            "in one step once it has caught up"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.number,
            "aggregation": self.aggregation,
            "current": {"version": self.current.number, "aggregation": self.current.aggregation},
            "resumed": self.resumed,
            "is_current": self.is_current,
        }


def _begun_with(checkpoint: str | Path, name: str) -> set[str]:
    """The (version-free) hashes of every spec shape a version's checkpoint recorded —
    the one it starts with is recorded before its first batch, so a run killed before
    any batch is still recognized and resumed."""
    from riverbed.stream.layout import SPECS

    store = checkpoint_store(checkpoint)
    out = set()
    for entry in store.entries(SPECS):
        if entry.endswith(".json"):
            digest = _spec_hash(json.loads(store.get(f"{SPECS}{entry}")), name)
            if digest is not None:
                out.add(digest)
    return out


def plan_new_version(checkpoints: str | Path, spec: Any) -> Plan:
    """The version a new-version run of ``spec`` computes (reads only)."""
    from riverbed.locations import child
    from riverbed.stream.changes import shape
    from riverbed.stream.layout import aggregations
    from riverbed.stream.specrecord import recorded

    name = spec.name
    if is_version_name(name):
        raise StreamValueError(f"{name!r} names a version; name the aggregation itself")
    base_checkpoint = child(checkpoints, name)
    now = current(base_checkpoint, name)
    was, _ = recorded(child(checkpoints, now.aggregation))
    if was is None and now.number == 1:
        raise StreamValueError(
            f"aggregation '{name}' has not run yet, so there is no version to replace: "
            "run it without --new-version"
        )
    mine = _spec_hash(shape(spec), name)
    assert mine is not None
    if _spec_hash(was, name) == mine:
        return Plan(name, now.number, now.aggregation, now, True, True, mine)
    shadows: dict[int, str | None] = {}
    for aggregation in aggregations(checkpoints):
        base, number = base_of(aggregation)
        if base == name and number > 1:
            began = _begun_with(child(checkpoints, aggregation), name)
            shadows[number] = mine if mine in began else next(iter(sorted(began)), None)
    number, resumed = next_number(now.number, shadows, mine)
    return Plan(name, number, version_name(name, number), now, resumed, False, mine)


def resolve(checkpoints: str | Path, name: str) -> Current:
    """What ``name`` means to a reader or a run now: its current version."""
    from riverbed.locations import child

    base, number = base_of(name)
    if base != name:  # a version named outright (flags-v1 is flags): that one
        return Current(base, number, version_name(base, number))
    return current(child(checkpoints, name), name)


def replaced(checkpoints: str | Path, aggregation: str) -> Current | None:
    """The version that replaced ``aggregation`` (a newer one is current), or None."""
    from riverbed.locations import child

    base, number = base_of(aggregation)
    now = current(child(checkpoints, base), base)
    return now if now.number > number else None


def try_switch(checkpoints: str | Path, plan: Plan, mine: Mapping[int, int]) -> Version | None:
    """After a batch of version ``plan.number`` that reached ``mine``: make it current
    if it has caught up with the current version (and nothing newer is); the record
    that rules then, or None while it has not caught up."""
    from riverbed.locations import child
    from riverbed.stream.sparklog import read_ends

    base_checkpoint = child(checkpoints, plan.name)
    ruling = newest(read_versions(base_checkpoint))
    if ruling is not None and ruling.number >= plan.number:
        return ruling
    now = plan.name if ruling is None else ruling.aggregation  # what readers read now
    theirs = read_ends(child(checkpoints, now))[0] or {}
    if not caught_up(theirs, mine):
        return None
    return switch(base_checkpoint, record(plan.number, plan.aggregation, plan.spec, mine, theirs))


def version_status(checkpoints: str | Path, aggregation: str) -> dict[str, Any] | None:
    """Where ``aggregation`` stands among its aggregation's versions — ``current``,
    ``replaced`` or ``catching up`` (with the records it is ``behind`` the current
    version) — or None for an aggregation that never had a second version."""
    from riverbed.locations import child
    from riverbed.stream.sparklog import read_ends

    base, number = base_of(aggregation)
    now = current(child(checkpoints, base), base)
    if number == 1 and now.number == 1:
        return None
    out: dict[str, Any] = {
        "name": base,
        "version": number,
        "current": {"version": now.number, "aggregation": now.aggregation},
        "behind": None,
    }
    if number == now.number:
        out["state"] = "current"
    elif number < now.number:
        out["state"] = "replaced"
    else:
        out["state"] = "catching up"
        theirs = read_ends(child(checkpoints, now.aggregation))[0] or {}
        mine = read_ends(child(checkpoints, aggregation))[0] or {}
        out["behind"] = sum(max(0, end - mine.get(p, 0)) for p, end in theirs.items())
    return out


def listed(checkpoints: str | Path, name: str) -> list[dict[str, Any]]:
    """Every version of ``name`` that has a checkpoint or a switch record, oldest
    first: number, aggregation, state (current / replaced / catching up), and when it
    was switched in (None: version 1, or never)."""
    from riverbed.locations import child
    from riverbed.stream.layout import aggregations

    base_checkpoint = child(checkpoints, name)
    now = current(base_checkpoint, name)
    records = {v.number: v for v in read_versions(base_checkpoint)}
    present = {base_of(a)[1] for a in aggregations(checkpoints) if base_of(a)[0] == name}
    numbers = set(records) | present | {1}
    out = []
    for number in sorted(numbers):
        state = "current" if number == now.number else "replaced"
        if number > now.number:
            state = "catching up"
        if number not in present and number != now.number:
            state = "deleted"  # (`stream versions NAME --delete N`)
        switched = records.get(number)
        out.append(
            {
                "version": number,
                "aggregation": version_name(name, number),
                "state": state,
                "switched_at": switched.at if switched else None,
            }
        )
    return out


def delete(
    checkpoints: str | Path, name: str, number: int, output: str | Path, state: Any
) -> list[str]:
    """Delete version ``number`` of ``name`` — a replaced one, or one never switched in
    (abandoned) — for good: every state generation of it, its result table, and its
    checkpoint (version 1's but for the switch records it holds, which every reader of
    ``name`` needs). The current version is refused, and so is a version with
    savepoints (they outlive their aggregation until deleted themselves). Returns what
    was deleted (to say so). The caller makes sure no driver runs it."""
    from riverbed.locations import child, shown
    from riverbed.state import StateProvider
    from riverbed.stream import rescale, savepoints
    from riverbed.stream.layout import RIVERBED

    now = current(child(checkpoints, name), name)
    aggregation = version_name(name, number)
    if number == now.number:
        raise StreamValueError(
            f"version {number} ({aggregation}) is the current version of '{name}': readers "
            "read it; switch another one in first (`stream run SPEC --new-version`)"
        )
    checkpoint = child(checkpoints, aggregation)
    kept = savepoints.listed(checkpoint)
    if kept:
        names = ", ".join(s.name for s in kept)
        raise StreamValueError(
            f"version {number} ({aggregation}) has savepoints ({names}), which are kept until "
            "deleted themselves: delete them first, or keep this version"
        )
    provider = StateProvider(state)
    held = set(provider.namespaces())
    gone = []
    for generation in rescale.generations(checkpoint, 0):
        namespace = generation.namespace(aggregation)
        if namespace in held or (provider.local_dir / namespace).exists():
            provider.drop(namespace)
            gone.append(f"state {namespace}")
    results = checkpoint_store(output)
    if results.list(""):
        results.delete_prefix("")
        gone.append(f"results {shown(str(output))}")
    store = checkpoint_store(checkpoint)
    doomed = [i.key for i in store.list("") if number > 1 or not i.key.startswith(VERSIONS)]
    if doomed:
        store.delete_many(doomed)
        what = "checkpoint" if number > 1 else f"checkpoint (all but {RIVERBED}versions/)"
        gone.append(f"{what} {shown(str(checkpoint))}")
    for where in (output, checkpoint) if number > 1 else (output,):  # empty folders too
        if isinstance(where, Path):
            shutil.rmtree(where, ignore_errors=True)
    return gone
