"""Errors of the event log."""

from __future__ import annotations

from typing import Any

from riverbed.errors import InvalidValueError, RiverbedError


class LogError(RiverbedError):
    """Base of every log error."""


class TopicNotFoundError(LogError):
    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic '{topic}' does not exist; create it with "
            f"`riverbed topic create {topic} --partitions N`"
        )
        self.topic = topic


class TopicExistsError(LogError):
    pass


class CorruptLogError(LogError):
    """Stored bytes failed their checksum or framing where whole data was expected;
    ``damage`` (a :class:`riverbed.log.base.Damage`, when known) says which offsets."""

    damage: Any = None


class SerdeError(LogError):
    """A value could not be serialized or deserialized with the topic's serde."""


class OffsetOutOfRangeError(LogError):
    """The offset is before the partition's first retained record or past its end."""


class GroupError(LogError):
    """A consumer-group operation failed (stale generation, lost claim, bad config)."""


class RecordRejectedError(LogError, ValueError):
    """A value that does not fit its typed topic's schema: ``index`` (in the call's
    values) and ``field`` say which, so a pipeline can route it to a dead-letter topic."""

    def __init__(self, message: str, *, index: int, field: str | None, reason: str = "") -> None:
        super().__init__(message)
        self.index, self.field, self.reason = index, field, reason


class LogValueError(LogError, InvalidValueError):
    """A malformed or out-of-range value given to the log (a topic setting, a batch)."""
