"""What changing a running aggregation's spec does — the pure decision core.

A checkpoint records the *shape* of the spec each batch ran with (:func:`shape`: every
part of an :class:`~riverbed.stream.aggregation.Aggregation` that decides its results,
in one canonical JSON form, stored once under its hash: :mod:`riverbed.stream.layout`'s
``riverbed/specs/<hash>.json``, the hash in each batch record). ``riverbed stream plan``
and ``riverbed stream run`` both ask :func:`compare` what starting the new spec on that
checkpoint does, change by change, so ``run`` does exactly what ``plan`` said and
refuses with the same words:

* **kept** — nothing of it changed;
* **applied** — it takes effect from the next batch on, and windows already counted
  keep what they counted (Spark's rule for a changed filter or projection): the
  watermark, ``keep_closed``, ``output``, ``where``, derived ``columns``, lookups, a
  metric removed (its state dropped as windows are next written); the state partition
  count (the state moved to the new count at start: :mod:`riverbed.stream.rescale`);
* **backfilled** — a metric added: computed from the records the source still holds
  up to where the newest batch ended, merged into the state and into the result
  rows already written, when the run starts (:mod:`riverbed.stream.backfill`); the
  other metrics keep their state and values;
* **refused** — the state cannot carry it, and the reason with the way out: a
  redefined metric (the state holds the old definition's partials under its name), a
  new one where it cannot be backfilled (a source riverbed cannot re-read, sessions,
  lookups), another key, time column or window.

The table of every change is in docs/stream.md, "Changing an aggregation".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from riverbed.durations import duration_text
from riverbed.formats import CURRENT
from riverbed.stream.metrics import SHAPE_IF_SET

if TYPE_CHECKING:
    from riverbed.stream.aggregation import Aggregation


Action = Literal["kept", "applied", "backfilled", "refused"]

__all__ = [
    "STATE_LAYOUT",
    "Change",
    "Plan",
    "Replay",
    "compare",
    "legacy_record",
    "legacy_shape",
    "shape",
    "shape_hash",
    "unreplayable",
]


def _window(window: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": type(window).__name__}
    for f in dataclasses.fields(window):
        out[f"{f.name}_ms"] = int(getattr(window, f"{f.name}_ms"))
    return out


def _value(value: Any) -> Any:
    """A metric's or lookup's parameter as JSON: plain values as they are, a function
    or class by its qualified name, anything else by its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _value(v) for k, v in value.items()}
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return repr(value)


def _described(obj: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": type(obj).__name__}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get(SHAPE_IF_SET) and value == f.default:
                continue  # added later: a shape without it is the same
            if f.name not in leave_out:
                out[f.name] = _value(value)
    return out


# how state holds the windows (Aggregation.state_layout), in a shape only when it holds
# panes: a shape without it (an older riverbed's) holds one value per window
STATE_LAYOUT = "state_layout"


def shape(spec: Aggregation) -> dict[str, Any]:
    """Everything of ``spec`` that decides its results or its state, canonical: two
    specs that count the same way have equal shapes ("1h" and "60m" are one window)."""
    from riverbed.locations import shown

    return {
        # (2 only where state holds panes: a riverbed before them refuses that state)
        "version": CURRENT["spec shape"] if spec.pane_ms else 1,
        "name": spec.name,
        "key": list(spec.key_parts),
        "time": spec.time,
        "window": _window(spec.window),
        "watermark_ms": int(spec.watermark_ms),
        "output": spec.output,
        "keep_closed_ms": int(spec.keep_closed_ms),
        "state_partitions": int(spec.state_partitions),
        "where": spec.where,
        "columns": dict(spec.columns),
        "lookups": [
            # (parts: how its snapshots are held, not what they hold)
            {**_described(lk, ("location", "parts")), "location": shown(lk.location or "")}
            for lk in spec.lookups
        ],
        "metrics": {name: _described(m) for name, m in spec.metrics.items()},
    } | ({STATE_LAYOUT: "panes"} if spec.pane_ms else {})


def shape_hash(value: Mapping[str, Any]) -> str:
    """The name a shape is stored under: its canonical JSON's SHA-256 (16 hex digits)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def legacy_record(name: str, partitions: int, sessions: bool) -> dict[str, Any]:
    """``riverbed/spec.json``'s object, which riverbed before shapes wrote and read (the
    name, the state partition count, fixed windows or sessions); :func:`legacy_shape`
    reads it."""
    return {
        "name": name,
        "state_partitions": partitions,
        "windows": "sessions" if sessions else "fixed",
    }


def legacy_shape(spec_record: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint from before shapes recorded (``riverbed/spec.json``: the name,
    the state partition count, fixed windows or sessions), as a partial shape."""
    return {
        "name": spec_record.get("name"),
        "state_partitions": spec_record.get("state_partitions"),
        "layout": spec_record.get("windows", "fixed"),
    }


