"""The consumer-group state machine under random joins, leaves, crashes and new partitions.

After every step the group is given time to settle, then the control plane's truth is
checked: every partition has exactly one claim, held by a live member; every live
member's view of what it owns equals its claims; loads are balanced.
"""

from __future__ import annotations

import json
import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import riverbed.log
from riverbed.control import connect
from riverbed.log.group.consumer import Consumer


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cp = connect("memory://")
        self.log = riverbed.log.open("memory://")
        self.log.create_topic("t", 3)
        self.members: dict[str, Consumer] = {}
        self.counter = 0

    def teardown(self) -> None:
        for consumer in self.members.values():
            consumer.close()

    def settle(self, timeout: float = 8.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for consumer in self.members.values():
                consumer.poll(0)
            if self.settled():
                return
            time.sleep(0.02)

    def claims(self) -> dict[tuple[str, int], str]:
        prefix = "riverbed/loggroup/g/claim/"
        out = {}
        for kv in self.cp.get_prefix(prefix):
            topic, p = kv.key.decode()[len(prefix) :].split("/")
            out[(topic, int(p))] = kv.text
        return out

    def owners(self) -> dict[tuple[str, int], str]:
        kv = self.cp.get("riverbed/loggroup/g/assignment")
        if kv is None:
            return {}
        out = {}
        for name, member in json.loads(kv.value)["owners"].items():
            topic, _, p = name.rpartition(":")
            out[(topic, int(p))] = member
        return out

    def settled(self) -> bool:
        claims = self.claims()
        partitions = {("t", p) for p in range(self.log.topic("t").partitions)}
        if not self.members:
            return not claims
        owners = self.owners()
        # the leader has seen the current members and partitions ...
        expected_members = set(self.members) if len(partitions) >= len(self.members) else None
        if set(owners) != partitions or (
            expected_members is not None and set(owners.values()) != expected_members
        ):
            return False
        # ... and every partition is claimed by the member it is assigned to
        if claims != owners:
            return False
        return all(
            c.assignment() == {tp for tp, m in claims.items() if m == name}
            for name, c in self.members.items()
        )

    @precondition(lambda self: len(self.members) < 4)
    @rule(assignor=st.sampled_from(["range", "round-robin", "sticky"]))
    def join(self, assignor: str) -> None:
        self.counter += 1
        name = f"m{self.counter}"
        self.members[name] = self.log.consumer(
            self.cp,
            "g",
            "t",
            member_id=name,
            session_ttl=1,
            assignor=assignor,
            metadata_interval=0.1,
        )
        self.settle()

    @precondition(lambda self: bool(self.members))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.members)))
        self.members.pop(name).close()
        self.settle()

    @precondition(lambda self: bool(self.members))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """The member's lease is gone (as when it dies): its claims vanish at once."""
        name = data.draw(st.sampled_from(sorted(self.members)))
        consumer = self.members.pop(name)
        self.cp.revoke(consumer.session.lease)
        consumer.session.lost.wait(3)
        consumer.close()
        self.settle()

    @precondition(lambda self: self.log.topic("t").partitions < 7)
    @rule()
    def add_partition(self) -> None:
        self.log.add_partitions("t", self.log.topic("t").partitions + 1)
        self.settle()

    @invariant()
    def one_live_owner_per_partition_and_views_match(self) -> None:
        assert self.settled(), f"not settled: claims={self.claims()}"
        if self.members:
            claims = self.claims()
            loads = [sum(1 for m in claims.values() if m == name) for name in self.members]
            assert (
                max(loads) - min(loads) <= 1 or len({c._assign for c in self.members.values()}) > 1
            )


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=8, stateful_step_count=6, deadline=None)
