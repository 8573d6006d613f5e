"""Child-process programs for the jobs process tests (run as scripts, not imported)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from riverbed.jobs import Job
from riverbed.jobs.graph import node_keys, resolve
from riverbed.jobs.queue import JobQueue, Policy


class _DieOnSecondLookup(dict[str, Policy]):
    """Policies that SIGKILL this process on the second lookup: after the master row
    and mid-way through writing the chunks of one submission."""

    def __init__(self, jobs: Iterator[str]) -> None:
        super().__init__({j: Policy() for j in jobs})
        self.lookups = 0

    def __getitem__(self, key: str) -> Policy:
        self.lookups += 1
        if self.lookups == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(key)


def _main(ctx: Any, work_ids: list[int], **kwargs: Any) -> None:
    pass


def submit_and_die(url: str) -> None:
    specs = {"X": Job(main=_main, name="X", chunk_size=1)}
    queue = JobQueue(url)
    queue.submit(
        node_keys(specs, "X"),
        lambda f, a, n: resolve(specs, "X", list(range(100)), {}, f, a, n),
        _DieOnSecondLookup(iter(specs)),
    )


def hold_term(url: str, idle_limit: str) -> None:
    """Claim term 1 as orchestrator "old", open a grooming transaction (the term checked
    inside it: the meta row's share lock held), say so and stop there (SIGSTOP); when
    continued, write a fire row in the same transaction."""
    from sqlalchemy import insert

    from riverbed.jobs.schema import Database, fires

    queue = JobQueue(Database(url, idle_limit=int(idle_limit)))
    queue.fence(1, "old")
    with queue.db.write() as conn:
        queue.term_fence.check_in(conn, 1)
        print("holding", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        conn.execute(insert(fires).values(job="zombie", fire_time=1.0, master=None, note="late"))
    print("wrote", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "submit-and-die":
        submit_and_die(args[0])
    elif command == "hold-term":
        hold_term(*args)
    else:
        sys.exit(f"unknown command {command}")
