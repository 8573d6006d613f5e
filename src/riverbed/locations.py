"""What a location setting is — the one owner, for every package that takes one.

A *location* is where riverbed keeps durable things: a local directory (a path or
``file:///path``) or a bucket (``s3://bucket/prefix``). Settings that name one —
``checkpoints`` (RIVERBED_CHECKPOINTS, ``--checkpoints``, riverbed.toml), a time-range
job's ``output`` — are read by :func:`parse`; a result table's default place under a
bucket's checkpoints is :func:`output_url`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "OUTPUT",
    "child",
    "in_bucket",
    "is_local",
    "local_path",
    "location",
    "output_in_bucket",
    "output_url",
    "parse",
    "shown",
    "shown_repr",
]

OUTPUT = "output"  # results under a bucket's checkpoint location (output/<name>)


def is_local(location: str | Path) -> bool:
    """Whether a location is a local directory (a path or ``file://``), not a bucket."""
    return isinstance(location, Path) or urlsplit(str(location)).scheme in ("", "file")


def local_path(location: str | Path) -> Path:
    """The directory of a local location (a path or ``file:///path``)."""
    if isinstance(location, Path):
        return location
    parts = urlsplit(location)
    return Path(parts.path if parts.scheme == "file" else location)


def shown(url: str | Path) -> str:
    """A location or database URL as output may show it: the user and password of
    ``scheme://user:secret@host/…`` left out (the one owner of that rule)."""
    text = str(url)
    parts = urlsplit(text) if "://" in text else None
    if parts is None or "@" not in parts.netloc:
        return text
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()


def shown_repr(obj: Any, *urls: str) -> str:
    """A dataclass's repr with the fields named in ``urls`` passed through :func:`shown`
    (an engine's configuration is printed in logs; a database password is not)."""
    parts = []
    for f in dataclasses.fields(obj):
        if f.repr:
            value = getattr(obj, f.name)
            if f.name in urls and isinstance(value, str):
                value = shown(value)
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def location(value: str | Path) -> str | Path:
    """A location in its one form: a path for a local one, the URL for a bucket."""
    return local_path(value) if is_local(value) else str(value).rstrip("/")


def parse(url: str, setting: str = "checkpoints") -> str | Path:
    """A location from a setting named ``setting``: a local directory (a path), or a
    bucket (``s3://bucket/prefix``, as a URL). Anything else, a location without a
    bucket, and one with credentials in it (never echoed) are :class:`ConfigError`
    naming what works."""
    from riverbed.errors import ConfigError

    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return local_path(url)
    if parts.scheme != "s3":
        raise ConfigError(
            f"{setting} {url.split('@')[-1]!r}: use a path, file:///path or s3://bucket/prefix"
        )
    if "@" in parts.netloc:  # never echoed: it may hold a secret
        raise ConfigError(
            f"the {setting} location holds credentials (s3://KEY:SECRET@…), which riverbed "
            "refuses: give the bucket as s3://bucket/prefix and the keys as "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile (docs/storage.md)"
        )
    if not parts.netloc:
        raise ConfigError(f"{setting} {url!r} names no bucket: use s3://bucket/prefix")
    return location(url)


def child(location: str | Path, name: str) -> str | Path:
    """``location/name`` as the same kind: a path for a path, a URL for a URL."""
    if isinstance(location, Path):
        return location / name
    return f"{str(location).rstrip('/')}/{name}"


def in_bucket(checkpoints: str | Path | None, name: str) -> str | None:
    """``<checkpoints>/<name>`` when the checkpoints setting names a bucket, else None —
    the one rule for what outlives this machine: with checkpoints in a bucket, riverbed
    keeps results and job outputs there too; with local checkpoints (or none) they stay
    under this machine's home."""
    if checkpoints is None or checkpoints == "" or is_local(checkpoints):
        return None
    return f"{str(checkpoints).rstrip('/')}/{name}"


def output_url(checkpoints: str, name: str) -> str:
    """A result table's default place when its checkpoints are in a bucket:
    ``<checkpoints>/output/<name>`` (a stream's results, a time-range job's output)."""
    return f"{checkpoints.rstrip('/')}/{OUTPUT}/{name}"


def output_in_bucket(checkpoints: str | Path | None, name: str) -> str | None:
    """:func:`output_url` when the checkpoints setting names a bucket (the rule of
    :func:`in_bucket`), else None: the output then stays on this machine."""
    if in_bucket(checkpoints, OUTPUT) is None:
        return None
    return output_url(str(checkpoints), name)
