"""Child-process programs for the multi-process tests (run as scripts, not imported)."""

from __future__ import annotations

import sys

from riverbed.control import connect


def cas_increment(url: str, key: str, times: int) -> None:
    """Add ``times`` to the integer at ``key``, one compare-and-swap at a time."""
    cp = connect(url)
    done = 0
    while done < times:
        kv = cp.get(key)
        current = int(kv.value) if kv else 0
        expected = kv.value if kv else None
        if cp.compare_and_swap(key, expected, str(current + 1)):
            done += 1
    cp.close()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "cas":
        cas_increment(args[0], args[1], int(args[2]))
    else:
        sys.exit(f"unknown command {command}")