@dataclass(frozen=True)
class Change:
    """One part of the spec, what it was and is, and what running it does."""

    part: str  # "metric 'spent'", "where", "state partitions", …
    was: Any
    now: Any
    action: Action
    why: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """``part: was → now``, as ``plan`` shows the values."""
        return f"{self.part}: {_shown(self.was, self.part)} → {_shown(self.now, self.part)}"

    def line(self) -> str:
        if self.action == "kept":
            return f"  kept      {self.part}"
        mark = {"applied": "applied", "backfilled": "backfill", "refused": "REFUSED"}[self.action]
        return f"  {mark:<9} {self.short()}\n{'':12}{self.why}"


def _shown(value: Any, part: str = "") -> str:
    """A part's value as ``plan`` prints it: durations as durations, metrics and
    windows as they are written in a spec."""
    if value is None:
        return "(none)"
    if part in ("watermark", "keep_closed") and isinstance(value, int):
        return duration_text(value)
    if isinstance(value, dict) and "kind" in value:
        params = ", ".join(
            f"{k[:-3]}={duration_text(v)}" if k.endswith("_ms") else f"{k}={v!r}"
            for k, v in value.items()
            if k != "kind" and not (k == "where" and v is None)
        )
        return f"{value['kind']}({params})"
    return json.dumps(value) if not isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class Replay:
    """What a backfill reads: per source partition, from which offset to which (the
    newest batch's end), how many records that is, how many before them retention
    deleted, and about how long reading them takes (None: no batch measured yet)."""

    ranges: Mapping[int, tuple[int, int]]
    gone: int = 0
    seconds: float | None = None

    @property
    def records(self) -> int:
        return sum(max(0, e - s) for s, e in self.ranges.values())

    def text(self) -> str:
        spans = ", ".join(f"{p}: {s}..{e}" for p, (s, e) in sorted(self.ranges.items()))
        line = f"  backfill  reads {self.records:,} records (partition: offsets {spans})"
        if self.seconds is not None:
            took = f"about {self.seconds:.0f} s" if self.seconds >= 1 else "under a second"
            line += f", {took} at the recent batches' rate"
        if self.gone:
            line += (
                f"\n{'':12}{self.gone:,} records before them are gone (retention): the "
                "windows they may have fallen in get the added metrics without them, "
                "marked by <metric>_since"
            )
        return line

    def to_json(self) -> dict[str, Any]:
        return {
            "ranges": {str(p): list(se) for p, se in sorted(self.ranges.items())},
            "records": self.records,
            "gone": self.gone,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class Plan:
    """What starting a spec on a checkpoint does: ``first`` (nothing recorded: a new
    aggregation), else one :class:`Change` per part that changed, or that is kept."""

    name: str
    first: bool
    changes: tuple[Change, ...]
    since_batch: int | None = None  # the batch whose record named the compared shape
    replay: Replay | None = None  # what backfilling the added metrics reads
    notes: tuple[str, ...] = ()  # what else running it does (the source's placement)

    @property
    def backfilled(self) -> tuple[str, ...]:
        """The metrics the run backfills (their names)."""
        return tuple(_metric_of(c.part) for c in self.changes if c.action == "backfilled")

    @property
    def refused(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.action == "refused")

    @property
    def changed(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.action != "kept")

    def refusal(self) -> str | None:
        """The one message ``stream run`` refuses with (None: it runs)."""
        if not self.refused:
            return None
        said = "; ".join(f"{c.short()}: {c.why}" for c in self.refused)
        return (
            f"aggregation '{self.name}' cannot start on its checkpoint: {said} — or run it "
            "as a new version, computed from the log beside this one: stream run SPEC "
            "--new-version"
        )

    def text(self) -> str:
        if self.first:
            return f"aggregation '{self.name}': no checkpoint yet — `stream run` starts it"
        head = f"aggregation '{self.name}'"
        if self.since_batch is not None:
            head += f", compared with the spec of batch {self.since_batch}"
        if not self.changed:
            said = "".join(f"\n  note      {n}" for n in self.notes)
            return f"{head}: nothing changed — `stream run` resumes it as it is{said}"
        lines = [f"{head}:"]
        lines += [c.line() for c in self.changes if c.action != "kept"]
        kept = [c.part for c in self.changes if c.action == "kept"]
        if self.replay is not None and self.backfilled:
            lines.append(self.replay.text())
        if kept:
            lines.append(f"  kept      {', '.join(kept)}")
        lines += [f"  note      {n}" for n in self.notes]
        if self.refused:
            lines.append(
                "`stream run` refuses to start (nothing was written); `stream run SPEC "
                "--new-version` computes it from the log beside the running version"
            )
        else:
            lines.append("`stream run` resumes with the changes above")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "first": self.first,
            "since_batch": self.since_batch,
            "runs": not self.refused,
            "changes": [c.to_json() for c in self.changes],
            "backfill": (
                self.replay.to_json() if self.replay is not None and self.backfilled else None
            ),
            "notes": list(self.notes),
        }


