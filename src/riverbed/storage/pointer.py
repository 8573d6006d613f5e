"""A compare-and-swap pointer on any object store, from create-only writes alone.

Object stores have no atomic rename and servers disagree on ``If-Match``; what they all
do the same is ``If-None-Match: *``. So a pointer is a sequence of immutable versions
``<name>/<version, 20 digits>``: the current value is the highest version, and moving
the pointer from version *v* is creating *v + 1* — which exactly one of any number of
concurrent writers manages (:meth:`ObjectStore.put_if_absent`). A writer that read an
old version (a paused driver, resumed) tries to create a version that exists, loses,
and learns it is stale. This is how Delta Lake commits to S3 and how WarpStream-style
logs order their metadata.

Old versions are garbage: :meth:`Pointer.prune` deletes all but the newest few.
"""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.storage.base import ObjectStore, check_key
from riverbed.storage.errors import ObjectNotFoundError, StorageError

DIGITS = 20


@dataclass(frozen=True)
class Version:
    number: int
    value: bytes


class Pointer:
    def __init__(self, store: ObjectStore, name: str) -> None:
        self.store = store
        self.name = check_key(name)

    def _key(self, number: int) -> str:
        return f"{self.name}/{number:0{DIGITS}d}"

    def _numbers(self) -> list[int]:
        out = []
        for info in self.store.list(self.name + "/"):
            tail = info.key[len(self.name) + 1 :]
            if len(tail) == DIGITS and tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    def current(self) -> Version | None:
        """The newest version, or None before the first :meth:`advance`."""
        for number in reversed(self._numbers()):
            try:
                return Version(number, self.store.get(self._key(number)))
            except ObjectNotFoundError:  # pruned between the listing and the read
                continue
        return None

    def advance(self, expected: int | None, value: bytes) -> bool:
        """Move the pointer from version ``expected`` (None: it has none yet) to a new
        version holding ``value``; False when another writer moved it first."""
        number = 0 if expected is None else expected + 1
        if number > 0 and not self.store.exists(self._key(expected)):  # type: ignore[arg-type]
            raise StorageError(
                f"pointer {self.name} has no version {expected} to move from "
                "(advance from the number current() returned)"
            )
        return self.store.put_if_absent(self._key(number), value)

    def prune(self, keep: int = 3) -> int:
        """Delete all but the newest ``keep`` versions; returns how many went."""
        numbers = self._numbers()
        old = numbers[: max(0, len(numbers) - max(1, keep))]
        self.store.delete_many(self._key(n) for n in old)
        return len(old)


__all__ = ["Pointer", "Version"]
