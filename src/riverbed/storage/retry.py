"""When to try a storage request again, and how long to wait: pure decisions.

:func:`classify` sorts a failure by what its text says (S3 error codes, HTTP status,
transport errors) into *transient* (retry with backoff: 5xx, ``SlowDown``, throttling,
timeouts, refused connections), *access* (stop with a message: no such bucket, bad
credentials, no permission), *missing* (no such key), *exists* (a create-only write
lost) and *past-end* (a range read that starts after the object). :func:`backoff` is
full jitter over a capped exponential — the schedule AWS's own SDKs use — so many
clients that failed together do not retry together.
"""

from __future__ import annotations

import re

TRANSIENT, ACCESS, MISSING, EXISTS, OTHER = "transient", "access", "missing", "exists", "other"
PAST_END = "past-end"  # a range that starts at or after the object's end (416)

_ACCESS_CODES = (
    "NoSuchBucket",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "InvalidBucketName",
    "PermanentRedirect",
    "AuthorizationHeaderMalformed",
    "ExpiredToken",
    "InvalidToken",
)
_TRANSIENT_MARKS = (
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "TooManyRequests",
    "error sending request",
    "connection",
    "Connection",
    "timed out",
    "timeout",
    "operation timed out",
    "broken pipe",
    "reset by peer",
    "unexpected EOF",
    "error decoding response body",
    "IncompleteBody",
)
_STATUS = re.compile(r"status code: (\d{3})")


def classify(text: str, kind: str = "") -> str:
    """What a failure is, from its message and its exception class name."""
    if any(code in text for code in _ACCESS_CODES):
        return ACCESS
    if kind in ("PermissionDeniedError", "UnauthenticatedError"):
        return ACCESS
    if kind in ("AlreadyExistsError", "PreconditionError") or "PreconditionFailed" in text:
        return EXISTS
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        if code >= 500 or code in (408, 429):
            return TRANSIENT
        if code in (401, 403):
            return ACCESS
        if code == 404:
            return MISSING
        if code == 416:
            return PAST_END
    if kind in ("NotFoundError", "FileNotFoundError") or "NoSuchKey" in text:
        return MISSING
    if any(mark in text for mark in _TRANSIENT_MARKS):
        return TRANSIENT
    return OTHER


def backoff(attempt: int, u: float, base: float = 0.1, cap: float = 5.0) -> float:
    """Seconds to wait before retry number ``attempt`` (0 = the first retry), given a
    uniform draw ``u`` in [0, 1): full jitter, ``u * min(cap, base * 2**attempt)``."""
    return float(u * min(cap, base * 2.0 ** min(attempt, 32)))


__all__ = ["ACCESS", "EXISTS", "MISSING", "OTHER", "PAST_END", "TRANSIENT", "backoff", "classify"]
