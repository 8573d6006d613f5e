"""Membership: live members of a group, each kept by its session's lease.

A member is ``riverbed/registry/<group>/<member-id>`` → JSON metadata, attached to the
member's session lease, so a crashed member disappears within its TTL and watchers
see it leave. Used for workers, consumer-group members and orchestrators.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from riverbed.control.base import Compare, ControlPlane, EventType, Get, KeyValue, Put
from riverbed.control.errors import ControlError, ControlValueError
from riverbed.control.session import Session


@dataclass(frozen=True)
class Member:
    id: str
    metadata: Mapping[str, Any]
    revision: int  # create_revision: when it joined
    lease: int


@dataclass(frozen=True)
class MembershipChange:
    kind: Literal["joined", "updated", "left"]
    member: Member
    revision: int


class Registry:
    """The members of one group."""

    def __init__(self, cp: ControlPlane, group: str) -> None:
        if not group or "/" in group:
            raise ControlValueError(f"group name {group!r} must be non-empty and contain no '/'")
        self.cp = cp
        self.group = group
        self.prefix = f"riverbed/registry/{group}/".encode()

    def _member(self, kv: KeyValue) -> Member:
        member_id = kv.key[len(self.prefix) :].decode()
        try:
            metadata = json.loads(kv.value) if kv.value else {}
        except ValueError:
            metadata = {"raw": kv.value.decode("utf-8", "replace")}
        return Member(member_id, metadata, kv.create_revision, kv.lease)

    def register(
        self, session: Session, member_id: str, metadata: Mapping[str, Any] | None = None
    ) -> Member:
        """Join (or update our own entry). Refused if a live session holds the id."""
        if not member_id or "/" in member_id:
            raise ControlValueError(f"member id {member_id!r} must be non-empty and contain no '/'")
        key = self.prefix + member_id.encode()
        value = json.dumps(dict(metadata or {}), sort_keys=True).encode()
        result = self.cp.txn(
            [Compare.lease(key) == 0],  # free, or held by a key without a lease
            [Put(key, value, session.lease)],
            [Get(key)],
        )
        if not result.succeeded:
            existing = result.responses[0]
            assert isinstance(existing, list)
            if existing and existing[0].lease != session.lease:
                raise ControlError(
                    f"member '{member_id}' of group '{self.group}' is already registered by "
                    f"another live session (lease {existing[0].lease:x}); pick another id"
                )
            result = self.cp.txn(
                [Compare.lease(key) == session.lease], [Put(key, value, session.lease)]
            )
        kv = self.cp.get(key)
        if kv is None:
            raise ControlError(f"member '{member_id}' vanished right after registering")
        return self._member(kv)

    def deregister(self, member_id: str) -> None:
        self.cp.delete(self.prefix + member_id.encode())

    def members(self) -> list[Member]:
        """Live members, in the order they joined."""
        return self.snapshot()[0]

    def snapshot(self) -> tuple[list[Member], int]:
        """Live members and the revision they were read at (to watch from ``rev + 1``)."""
        result = self.cp.txn(success=[Get(self.prefix, prefix=True)])
        kvs = result.responses[0]
        assert isinstance(kvs, list)
        members = sorted((self._member(kv) for kv in kvs), key=lambda m: m.revision)
        return members, result.revision

    def changes(
        self, start_revision: int | None = None, timeout: float | None = None
    ) -> Iterator[MembershipChange]:
        """Joins, updates and departures from ``start_revision``; ends after ``timeout``
        seconds without a change, if given."""
        with self.cp.watch(self.prefix, prefix=True, start_revision=start_revision) as watch:
            for event in watch.events(idle_timeout=timeout):
                if event.type is EventType.DELETE:
                    prev = event.prev_kv or KeyValue(event.kv.key, b"", 0, 0, 0, 0)
                    yield MembershipChange("left", self._member(prev), event.revision)
                else:
                    kind: Literal["joined", "updated"] = (
                        "joined" if event.kv.version == 1 else "updated"
                    )
                    yield MembershipChange(kind, self._member(event.kv), event.revision)
