"""riverbed's exception hierarchy.

Every error riverbed raises on purpose derives from :class:`RiverbedError`, so a
caller can catch one class at a boundary (the CLI does) and show one clear line.
Messages name the thing, the cause and the fix.

::

    RiverbedError
    ├── SpecError                   a spec a user wrote is malformed (jobs', time ranges')
    ├── FencedError                 a writer whose term is over tried to write
    │                               (jobs', time ranges', a stream driver's)
    ├── ConfigError                 bad riverbed.toml / RIVERBED_* value
    ├── NewerFormatError            stored data a newer riverbed wrote (riverbed.formats)
    ├── InvalidValueError           a value a caller gave is malformed or out of range;
    │   │                           also a ValueError. Each package has its own:
    │   ├── DurationError           "1h30m" and friends
    │   ├── LogValueError, StateValueError, ControlValueError, StreamValueError,
    │   │   JobsValueError, StorageValueError, SourceOptionError (riverbed.spark),
    │   │   UsageError (the CLI)
    ├── LogError                    (riverbed.log.errors)
    ├── StateError                  (riverbed.state.errors)
    ├── StreamError                 (riverbed.stream.errors)
    ├── JobsError                   (riverbed.jobs.errors)
    ├── StorageError                (riverbed.storage.errors)
    │   ├── ObjectNotFoundError     an object that must exist does not
    │   ├── StorageAccessError      no such bucket, bad credentials, no permission
    │   └── StorageUnavailableError the store did not answer for as long as told to wait
    └── ControlError                (riverbed.control.errors)
        ├── InvalidURLError         unknown scheme or malformed control URL
        ├── UnavailableError        server unreachable / no endpoint answered
        ├── KeyNotFoundError        a key that must exist does not
        ├── LeaseNotFoundError      lease expired or revoked
        ├── CompactedError          watch start revision was compacted away
        ├── LockTimeoutError        lock/election not acquired in time
        └── SessionLostError        a session's lease expired while it was held
"""

from __future__ import annotations


class RiverbedError(Exception):
    """Root of every error riverbed raises on purpose."""


class SpecError(RiverbedError):
    """A spec a user wrote (a job module, a time-range or stream spec file) does not
    load or is malformed; each package that loads specs derives its own."""


class FencedError(RiverbedError):
    """A writer that no longer holds its term — a newer driver, attempt or leader took
    over — tried to write, and nothing was written; each fenced package derives its own."""


class ConfigError(RiverbedError):
    """A configuration value is missing or malformed."""


class NewerFormatError(RiverbedError):
    """Stored data is in a format newer than this riverbed reads (:mod:`riverbed.formats`):
    nothing is read or written past it."""


class InvalidValueError(RiverbedError, ValueError):
    """A value a caller gave riverbed is malformed or out of range — the caller's
    mistake, named with the fix, not a failure. Also a :class:`ValueError`, so code
    that validated with ``except ValueError`` keeps working; each package derives its
    own from this and from the package's root error."""


class DurationError(InvalidValueError):
    """A duration ("10m", "1h30m", seconds) that cannot be read."""
