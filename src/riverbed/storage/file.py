"""Objects as files under a local directory: ``file:///path``.

A ``put`` writes a hidden temporary file, fsyncs it, renames it over the object and
fsyncs the directory; ``put_if_absent`` links the fsynced temporary file to the key
(``link`` fails if the name exists — atomic on every local filesystem, and on NFS v3+).
A write in progress is a hidden ``.<name>.<uuid>.tmp`` file, never listed. As in a
bucket, directories are no objects: the root is made by the first write, and a
directory left empty by a delete goes with its last object (a write racing that removal
makes it again). A view (:meth:`FileStore.show`) is a relative symlink to the
directory of the objects it shows, replaced by one rename under a ``flock`` of its
directory.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from riverbed.files import fsync_dir
from riverbed.storage.base import ObjectInfo, ObjectStore, check_key
from riverbed.storage.errors import ObjectNotFoundError, StorageValueError

_TMP = ".tmp"


def _temporary(name: str) -> bool:
    """A write in progress (``.<name>.<uuid>.tmp``), never an object."""
    return name.startswith(".") and name.endswith(_TMP)


class FileStore(ObjectStore):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()
        in_the_way = _file_in_the_way(self.root)
        if in_the_way is not None:
            raise StorageValueError(
                f"{in_the_way} is a file where a directory goes: point the location at a "
                "directory, or move the file"
            )

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _staged(self, path: Path, data: bytes | Path) -> Path:
        """A hidden temporary file beside ``path`` holding ``data`` (bytes, or a local
        file's contents, copied without holding them in memory), fsynced."""
        key = path.relative_to(self.root).as_posix()
        if path.is_dir():
            raise StorageValueError(f"object key {key!r} is already the directory of other keys")
        for attempt in range(3):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                break
            except (FileExistsError, NotADirectoryError):
                in_the_way = _file_in_the_way(path.parent)
                # none: the directory was there, and a delete removed it once emptied
                # before mkdir saw it was a directory (Path.mkdir's exist_ok checks after)
                if in_the_way is None and attempt < 2:
                    continue
                raise StorageValueError(
                    f"object key {key!r} is below a key that is an object itself: "
                    f"{in_the_way or path.parent} is a file where a directory goes"
                ) from None
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TMP}")
        # a local file is opened before any temporary exists: a missing one leaves none
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(open(data, "rb")) if isinstance(data, Path) else None
            payload = data if isinstance(data, bytes) else b""
            for attempt in range(3):
                try:
                    with open(tmp, "wb") as f:
                        if source is not None:
                            shutil.copyfileobj(source, f)
                        else:
                            f.write(payload)
                        f.flush()
                        os.fsync(f.fileno())
                    return tmp
                except FileNotFoundError:  # a delete removed the directory emptied meanwhile
                    if attempt == 2:
                        raise
                    path.parent.mkdir(parents=True, exist_ok=True)
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._staged(path, data)
        try:
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._staged(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)
        return True

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from None

    def get_prefix(self, key: str, n: int) -> tuple[bytes, int]:
        try:
            with open(self._path(key), "rb") as f:
                return f.read(n), os.fstat(f.fileno()).st_size
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from None

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key, stat.st_size, stat.st_mtime) if path.is_file() else None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        # walk only the directory the prefix names (its last segment may be partial)
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        out = []
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                if _temporary(name):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        stat = full.stat()
                        out.append(ObjectInfo(key, stat.st_size, stat.st_mtime))
        return sorted(out, key=lambda o: o.key)

    def entries(self, prefix: str = "", *, with_partial: bool = False) -> builtins.list[str]:
        path = self.root / prefix if prefix else self.root
        try:
            children = [p for p in path.iterdir() if not p.name.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            return []
        # a directory whose objects were all deleted is no entry (as in a bucket); one
        # with only a killed writer's temporary file is, when asked for
        return sorted(
            p.name
            for p in children
            if _holds_an_object(p) or (with_partial and p.is_dir() and not p.is_symlink())
        )

    def move(self, src: str, dst: str) -> None:
        source, target = self._path(src), self._path(dst)
        if not source.is_file():
            raise ObjectNotFoundError(f"no object {src!r} in {self.url}")
        if target.is_dir():
            raise StorageValueError(f"object key {dst!r} is already the directory of other keys")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(source, target)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"no object {src!r} in {self.url}") from None
        fsync_dir(target.parent)
        if target.parent != source.parent:
            with contextlib.suppress(FileNotFoundError):  # emptied and removed meanwhile
                fsync_dir(source.parent)
            self._prune_dirs(source.parent)

    def locate(self, key: str) -> str:
        return str(self._path(key)) if key else str(self.root)

    def put_file(self, key: str, path: Path) -> None:
        """A copy of the file (never all of it in memory), fsynced, renamed into place."""
        target = self._path(key)
        tmp = self._staged(target, Path(path))
        try:
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(target.parent)

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            shutil.copyfile(source, tmp)
            tmp.replace(path)
        except (FileNotFoundError, IsADirectoryError):
            if not source.is_file():
                raise ObjectNotFoundError(f"no object {key!r} in {self.url}") from None
            raise
        finally:
            tmp.unlink(missing_ok=True)

    def sweep_partial(self, prefix: str, older_than: float) -> int:
        """Temporary files of writes a crash interrupted (``.<name>.<uuid>.tmp``), the
        temporary symlinks of views a crash interrupted, and folders left empty."""
        root = self.root / prefix if prefix else self.root
        cutoff = time.time() - older_than
        removed = 0
        # beside writes under way: a temporary file may be linked or renamed into place
        # (and removed) between the listing and the look at it — a finished write
        for parent, dirs, files in os.walk(root):
            # a killed show() leaves its new symlink, which os.walk lists as a directory
            links = [d for d in dirs if _temporary(d) and os.path.islink(os.path.join(parent, d))]
            for name in [*files, *links]:
                if not _temporary(name):
                    continue
                entry = Path(parent) / name
                try:
                    stale = entry.lstat().st_mtime < cutoff
                except FileNotFoundError:
                    continue
                if stale:
                    entry.unlink(missing_ok=True)
                    self._prune_dirs(entry.parent)  # a folder it alone was in goes too
                    removed += 1
        # a writer killed between creating a folder and its temporary file leaves the
        # folder empty: no object, but clutter (a write that finds it pruned retries)
        for parent, dirs, files in os.walk(root, topdown=False):
            folder = Path(parent)
            if files or dirs or folder == self.root:
                continue
            with contextlib.suppress(FileNotFoundError):
                if folder.lstat().st_mtime < cutoff and not any(folder.iterdir()):
                    self._prune_dirs(folder)
        return removed

    def local_file(self, key: str) -> Path | None:
        path = self._path(key)
        return path if path.is_file() else None

    def show(self, name: str, target: Callable[[], str | None]) -> bool:
        link = self._path(name)
        for _attempt in range(3):
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(link.parent, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # pruned by a delete of its last object: again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed
                if os.fstat(fd).st_nlink == 0:  # pruned between mkdir and the lock
                    continue
                self._point(link, target())
                return True
            finally:
                os.close(fd)
        raise StorageValueError(f"{link.parent} keeps disappearing; cannot show {name!r} there")

    def _point(self, link: Path, prefix: str | None) -> None:
        """Make ``link`` show ``prefix`` (None: remove it); under the directory's lock."""
        if prefix is None:
            if link.is_symlink():
                link.unlink()
            elif link.is_dir():  # a directory an older riverbed published in place
                shutil.rmtree(link)
            else:
                return
            fsync_dir(link.parent)
            return
        relative = os.path.relpath(self._path(prefix), link.parent)
        with contextlib.suppress(OSError):
            if os.readlink(link) == relative:
                return
        tmp = link.with_name(f".{link.name}.{uuid.uuid4().hex}{_TMP}")
        os.symlink(relative, tmp)
        try:
            if link.is_dir() and not link.is_symlink():  # an older riverbed's: not atomic
                shutil.rmtree(link)
            os.replace(tmp, link)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(link.parent)

    def views(self, prefix: str = "") -> dict[str, str]:
        path = self.root / prefix if prefix else self.root
        found = {}
        try:
            children = [p for p in path.iterdir() if p.is_symlink()]
        except (FileNotFoundError, NotADirectoryError):
            return {}
        for link in children:
            shown = Path(os.path.normpath(link.parent / os.readlink(link)))
            if shown == self.root or self.root in shown.parents:
                found[link.name] = shown.relative_to(self.root).as_posix()
        return found

    def delete_prefix(self, prefix: str) -> None:
        if prefix and not prefix.endswith("/"):
            raise StorageValueError(f"delete_prefix takes a prefix ending in '/', not {prefix!r}")
        if not prefix:
            for child in list(self.root.iterdir()) if self.root.is_dir() else []:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
            return
        folder = self._path(prefix.rstrip("/"))
        shutil.rmtree(folder, ignore_errors=True)
        self._prune_dirs(folder.parent)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._prune_dirs(path.parent)

    def _prune_dirs(self, directory: Path) -> None:
        """Remove ``directory`` and its parents below the root while they are empty."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (or gone): its parents are not empty either
                return
            directory = directory.parent


def _file_in_the_way(path: Path) -> Path | None:
    """The file at ``path`` or at one of its parents, where a directory must go."""
    return next((p for p in (path, *path.parents) if p.is_file()), None)


def _holds_an_object(path: Path) -> bool:
    """Whether ``path`` is an object, or a directory with an object somewhere below (a
    view, a symlink, is neither)."""
    if path.is_symlink():
        return False
    if not path.is_dir():
        return not _temporary(path.name)
    for _dirpath, _dirnames, filenames in os.walk(path):
        if any(not _temporary(name) for name in filenames):
            return True
    return False


__all__ = ["FileStore"]
