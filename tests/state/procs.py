"""Child-process programs for the state crash tests (run as scripts)."""

from __future__ import annotations

import sys
from pathlib import Path

from riverbed.state import StateConfig, StateProvider

KEYS_PER_VERSION = 300
KEEP = 5  # versions of keys kept; older ones are expired with delete_range
BALLAST = 2000  # 10 KB values written once at version 1: makes snapshot uploads slow


def expected(version: int) -> dict[bytes, bytes]:
    """The exact state after versions 1..version of ``write_forever``."""
    state = {}
    for v in range(max(1, version - KEEP + 1), version + 1):
        for i in range(KEYS_PER_VERSION):
            state[f"k{v:06d}/{i:04d}".encode()] = f"{v}-{i}".encode() * 4
    if version:
        state[b"counter"] = str(version).encode()
        state.update(ballast())
    return state


def ballast() -> dict[bytes, bytes]:
    return {f"z{i:05d}".encode(): bytes([i % 251]) * 10_000 for i in range(BALLAST)}


def provider(root: Path) -> StateProvider:
    return StateProvider(
        StateConfig(local_dir=root / "local", durable=root / "durable", snapshot_every=2)
    )


def write_forever(root: Path) -> None:
    p = provider(root)
    while True:
        store = p.load("crash", 0)
        v = store.version + 1
        for i in range(KEYS_PER_VERSION):
            store.put(f"k{v:06d}/{i:04d}".encode(), f"{v}-{i}".encode() * 4)
        store.put(b"counter", str(v).encode())
        store.delete_range(b"k", f"k{v - KEEP + 1:06d}".encode())
        if v == 1:
            for key, value in ballast().items():
                store.put(key, value)
        store.commit(v)
        print(v, flush=True)  # acknowledged


if __name__ == "__main__":
    write_forever(Path(sys.argv[1]))