_NEW_CHECKPOINT = "use a new name (or a new checkpoint) to compute it from the start"
_WHY = {
    "key": "results are keyed by it and the state is placed by it; " + _NEW_CHECKPOINT,
    "time": "windows were assigned by the old time column; " + _NEW_CHECKPOINT,
    "window": "the state holds the old windows' partial results; " + _NEW_CHECKPOINT,
    "layout": (
        "fixed windows and sessions keep their state differently, and the result table "
        "would mix both; " + _NEW_CHECKPOINT
    ),
    "metric_new": (
        "the state holds no value of it for the events already counted, and {why}, so "
        "its windows would be wrong; " + _NEW_CHECKPOINT
    ),
    "metric_changed": (
        "the state holds the old definition's partial results under this name; give "
        "the new definition a new name in a new aggregation, or " + _NEW_CHECKPOINT
    ),
}
_APPLIED = {
    "watermark_ms": "from the next batch on (events already dropped as late stay dropped)",
    "output": "from the next batch on",
    "keep_closed_ms": "from the next batch on",
    "where": "events from the next batch on; windows already counted keep what they counted",
    "columns": "events from the next batch on; windows already counted keep what they counted",
    "lookups": "events from the next batch on; windows already counted keep what they counted",
    "state_partitions": "the state is moved to the new count when the run starts, each key "
    "to its partition by the new count (a kill during the move is safe: the old partitions "
    "stay current until it is done)",
    "metric_new": "computed from the source's retained records up to where the newest "
    "batch ended, when the run starts — into the open windows' state and the result rows "
    "already written (the other metrics' values are kept as they are)",
    "metric_gone": "left out of results from the next batch on; its state is dropped as "
    "each window is next written (rows already in the result table keep the column)",
}
_PARTS = {
    "key": "key",
    "time": "time column",
    "window": "window",
    "state_partitions": "state partitions",
    "watermark_ms": "watermark",
    "output": "output",
    "keep_closed_ms": "keep_closed",
    "where": "where",
    "columns": "columns",
    "lookups": "lookups",
}


def _metric_label(name: str) -> str:
    return f"metric '{name}'"


def _metric_of(label: str) -> str:
    """The metric's name in a change's part (:func:`_metric_label`)."""
    return label[len("metric '") : -1]


