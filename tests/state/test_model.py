"""Any sequence of load/put/delete/expire/commit/abort/reload/restore matches a model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from riverbed.state import CorruptStateError, StateConfig, StateProvider, StateStore

KEYS = st.sampled_from([b"a", b"a1", b"b", b"b2", b"c", b"t1/x", b"t2/x", b"t3/y"])
VALUES = st.binary(max_size=4)


class StateMachine(RuleBasedStateMachine):
    engine = "rocksdb"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp())
        self.provider = StateProvider(
            StateConfig(
                local_dir=self.tmp / "local",
                durable=self.tmp / "durable",
                engine=self.engine,
                snapshot_every=2,
            )
        )
        # committed model: version -> (state, base, identity of the base it was built on,
        # identity). Identity = what the changelog's tag stands for: base, its identity, ops.
        self.versions: dict[int, tuple[dict[bytes, bytes], int, object, object]] = {
            0: ({}, 0, None, None)
        }
        self.store: StateStore | None = None
        self.staged: dict[bytes, bytes] = {}
        self.ops: list[tuple[object, ...]] = []
        self.loaded = 0

    def broken(self, version: int) -> bool:
        """Built on a base that was re-committed with other contents since."""
        while version:
            _, base, base_identity, _ = self.versions[version]
            if base and self.versions[base][3] != base_identity:
                return True
            version = base
        return False

    def teardown(self) -> None:
        if self.store is not None:
            self.store.abort()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @precondition(lambda self: self.store is None)
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        asked = data.draw(st.sampled_from([None, *sorted(self.versions)]), label="version")
        expected = max(self.versions) if asked is None else asked
        if self.broken(expected):
            # Built on a base re-committed since: it must be refused, unless a snapshot
            # taken before the rewrite still rebuilds it exactly (checked below).
            try:
                self.store = self.provider.load("ns", 0, asked)
            except CorruptStateError as exc:
                assert "re-committed with other contents" in str(exc)
                return
        else:
            self.store = self.provider.load("ns", 0, asked)
        assert self.store.version == expected
        self.staged = dict(self.versions[expected][0])
        self.ops = []
        self.loaded = expected

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS, value=VALUES)
    def put(self, key: bytes, value: bytes) -> None:
        assert self.store is not None
        self.store.put(key, value)
        self.staged[key] = value
        self.ops.append(("put", key, value))

    @precondition(lambda self: self.store is not None)
    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        assert self.store is not None
        self.store.delete(key)
        self.staged.pop(key, None)
        self.ops.append(("del", key))

    @precondition(lambda self: self.store is not None)
    @rule(a=KEYS, b=KEYS)
    def expire(self, a: bytes, b: bytes) -> None:
        assert self.store is not None
        self.store.delete_range(a, b)
        self.staged = {k: v for k, v in self.staged.items() if not a <= k < b}
        if a < b:
            self.ops.append(("range", a, b))

    @precondition(lambda self: self.store is not None)
    @rule(skip=st.integers(0, 2))
    def commit(self, skip: int) -> None:
        assert self.store is not None
        new = self.store.version + 1 + skip  # sparse versions, like batch ids
        assert self.store.commit(new) == new
        # A re-run replaces exactly this version; newer versions stay as they were
        # committed (a late retry must not destroy newer work).
        base_identity = self.versions[self.loaded][3]
        identity = (self.loaded, base_identity, tuple(self.ops))
        self.versions[new] = (dict(self.staged), self.loaded, base_identity, identity)
        self.store = None

    @precondition(lambda self: self.store is not None)
    @rule()
    def abort(self) -> None:
        assert self.store is not None
        self.store.abort()
        self.store = None

    @precondition(lambda self: self.store is None)
    @rule()
    def lose_local_disk(self) -> None:
        shutil.rmtree(self.tmp / "local", ignore_errors=True)
        if self.engine == "memory":
            self.provider.engine.reset(self.tmp / "local" / "ns" / "0")

    @invariant()
    def reads_match_the_model(self) -> None:
        if self.store is None:
            return
        assert dict(self.store.scan()) == self.staged
        for key in [b"a", b"b2", b"t2/x"]:
            assert self.store.get(key) == self.staged.get(key)


class MemoryStateMachine(StateMachine):
    engine = "memory"


TestRocksState = StateMachine.TestCase
TestRocksState.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestMemoryState = MemoryStateMachine.TestCase
TestMemoryState.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
