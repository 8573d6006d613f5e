"""The object store interface every backend implements, and what it promises.

An :class:`ObjectStore` holds immutable-by-convention objects under ``/``-separated
keys below one location (``file:///dir``, ``memory://name``, ``s3://bucket/prefix``).
The contract (``tests/storage/test_contract.py`` runs it on every backend):

* ``put`` replaces an object whole: a reader sees the old bytes or the new, never a mix;
  a ``put`` that returned is durable.
* ``put_if_absent`` is the one conditional write: it creates the object only if no
  object has the key, and of any number of concurrent callers exactly one wins (S3's
  ``If-None-Match: *``, a hard link on a filesystem). Everything riverbed decides by
  "who wrote first" — which term's batch record is current, which pointer version —
  rests on it. (``If-Match`` on ETags is not used: servers disagree on it.)
  ``write_once`` builds on it for a writer that may run twice: an object that holds
  the same content stays, untouched; other content replaces it.
* ``get`` of a missing key raises :class:`ObjectNotFoundError`; ``delete`` of one is
  not an error.
* ``list`` returns every object under a prefix, sorted by key, including those just
  written (S3 has been strongly consistent since 2020; RGW and the filesystem are);
  ``entries`` names what is directly below a "directory", leaving out hidden
  (``.``-prefixed) names.
* ``put_file``/``get_file`` move large objects in parts, in parallel.
* A **view** (:meth:`show`) is a name that shows the objects under another prefix, for
  readers outside riverbed (a symlink on a directory: ``chunk=7`` showing the attempt
  that published it, so DuckDB or Spark globbing ``chunk=*`` read it). It is no object:
  ``list`` and ``entries`` leave it out. A bucket has none (``show`` does nothing there);
  what riverbed decides never rests on a view.
* Keys form a tree, as paths do: no key is also the "directory" of other keys (``a``
  and ``a/b`` cannot both exist). The file and memory backends refuse such a write with
  :class:`StorageValueError`; S3 would allow it, so riverbed's layouts never ask for it.
"""

from __future__ import annotations

import abc
import builtins
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from riverbed.storage.errors import ObjectNotFoundError, StorageValueError


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's location
    size: int
    modified: float = 0.0  # seconds since the epoch, as the store records it


def numbered(keys: list[str], prefix: str, suffix: str) -> list[int]:
    """The numbers of keys ``<prefix><digits><suffix>``, sorted."""
    out = []
    for key in keys:
        if key.startswith(prefix) and key.endswith(suffix):
            middle = key[len(prefix) : len(key) - len(suffix)]
            if middle.isdigit():
                out.append(int(middle))
    return sorted(out)


def check_key(key: str) -> str:
    """A key as every backend accepts it: relative, ``/``-separated, no empty, ``.``
    or ``..`` segment."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageValueError(
            f"object key {key!r} is not a relative path of non-empty segments "
            "(no leading '/', no '.' or '..')"
        )
    return key


class ObjectStore(abc.ABC):
    """Objects under one location (see the module doc for the contract)."""

    url: str  # where this store is, without credentials

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; whether this call created it."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object (fewer at its end)."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    def get_prefix(self, key: str, n: int) -> tuple[bytes, int]:
        """The first ``n`` bytes of an object (all of it if shorter) and its size — one
        request where the backend can (a ranged GET answers with the object's size)."""
        info = self.head(key)
        if info is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}")
        return self.get_range(key, 0, n), info.size

    def write_once(
        self,
        key: str,
        data: bytes,
        same: Callable[[bytes], bool] | None = None,
        before_replace: Callable[[], None] | None = None,
    ) -> bool:
        """Create ``key`` with ``data``, or leave the object there if it holds the same
        content — the same bytes, or ``same(found)`` (the same rows in another order,
        say) — and replace it otherwise, after ``before_replace`` (a fence check);
        whether this call wrote. For a writer that may run twice — a re-run of a killed
        one, or one paused between its fence check and its write that wakes after its
        replacement wrote: an identical object is never replaced (a check before a
        write cannot stop a write; a create-only write can), and only different
        content, after the check once more, replaces it."""
        if self.put_if_absent(key, data):
            return True
        try:
            found: bytes | None = self.get(key)
        except ObjectNotFoundError:  # deleted meanwhile (a purge): written again
            found = None
        if found is not None and (found == data or (same is not None and same(found))):
            return False
        if before_replace is not None:
            before_replace()
        self.put(key, data)
        return True

    def entries(self, prefix: str = "", *, with_partial: bool = False) -> builtins.list[str]:
        """The names directly below ``prefix`` (a "directory": ``""`` or ending in
        ``/``): objects and the first segment of deeper keys, sorted, each once —
        except hidden ones (starting with ``.``, such as a set-aside snapshot), which
        :meth:`list` still returns. ``with_partial``: also a name under which there is
        only what interrupted writes left (a directory's temporary files; a bucket has
        none: an upload is whole or absent), so its owner can delete it."""
        names = {info.key[len(prefix) :].split("/", 1)[0] for info in self.list(prefix)}
        return sorted(n for n in names if not n.startswith("."))

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.delete(key)

    def delete_prefix(self, prefix: str) -> None:
        """Delete everything under ``prefix`` (``""`` or ending in ``/``): its objects,
        and on a directory what other writers left there too (Spark's and Hadoop's
        files, temporaries, empty folders)."""
        if prefix and not prefix.endswith("/"):
            raise StorageValueError(f"delete_prefix takes a prefix ending in '/', not {prefix!r}")
        self.delete_many([info.key for info in self.list(prefix)])

    def move(self, src: str, dst: str) -> None:
        """Give object ``src``'s bytes to ``dst`` (replacing it) and delete ``src``;
        :class:`ObjectNotFoundError` when ``src`` is gone — moved by a concurrent mover,
        which is how a caller learns someone else did it. Readers of ``dst`` see its old
        bytes or the new ones, never a part. On a local directory it is one rename; on a
        bucket a server-side copy, then a delete, so two concurrent movers may both copy
        (the same bytes) before either deletes."""
        self.put(dst, self.get(src))
        self.delete(src)

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file as one object (in parts where the backend has them)."""
        self.put(key, Path(path).read_bytes())

    def get_file(self, key: str, path: Path) -> None:
        """Download an object into a local file (written whole, then renamed)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            tmp.write_bytes(self.get(key))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    def sweep_partial(self, prefix: str, older_than: float) -> int:
        """Remove what interrupted writes under ``prefix`` left, older than
        ``older_than`` seconds; how many. A bucket keeps nothing of a failed write."""
        return 0

    def locate(self, key: str) -> str:
        """Where the object ``key`` is, as a person finds it (a path for files)."""
        return f"{self.url.rstrip('/')}/{key}"

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def local_file(self, key: str) -> Path | None:
        """The object as a local file that readers may open (and never write), or None
        when it must be downloaded (:meth:`get_file`). A bucket's objects are not local."""
        return None

    def show(self, name: str, target: Callable[[], str | None]) -> bool:
        """Point the view ``name`` at the objects under the prefix ``target()`` returns
        (None: no view), ``target`` called while no other ``show`` of this store's views
        runs, so the view ends at the last caller's answer. False, calling nothing, where
        the store keeps no views (a bucket)."""
        return False

    def views(self, prefix: str = "") -> dict[str, str]:
        """The views directly below ``prefix`` (a "directory"): each name with the prefix
        it shows. A bucket has none."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Release connections and threads (optional)."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url})"


__all__ = ["ObjectInfo", "ObjectStore", "check_key"]
