"""Small durable-file helpers shared by the packages that write files."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file"]


def fsync_file(path: Path) -> None:
    """Make a file's bytes durable (before a rename publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in directory ``path`` durable."""
    fsync_file(path)  # a directory opens read-only like a file, and syncs the same way
