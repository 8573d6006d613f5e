"""Hostile input: the records a topic of other producers can hold, and what riverbed
does with each (docs/stream.md, "What riverbed does with bad input").

Each :class:`Case` is a record as bytes on the wire (value, key, headers) and its
outcome: ``aggregated`` (as the event it names), ``malformed`` (counted, sent to the
aggregation's ``.dlq`` topic) or ``late``. The suite (``test_hostile_input.py``) writes
well-formed events with the cases among them into every kind of source and checks that
the stream never stops and that its results equal pandas over the well-formed events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import pandas as pd

from tests.stream.conftest import T0

Outcome = Literal["aggregated", "malformed", "late"]
SCHEMA = "user_id long, flag string, amount double, ts timestamp"
AT = T0 + timedelta(hours=2, minutes=10)  # inside the well-formed events' hours
BIG = 10 * 1024 * 1024  # "strings of 10 MB"


def _event(**fields: Any) -> dict[str, Any]:
    return {"user_id": 7, "flag": "f1", "amount": 2.5, "ts": AT.isoformat()} | fields


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


@dataclass(frozen=True)
class Case:
    """One hostile record and what becomes of it."""

    name: str
    value: bytes | None  # None: Kafka's null value (a tombstone when it has a key)
    outcome: Outcome
    event: dict[str, Any] | None = None  # what an aggregated or late record counts as
    key: bytes | None = b"f1"
    headers: dict[str, bytes] = field(default_factory=dict)
    kafka_only: bool = False  # a null value: riverbed's own topics store none

    def __repr__(self) -> str:
        return f"Case({self.name})"


def _aggregated(name: str, fields: dict[str, Any], **extra: Any) -> Case:
    """A record whose value is ``fields`` as JSON, counted as that event."""
    event = _event(**fields)
    return Case(name, _json(event), "aggregated", event=event, **extra)


def _malformed(name: str, value: bytes | None, **extra: Any) -> Case:
    return Case(name, value, "malformed", **extra)


def _bad_fields(name: str, **fields: Any) -> Case:
    return _malformed(name, _json(_event(**fields)))


def _without(name: str, *drop: str) -> Case:
    event = {k: v for k, v in _event().items() if k not in drop}
    return _malformed(name, _json(event))


CASES: list[Case] = [
    # values that are not an event at all
    _malformed("null value", None, key=None, kafka_only=True),
    _malformed("tombstone", None, kafka_only=True),
    _malformed("empty value", b""),
    _malformed("JSON null", b"null"),
    _malformed("JSON array", b"[1, 2, 3]"),
    _malformed("JSON number", b"42"),
    _malformed("JSON string", b'"an event"'),
    _malformed("not JSON", b"{not json"),
    _malformed("invalid UTF-8", b'{"user_id": 7, "flag": "f\xff\xfe", "amount": 1.0}'),
    _malformed("10 MB of garbage", b"\x00garbage" * (BIG // 8)),
    # wrong types per field
    _bad_fields("a string for a long", user_id="seven"),
    _bad_fields("a digit string for a long", user_id="7"),
    _bad_fields("a boolean for a long", user_id=True),
    _bad_fields("a fraction for a long", user_id=7.5),
    _bad_fields("a string for a double", amount="ten"),
    _bad_fields("an object for a double", amount={"value": 1}),
    _bad_fields("a time that is no time", ts="yesterday"),
    # what the aggregation cannot do without
    _without("no key", "flag"),
    _without("no time", "ts"),
    _bad_fields("a null key", flag=None),
    _bad_fields("a null time", ts=None),
    # numbers out of range
    _malformed("NaN", _json(_event()).replace(b"2.5", b"NaN")),
    _malformed("Infinity", _json(_event()).replace(b"2.5", b"Infinity")),
    _malformed("-Infinity for a long", _json(_event()).replace(b": 7,", b": -Infinity,")),
    _bad_fields("a long past 2**63", user_id=2**63),
    _bad_fields("a long past -2**63", user_id=-(2**63) - 1),
    _bad_fields("a double past 1e308", amount=10**400),
    _bad_fields("an epoch time past year 9999", ts=10**17),
    _bad_fields("a window past year 9999", ts="9999-12-31T23:30:00+00:00"),
    # before 1970: state keys hold a window's start as unsigned epoch milliseconds (an
    # event of 1950 in a first batch once stopped the stream: "must be >= 0 ms")
    _bad_fields("a time before 1970", ts="1950-06-01T00:00:00+00:00"),
    # well-formed, if odd: aggregated by the documented rules
    _aggregated("a negative long", {"user_id": -7}),
    _aggregated("the smallest long", {"user_id": -(2**63)}),
    _aggregated("an integral double for a long", {"user_id": 8.0}),
    _aggregated("an integer for a double", {"amount": 3}),
    _aggregated("no amount", {"amount": None}),
    _aggregated("a number for the key", {"flag": 12}),
    _aggregated("an epoch-ms time", {"ts": int(AT.timestamp() * 1000)}),
    _aggregated("a naive time is UTC", {"ts": AT.replace(tzinfo=None).isoformat()}),
    _aggregated("a field it does not read", {"note": "n" * BIG}),
    _aggregated("a key of 10 kB", {"flag": "k" * 10_000}),
    _aggregated("a key that is not UTF-8", {}, key=b"\xff\xfe"),
    _aggregated("headers", {}, headers={"trace": b"\x00\x01", "source": b"test"}),
    Case(
        "a field twice: the last counts",
        _json(_event()).replace(b'"user_id": 7', b'"user_id": 1, "user_id": 9'),
        "aggregated",
        event=_event(user_id=9),
    ),
]

# Event times at the ends of the calendar, written after the rest has run (year 9999
# closes every window before it, so it comes last)
YEAR_1 = _malformed("year 1", _json(_event(ts="0001-01-01T00:00:00+00:00")))
YEAR_9999 = _aggregated("year 9999", {"ts": "9999-12-31T22:00:00+00:00"})


def well_formed(cases: list[Case]) -> pd.DataFrame:
    """The aggregated cases as events (the oracle's rows for them)."""
    rows = [c.event for c in cases if c.outcome == "aggregated" and c.event is not None]
    frame = pd.DataFrame(rows, columns=["user_id", "flag", "amount", "ts"])
    frame["user_id"] = frame["user_id"].astype("int64")
    frame["flag"] = frame["flag"].map(str)
    frame["amount"] = frame["amount"].astype("float64")
    # microseconds: years 1-9999 (pandas' default nanoseconds end in 2262)
    frame["ts"] = pd.Series([_utc(t) for t in frame["ts"]], dtype="datetime64[us, UTC]")
    return frame


def _utc(value: Any) -> pd.Timestamp:
    if isinstance(value, int):
        return pd.Timestamp(value, unit="ms", tz="UTC")
    parsed = datetime.fromisoformat(value)
    stamp = pd.Timestamp(parsed).as_unit("us")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