def _layout(window: Mapping[str, Any] | None) -> str | None:
    if window is None:
        return None
    return "sessions" if window.get("kind") == "Session" else "fixed"


def unreplayable(now: Mapping[str, Any], source: str | None) -> str | None:
    """Why a metric added to shape ``now`` cannot be backfilled (None: it can).
    ``source``: why the source's records cannot be read again (None: they can — a
    riverbed topic or a Kafka topic, by offsets)."""
    if source is not None:
        return source
    if _layout(now.get("window")) == "sessions":
        return "backfilling session windows is not supported yet"
    if now.get("lookups"):
        return "backfilling an aggregation with lookups is not supported yet"
    return None


def compare(
    recorded: Mapping[str, Any] | None, now: Mapping[str, Any], source: str | None = None
) -> list[Change]:
    """What running shape ``now`` on a checkpoint that recorded ``recorded`` does, part
    by part (``recorded``: a :func:`shape`, a :func:`legacy_shape`, or None — nothing
    recorded: no changes). Parts ``recorded`` does not hold (an older riverbed's) are
    taken as unchanged. ``source``: why the source cannot be read again from its
    retained offsets, if it cannot (:func:`unreplayable`)."""
    if recorded is None:
        return []
    out: list[Change] = []

    def part(field: str, refused: bool) -> None:
        if field not in recorded:
            return
        was, is_now = recorded[field], now.get(field)
        name = _PARTS[field]
        if was == is_now:
            out.append(Change(name, was, is_now, "kept", ""))
        elif refused:
            out.append(Change(name, was, is_now, "refused", _WHY[field]))
        else:
            out.append(Change(name, was, is_now, "applied", _APPLIED[field]))

    # a legacy record knows only fixed windows vs sessions
    if "layout" in recorded and "window" not in recorded:
        was_layout, now_layout = recorded["layout"], _layout(now.get("window"))
        action: Action = "kept" if was_layout == now_layout else "refused"
        out.append(
            Change(
                "window",
                was_layout,
                now_layout,
                action,
                _WHY["layout"] if action == "refused" else "",
            )
        )
    elif "window" in recorded:
        was_w, now_w = recorded["window"], now.get("window")
        if was_w == now_w:
            out.append(Change("window", was_w, now_w, "kept", ""))
        else:
            why = _WHY["layout"] if _layout(was_w) != _layout(now_w) else _WHY["window"]
            out.append(Change("window", was_w, now_w, "refused", why))
    for field in ("key", "time"):
        part(field, refused=True)
    for field in (
        "state_partitions",
        "watermark_ms",
        "keep_closed_ms",
        "output",
        "where",
        "columns",
        "lookups",
    ):
        part(field, refused=False)
    if "metrics" in recorded:
        was_m: Mapping[str, Any] = recorded["metrics"]
        now_m: Mapping[str, Any] = now.get("metrics", {})
        for name in sorted(set(was_m) | set(now_m)):
            label = _metric_label(name)
            a, b = was_m.get(name), now_m.get(name)
            if a == b:
                out.append(Change(label, a, b, "kept", ""))
            elif a is None:
                cannot = unreplayable(now, source)
                if cannot is None:
                    out.append(Change(label, None, b, "backfilled", _APPLIED["metric_new"]))
                else:
                    refusal = _WHY["metric_new"].format(why=cannot)
                    out.append(Change(label, None, b, "refused", refusal))
            elif b is None:
                out.append(Change(label, a, None, "applied", _APPLIED["metric_gone"]))
            else:
                out.append(Change(label, a, b, "refused", _WHY["metric_changed"]))
    return out


def plan(
    name: str,
    recorded: Mapping[str, Any] | None,
    now: Mapping[str, Any],
    since: int | None,
    source: str | None = None,
) -> Plan:
    """The :class:`Plan` of starting shape ``now`` (``recorded`` None: a first start;
    ``source``: as :func:`compare` takes it)."""
    return Plan(name, recorded is None, tuple(compare(recorded, now, source)), since)
