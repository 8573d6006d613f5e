"""Versioned, worker-local state: RocksDB locally, changelogs + snapshots durably.

::

    from riverbed.state import StateConfig, StateProvider

    provider = StateProvider(StateConfig(local_dir=Path("/tmp/rb"), durable="file:///data/ckpt"))
    store = provider.load("flags-hourly", partition=3, version=41)   # state after batch 41
    store.put(b"k", b"v")
    store.commit(42)                                                 # state after batch 42
"""

from __future__ import annotations

from riverbed.state.errors import (
    CorruptStateError,
    PartitionBusyError,
    StateError,
    StateValueError,
    StoreClosedError,
    VersionNotFoundError,
)
from riverbed.state.provider import PartitionIndex, StateConfig, StateProvider
from riverbed.state.store import StateStore

__all__ = [
    "CorruptStateError",
    "PartitionBusyError",
    "PartitionIndex",
    "StateConfig",
    "StateError",
    "StateProvider",
    "StateStore",
    "StateValueError",
    "StoreClosedError",
    "VersionNotFoundError",
]
