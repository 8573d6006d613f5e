"""The pure core of time-range jobs: times, chunk grids, progress and what to compute next.

Nothing here does I/O. A job's **progress** is one record in the control plane:

* ``origin``: the start of the first run — the grid of chunk edges is ``origin + k·chunk``
  and nothing before it ever counts;
* ``done_to``: every chunk in ``[origin, done_to)`` is published, in order (a chunk's carried
  state is the input of the next, so chunks advance one at a time);
* ``redo``: chunks being recomputed after a ``--rerun`` (late corrections), with every
  chunk whose lookback or carried state they feed;
* ``target``: the end of the range last asked for;
* ``pending``: the last chunk published and the token of its staged files, so a driver
  that takes over can finish moving them into place.

A driver asks :func:`next_chunk`, computes it, and publishes it with :func:`advance`'s
result in one compare-and-swap guarded by its election term.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, date, datetime

from riverbed.timerange.errors import RangeError
from riverbed.timerange.spec import label

__all__ = [
    "DAY_US",
    "Progress",
    "advance",
    "chunk_label",
    "edges",
    "format_time",
    "next_chunk",
    "parse_time",
    "plan_request",
]

DAY_US = 86_400_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(value: str | datetime | date | int) -> int:
    """Microseconds since the epoch (UTC) of ``2026-01-01``, ``2026-01-01T05:00[Z]``, a
    datetime (naive means UTC) or an int that already is microseconds."""
    if isinstance(value, bool):
        raise RangeError(f"cannot read time {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            raise RangeError(
                f"cannot read time {value!r}; write it as ISO 8601, e.g. 2026-01-01 or "
                "2026-01-01T05:00Z (UTC unless an offset is given)"
            ) from None
        value = parsed
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        delta = aware - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, date):
        return parse_time(datetime(value.year, value.month, value.day, tzinfo=UTC))
    raise RangeError(f"cannot read time {value!r}")


def to_datetime(us: int) -> datetime:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)


def format_time(us: int) -> str:
    """``2026-01-01T05:00:00Z`` (with fractions only when there are some)."""
    dt = to_datetime(us)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    return text + "Z"


def chunk_label(us: int) -> str:
    """The chunk's folder value: ISO 8601 basic format, no colons (``20260101T050000Z``)."""
    dt = to_datetime(us)
    text = dt.strftime("%Y%m%dT%H%M%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}"
    return text + "Z"


def _human(us: int) -> str:
    return label(us)


def check_chunk(chunk_us: int, tumbling_us: int = 0) -> None:
    """A chunk must tile days (divide one, or be whole days) and hold whole tumbling windows."""
    if chunk_us <= 0:
        raise RangeError("the chunk size must be longer than 0")
    if DAY_US % chunk_us and chunk_us % DAY_US:
        raise RangeError(
            f"a {_human(chunk_us)} chunk does not divide a day evenly, so chunk edges would "
            "drift across days; use a size that does (e.g. 5m, 10m, 15m, 30m, 1h, 2h, 6h, 1d)"
        )
    if tumbling_us and chunk_us % tumbling_us:
        raise RangeError(
            f"a {_human(chunk_us)} chunk does not hold whole {_human(tumbling_us)} tumbling "
            f"windows; use a chunk that is a multiple of {_human(tumbling_us)}"
        )


def _on_grid(us: int, chunk_us: int, anchor: int) -> bool:
    return (us - anchor) % chunk_us == 0


def edges(start: int, end: int, chunk_us: int) -> list[tuple[int, int]]:
    """The chunks ``[s, e)`` that tile ``[start, end)`` (both on the grid)."""
    return [(s, s + chunk_us) for s in range(start, end, chunk_us)]


@dataclass(frozen=True)
class Progress:
    origin: int
    chunk: int
    done_to: int
    target: int
    redo_from: int | None = None
    redo_to: int | None = None
    pending_start: int | None = None
    pending_token: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> Progress:
        return Progress(**json.loads(text))

    @property
    def total(self) -> int:
        """Chunks in ``[origin, target)``."""
        return (self.target - self.origin) // self.chunk

    @property
    def done(self) -> int:
        """Chunks of ``[origin, target)`` whose published output is current."""
        done = (self.done_to - self.origin) // self.chunk
        if self.redo_from is not None and self.redo_to is not None:
            done -= (self.redo_to - self.redo_from) // self.chunk
        return done


@dataclass(frozen=True)
class Shape:
    """What a job's metrics need across chunk edges (from the spec)."""

    chunk: int
    lookback: int = 0  # time before a chunk its windows read
    unbounded: bool = False  # cumulative values or row windows: every later chunk depends
    tumbling: int = 0


def _ceil(us: int, chunk_us: int, anchor: int) -> int:
    return anchor + -(-(us - anchor) // chunk_us) * chunk_us


def plan_request(
    progress: Progress | None, shape: Shape, start: int, end: int, rerun: bool = False
) -> Progress:
    """The progress after asking for ``[start, end)``; raises :class:`RangeError`."""
    if start >= end:
        raise RangeError(
            f"--from {format_time(start)} is not before --to {format_time(end)}; "
            "the range is half-open [from, to)"
        )
    check_chunk(shape.chunk, shape.tumbling)
    anchor = progress.origin if progress else start
    if progress is None:
        unit = min(shape.chunk, DAY_US)
        if start % unit:
            raise RangeError(
                f"--from {format_time(start)} is not on a {_human(unit)} edge; chunks start on "
                f"whole {_human(unit)} boundaries (UTC) — e.g. --from "
                f"{format_time(start - start % unit)}"
            )
        if shape.tumbling and start % shape.tumbling:
            raise RangeError(
                f"--from {format_time(start)} is not on a {_human(shape.tumbling)} edge, so "
                "the first tumbling window would be cut; start on a window edge"
            )
    elif progress.chunk != shape.chunk:
        raise RangeError(
            f"this job was run in {_human(progress.chunk)} chunks and now asks for "
            f"{_human(shape.chunk)}; keep --chunk {_human(progress.chunk)}, or reset the job "
            "(riverbed timerange reset) to start over"
        )
    for what, t in (("--from", start), ("--to", end)):
        if not _on_grid(t, shape.chunk, anchor):
            lo = t - (t - anchor) % shape.chunk
            raise RangeError(
                f"{what} {format_time(t)} is not on the {_human(shape.chunk)} chunk grid "
                f"(edges at {format_time(anchor)} + k·{_human(shape.chunk)}); use "
                f"{format_time(lo)} or {format_time(lo + shape.chunk)}"
            )
    if progress is None:
        return Progress(origin=start, chunk=shape.chunk, done_to=start, target=end)
    if start < progress.origin:
        raise RangeError(
            f"--from {format_time(start)} is before this job's origin "
            f"{format_time(progress.origin)} (its first run's start, where cumulative values "
            "begin); run from there, or reset the job to start over"
        )
    if start > progress.done_to:
        raise RangeError(
            f"--from {format_time(start)} would leave a gap: chunks are done up to "
            f"{format_time(progress.done_to)}; run --from {format_time(progress.done_to)}"
        )
    new = replace(progress, target=max(progress.target, end))
    if rerun and start < progress.done_to:
        changed_to = min(end, progress.done_to)
        redo_to = (
            progress.done_to
            if shape.unbounded
            else min(progress.done_to, _ceil(changed_to + shape.lookback, shape.chunk, anchor))
        )
        if new.redo_from is not None and new.redo_to is not None:
            start, redo_to = min(start, new.redo_from), max(redo_to, new.redo_to)
        new = replace(new, redo_from=start, redo_to=redo_to)
    return new


def next_chunk(progress: Progress) -> int | None:
    """Start of the next chunk to compute, or ``None`` when everything asked for is done."""
    if progress.redo_from is not None:
        return progress.redo_from
    if progress.done_to < progress.target:
        return progress.done_to
    return None


def advance(progress: Progress, start: int, token: str) -> Progress:
    """The progress once chunk ``start`` is published with ``token``."""
    expected = next_chunk(progress)
    if start != expected:
        raise ValueError(f"chunk {format_time(start)} is not the next one ({expected})")
    end = start + progress.chunk
    new = replace(progress, pending_start=start, pending_token=token)
    if progress.redo_from is not None:
        assert progress.redo_to is not None
        if end >= progress.redo_to:
            return replace(new, redo_from=None, redo_to=None)
        return replace(new, redo_from=end)
    return replace(new, done_to=end)
