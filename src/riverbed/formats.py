"""Every format riverbed stores, the version this riverbed writes, and the one refusal of
data a newer riverbed wrote.

A reader that finds a version above :data:`CURRENT`'s raises :class:`~riverbed.errors.
NewerFormatError` in one line naming the data, both versions and the way out — before
it reads or writes anything past it, so a downgrade never damages what an upgrade
wrote. Data from before a format carried its version reads as version 1. Where each
version is kept:

=========================  ============================================================
format                     where its version is
=========================  ============================================================
``checkpoint``             ``riverbed/format.json`` of a stream checkpoint (batch
                           records, spec shapes, state generations, backfilled rows),
                           written by its first start (:mod:`riverbed.stream.layout`)
``spec shape``             ``version`` of each ``riverbed/specs/<hash>.json`` (2: its
                           state holds a hopping window's panes; 1 otherwise)
``savepoint``              ``format`` of each ``riverbed/savepoints/<name>.json``
``result table``           ``riverbed.format`` in each Parquet file's key-value metadata
``state changelog``        the byte after ``RBCL`` in each changelog's header (3: its
                           body zstd-compressed; 2, read still: not compressed)
``state snapshot``         ``format`` of each snapshot's ``MANIFEST.riverbed.json``
``topic``                  ``format`` of a topic's configuration (``topic.json``, the
                           diskless catalog, the log server's answers)
``jobs database``          ``schema_version`` in the jobs database's ``rb_jobs_meta``
``join state``             ``format`` of a join checkpoint's ``riverbed/join.json`` (2:
                           a batch's events of a side as one Arrow segment; 1, read
                           still: a msgpack list per key, rewritten by the next batch)
=========================  ============================================================

Changing a format means raising its number here, writing the new one, and reading
every older one (migrating it once, crash-safe, where reading both costs too much);
``tests/compat`` holds data the released code wrote, resumed by today's.
"""

from __future__ import annotations

from riverbed import __version__
from riverbed.errors import NewerFormatError

__all__ = ["CURRENT", "check"]

CURRENT: dict[str, int] = {
    "checkpoint": 1,
    "spec shape": 2,  # 2: state holds panes (riverbed.stream.panes; written only then)
    "savepoint": 1,
    "result table": 1,
    "state changelog": 3,
    "state snapshot": 1,
    "topic": 2,  # 2: the placement epochs of `topic alter` (written only by altered topics)
    "jobs database": 1,
    "join state": 2,  # 2: Arrow segments (riverbed.stream.pairing)
}


def check(kind: str, found: int | None, where: str) -> None:
    """Refuse ``where``'s data of format ``kind`` at version ``found`` (None: from before
    it carried one — version 1) when it is newer than this riverbed reads."""
    current = CURRENT[kind]
    if found is not None and int(found) > current:
        raise NewerFormatError(
            f"{where}: its {kind} format is version {found}, newer than riverbed "
            f"{__version__} reads (version {current}); run the riverbed that wrote it, or "
            "a newer one — nothing was read or changed"
        )
