"""Durations as people write them: ``"90s"``, ``"1h30m"``, ``"250ms"``, a ``timedelta``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from riverbed.errors import DurationError

__all__ = ["duration_ms", "duration_seconds", "epoch_ms", "iso_ms"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def epoch_ms(when: datetime) -> int:
    """Milliseconds since the epoch of an aware datetime, exactly (truncated, as Arrow
    casts): ``int(when.timestamp() * 1000)`` goes through a float and comes out 1 ms
    short for some microsecond values (64.335 s → 64334)."""
    return (when - _EPOCH) // _MS


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as status shows a time: ``2026-12-01T10:09:00Z``."""
    return (_EPOCH + ms * _MS).strftime("%Y-%m-%dT%H:%M:%SZ")


_UNITS = {"ms": 1, "s": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value: str | int | timedelta) -> int:
    """``"90s"``, ``"1h"``, ``"1h30m"``, ``"30min"``, ``timedelta`` or milliseconds."""
    if isinstance(value, timedelta):
        return value // _MS  # exact (total_seconds() * 1000 is a float)
    if isinstance(value, int):
        return value
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)", value.strip())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", value):
        raise DurationError(f"cannot read duration {value!r}; write e.g. '10m', '1h', '1h30m'")
    return int(sum(float(n) * _UNITS[u] for n, u in parts))


def duration_seconds(value: str | float | timedelta) -> float:
    """Like :func:`duration_ms`, in seconds; a bare number is already seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise DurationError(f"duration {value!r} is negative")
        return float(value)
    if isinstance(value, str | timedelta):
        ms = duration_ms(value)
        if ms < 0:
            raise DurationError(f"duration {value!r} is negative")
        return ms / 1000
    raise DurationError(f"cannot read duration {value!r}; write e.g. '10m', '1h', 30 (seconds)")


_LARGEST_FIRST = ("d", "h", "m", "s")


def duration_text(ms: int) -> str:
    """``ms`` as :func:`duration_ms` reads it back, in the largest unit it is a whole
    number of (``7200000`` → ``"2h"``, ``90000`` → ``"90s"``, ``0`` → ``"0s"``)."""
    if ms == 0:
        return "0s"
    for unit in _LARGEST_FIRST:
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"
