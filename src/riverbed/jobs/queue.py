"""The jobs queue: submissions, claims, results — every transition one transaction.

States::

    MASTER ─────────────────────────────────────────────► DONE | FAILED | CANCELED
    QUEUED ──(last dependency DONE)──► PENDING ──claim──► RUNNING ──► DONE
       │                                  ▲                  ├──► PENDING (retry, backoff)
       └──► UPSTREAM_FAILED | CANCELED    └──────────────────┤──► SPLIT (bisected in two)
                                                             └──► FAILED | CANCELED

Rules every method keeps:

1. **Fencing by attempt.** A claim increments ``attempt``; a heartbeat, result or
   failure is applied only ``WHERE id = ? AND attempt = ? AND state = 'RUNNING'`` and
   the row count is checked — a stale attempt gets :class:`FencedError` and changes
   nothing.
2. **Fencing by term.** What the orchestrator does (reaping, timeouts, cron) runs
   inside a transaction that first reads the term row and refuses a stale term;
   :meth:`JobQueue.fence` raises the term when a new leader takes over.
3. **Readiness in the completing transaction.** A chunk's success decrements its
   dependents' ``deps_left`` and turns those at zero PENDING in the same transaction,
   so no orchestrator round trip sits between dependency levels. Only a *success*
   counts.
4. **One transaction per submission**: the master row, every chunk, edge and
   membership, or nothing.
"""

from __future__ import annotations

from riverbed.jobs.claims import Claims
from riverbed.jobs.duties import Duties
from riverbed.jobs.queuebase import ACTIVE, ENDED, Claim, Policy
from riverbed.jobs.submission import Submission


class JobQueue(Submission, Claims, Duties):
    """Operations on one jobs database (see the module doc for the rules): submission
    and cancellation (:mod:`~riverbed.jobs.submission`), workers' claims and results
    (:mod:`~riverbed.jobs.claims`), the orchestrator's duties
    (:mod:`~riverbed.jobs.duties`), and the reads of :class:`QueueReader`."""


__all__ = ["ACTIVE", "ENDED", "Claim", "JobQueue", "Policy"]
