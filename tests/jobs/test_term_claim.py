"""A newer orchestrator's claim of the term against an older one that went silent in the
middle of a write (cut off, paused): the database ends the silent transaction, the claim
goes through, and the older one's write never lands — on real PostgreSQL and MariaDB."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from riverbed.jobs.queue import JobQueue
from riverbed.jobs.schema import IDLE_IN_TRANSACTION, fires
from riverbed.testing.signals import wait_stopped
from tests.jobs.conftest import SERVERS

PROCS = Path(__file__).with_name("procs.py")


@pytest.mark.parametrize("kind", SERVERS)
def test_a_claim_goes_through_when_the_older_term_went_silent_inside_a_write(
    kind: str,
    request: pytest.FixtureRequest,
    subprocess_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = request.getfixturevalue(f"{kind}_db")
    JobQueue(url).close()
    holder = subprocess.Popen(
        [sys.executable, str(PROCS), "hold-term", url, "10"],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    queue = JobQueue(url)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "holding\n", holder.communicate()
        wait_stopped(holder, 60, "the holder did not stop")
        failures: list[BaseException] = []

        def claim() -> None:
            try:
                queue.fence(2, "new")
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        caplog.set_level(logging.WARNING, "riverbed.jobs.termfence")
        claimer = threading.Thread(target=claim, daemon=True)
        claimer.start()
        # the holder's session ends after 10 s of silence (the claim says after 2 s whom
        # it waits for); unbounded before the fix
        claimer.join(timeout=90)
        assert not claimer.is_alive(), "the claim still waits for the silent holder"
        assert failures == []
        current = queue.term_fence.current()
        assert current is not None and (current.term, current.holder) == (2, "new")
        assert "the claim of term 2 waits for a write of old (term 1)" in caplog.text
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        out, err = holder.communicate(timeout=60)
    # woken, the older term's transaction is gone: its write fails, nothing lands
    assert holder.returncode != 0 and "wrote" not in out, (out, err)
    assert "jobs database" in err, err
    with queue.db.read() as conn:
        assert conn.execute(select(func.count()).select_from(fires)).scalar() == 0
    queue.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_every_session_is_ended_after_the_idle_limit_and_a_claim_leaves_no_setting_behind(
    kind: str, request: pytest.FixtureRequest
) -> None:
    queue = JobQueue(request.getfixturevalue(f"{kind}_db"))
    queue.fence(1, "o")
    for engine in (queue.db.engine, queue.db.reader):
        with engine.connect() as conn:
            if kind == "postgres":
                limit = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
                assert limit == f"{IDLE_IN_TRANSACTION}s"
            else:
                limit = conn.execute(text("SELECT @@session.idle_transaction_timeout")).scalar()
                assert int(limit) == IDLE_IN_TRANSACTION
                waits = conn.execute(
                    text(
                        "SELECT @@session.innodb_lock_wait_timeout, "
                        "@@global.innodb_lock_wait_timeout"
                    )
                ).one()
                assert waits[0] == waits[1]  # the claim's short wait was put back
    queue.close()


@pytest.mark.postgres
def test_the_cluster_demo_says_who_leads_and_which_transactions_wait_when_no_standby_leads(
    postgres_db: str, tmp_path: Path
) -> None:
    from riverbed.control import Election, Session, connect
    from riverbed.demo.cluster_jobs import _failover_state
    from riverbed.jobs.orchestrator import ELECTION

    queue = JobQueue(postgres_db)
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    assert _failover_state(queue, cp).startswith("the election names nobody")
    with Session(cp, ttl=10) as session:
        Election(cp, ELECTION, session).campaign("o2")
        with queue.db.write() as conn:  # a transaction open beside the diagnosis
            conn.execute(text("SELECT 1"))
            said = _failover_state(queue, cp)
    assert "the election names 'o2'" in said, said
    assert "idle in transaction" in said and "'SELECT 1'" in said, said
    cp.close()
    queue.close()


SELECTS_AND_CLAIMS = '''
import threading

from riverbed.jobs import Job
from riverbed.jobs.queue import JobQueue


def select_work():
    """Claim a newer term while the fire is being prepared: a claim that waits means
    this runs inside the fire's transaction (which holds the term's lock)."""
    done = threading.Event()

    def claim():
        queue = JobQueue(URL)
        queue.fence(2, "new")
        queue.close()
        done.set()

    threading.Thread(target=claim, daemon=True).start()
    # less than the server's 30 s idle limit, after which a claim waiting for the
    # fire's lock would go through (the server ends the fire's transaction)
    if not done.wait(20):
        with open(WAITED, "a") as f:
            f.write("the claim waited for the fire's transaction")
        raise RuntimeError("the claim waited for the fire's transaction")
    return [1]


job = Job(main=print, select_work=select_work, schedule={"every": "1s"})
'''


@pytest.mark.parametrize("kind", ["sqlite", *SERVERS])
def test_a_fire_runs_the_jobs_select_work_outside_its_transaction(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from riverbed.control import connect
    from riverbed.jobs import FencedError
    from riverbed.jobs.orchestrator import Orchestrator
    from riverbed.jobs.spec import Catalog

    url = (
        f"sqlite:///{tmp_path / 'jobs.db'}"
        if kind == "sqlite"
        else request.getfixturevalue(f"{kind}_db")
    )
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    waited = tmp_path / "waited"
    (jobs / "picky.py").write_text(
        f"URL = {url!r}\nWAITED = {str(waited)!r}\n" + SELECTS_AND_CLAIMS
    )
    queue = JobQueue(url)
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    try:
        orch = Orchestrator(queue, cp, Catalog(jobs), tmp_path, sweep_every=3600)
        queue.fence(1, "old")
        orch._sync_schedules(1)
        deadline = time.monotonic() + 120
        # the schedule falls due within a second or two; its fire then meets the claim
        # select_work made: refused, nothing submitted
        with pytest.raises(FencedError, match=r"\(term 1\) was replaced by new \(term 2\)"):
            while time.monotonic() < deadline:
                orch.duties(1)
                time.sleep(0.2)
        assert not waited.exists(), waited.read_text()
        assert queue.runs() == []
    finally:
        queue.close()
        cp.close()
