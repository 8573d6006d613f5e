"""riverbed's exception hierarchy.

Every error riverbed raises on purpose derives from :class:`RiverbedError`, so a
caller can catch one class at a boundary (the CLI does) and show one clear line.
Messages name the thing, the cause and the fix.

::

    RiverbedError
    ├── ConfigError                 bad riverbed.toml / RIVERBED_* value
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


class ConfigError(RiverbedError):
    """A configuration value is missing or malformed."""
