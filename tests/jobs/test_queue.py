"""The queue's contract, on SQLite and on real PostgreSQL and MariaDB servers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from riverbed.jobs import Dependency, FencedError, Job, QueueError
from riverbed.jobs.graph import node_keys, resolve
from riverbed.jobs.queue import JobQueue, Policy
from riverbed.jobs.schema import chunks, edges, latest, members


def _main(ctx: Any, work_ids: list[int], **kwargs: Any) -> None:
    pass


def job(name: str, chunk: int | None, *deps: Dependency) -> Job:
    return Job(main=_main, name=name, chunk_size=chunk, dependencies=deps)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobQueue]:
    if request.param == "sqlite":
        q = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    else:
        q = JobQueue(request.getfixturevalue(f"{request.param}_db"))
    yield q
    q.close()


def submit(
    q: JobQueue,
    specs: Mapping[str, Job],
    root: str,
    ids: list[int],
    policies: Mapping[str, Policy] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> int:
    pol = {n: Policy() for n in specs} | dict(policies or {})
    master, _ = q.submit(
        node_keys(specs, root, kwargs),
        lambda fresh, active, now: resolve(specs, root, ids, kwargs, fresh, active, now),
        pol,
    )
    return master


def state(q: JobQueue, chunk_id: int) -> str:
    return str(q.get(chunk_id)["state"])


def by_job(q: JobQueue, master: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in q.graph(master):
        out.setdefault(row["job"], []).append(row)
    return out


def drain(q: JobQueue, fail_if: Any = lambda c: False) -> list[int]:
    """Claim and finish chunks one at a time until none is claimable; checks that a
    chunk is claimed only after every upstream chunk succeeded."""
    order = []
    while True:
        claims = q.claim("w1", "host", 1)
        if not claims:
            return order
        c = claims[0]
        for up in q.get(c.id)["upstream"]:
            assert state(q, up) == "DONE", (c.id, up)
        order.append(c.id)
        if fail_if(c):
            q.fail(c.id, c.attempt, "boom")
        else:
            q.succeed(c.id, c.attempt)


SEED = {
    "A": job("A", 3, Dependency("B", max_lag="1h"), Dependency("C", max_lag="1h")),
    "B": job("B", 2, Dependency("E", max_lag="1h")),
    "C": job("C", 6, Dependency("D", max_lag="1h")),
    "D": job("D", 6),
    "E": job("E", 6),
}


def test_a_graph_runs_in_dependency_order_and_records_freshness(queue: JobQueue) -> None:
    master = submit(queue, SEED, "A", [1, 2, 3, 4, 5, 6])
    graph = by_job(queue, master)
    assert {j: len(rows) for j, rows in graph.items()} == {"A": 2, "B": 3, "C": 1, "D": 1, "E": 1}
    assert sorted(r["state"] for rows in graph.values() for r in rows).count("PENDING") == 2
    order = drain(queue)
    assert len(order) == 8
    assert state(queue, master) == "DONE"
    fresh = queue.fresh_ids("B", "{}")
    assert sorted(fresh) == [1, 2, 3, 4, 5, 6]
    # Resubmitted now, everything below A is fresh: only A's chunks run.
    again = submit(queue, SEED, "A", [1, 2, 3, 4, 5, 6])
    assert sorted(by_job(queue, again)) == ["A"]


def test_a_success_records_the_code_version_it_ran_and_a_later_one_replaces_it(
    queue: JobQueue,
) -> None:
    """Both success paths (one chunk; a batch with a claim) keep each work id's code
    version beside its time, and a run without work ids keeps the job's; a submission
    reads them back (``inputs``) for the resolver's staleness by code."""
    specs = {"A": job("A", None, Dependency("B")), "B": job("B", 2), "N": job("N", None)}
    old = {"A": Policy(code_version="git:1 src:old"), "B": Policy(code_version="git:1 src:old")}
    submit(queue, specs, "A", [1, 2, 3, 4], old)
    b1, b2 = sorted(queue.claim("w1", "h", limit=2), key=lambda c: c.id)
    queue.succeed(b1.id, b1.attempt)
    (a,) = queue.succeed_and_claim(b2, False, "w1", "h", limit=5)
    queue.succeed_many_and_claim([(a, False)], "w1", "h", limit=1)
    submit(queue, {"B": specs["B"]}, "B", [3, 4], {"B": Policy(code_version="git:2 src:new")})
    (b,) = queue.claim("w1", "h")
    queue.succeed_many_and_claim([(b, False)], "w1", "h", limit=1)
    submit(queue, {"N": specs["N"]}, "N", [], {"N": Policy(code_version="src:n1")})
    (n,) = queue.claim("w1", "h")
    queue.succeed(n.id, n.attempt)
    with queue.db.read() as conn:
        fresh, _ = queue.inputs(conn, [("B", "{}"), ("A", "{}"), ("N", "{}")], lock=False)
    assert fresh.code_by_id[("B", "{}")] == {
        1: "git:1 src:old",
        2: "git:1 src:old",
        3: "git:2 src:new",
        4: "git:2 src:new",
    }
    assert fresh.code_by_id[("A", "{}")] == dict.fromkeys([1, 2, 3, 4], "git:1 src:old")
    assert fresh.latest_code[("N", "{}")] == "src:n1"
    assert fresh.latest_code[("B", "{}")] == "git:2 src:new"


def test_a_dependency_counts_only_when_it_succeeded(queue: JobQueue) -> None:
    master = submit(queue, SEED, "A", [1, 2, 3, 4, 5, 6])
    order = drain(queue, fail_if=lambda c: c.job == "E")
    graph = by_job(queue, master)
    assert [r["state"] for r in graph["E"]] == ["FAILED"]
    assert {r["state"] for r in graph["B"]} == {"UPSTREAM_FAILED"}
    assert {r["state"] for r in graph["A"]} == {"UPSTREAM_FAILED"}
    # The independent branch (D → C) still ran to success.
    assert [r["state"] for r in graph["C"] + graph["D"]] == ["DONE", "DONE"]
    assert len(order) == 3
    row = queue.get(master)
    assert row["state"] == "FAILED" and "chunk(s) failed" in row["error"]


def test_the_master_fails_only_after_independent_chunks_finish(queue: JobQueue) -> None:
    master = submit(queue, SEED, "A", [1, 2, 3, 4, 5, 6])
    claims = {c.job: c for c in queue.claim("w1", "h", 2)}
    assert set(claims) == {"D", "E"}
    queue.fail(claims["E"].id, claims["E"].attempt, "boom")
    assert state(queue, master) == "MASTER"  # D is still running
    queue.succeed(claims["D"].id, claims["D"].attempt)
    c = queue.claim("w1", "h", 5)
    assert [x.job for x in c] == ["C"]
    queue.succeed(c[0].id, c[0].attempt)
    assert state(queue, master) == "FAILED"


def test_retries_back_off_then_run_again(queue: JobQueue) -> None:
    # The back-off is long enough that the three statements after the failure run
    # within it on a starved host too (0.3 s did not, on MariaDB under a one-core
    # quota: next_retry() found it over); the retry is then waited for, not slept to.
    backoff = 3.0
    master = submit(
        queue, {"X": job("X", None)}, "X", [1], {"X": Policy(max_attempts=2, backoff=backoff)}
    )
    first = queue.claim("w1", "h")[0]
    failed = time.monotonic()
    assert queue.fail(first.id, first.attempt, "flaky") == "PENDING"
    assert queue.claim("w1", "h") == []  # backing off
    assert 0 < (queue.next_retry() or 0) <= backoff
    assert time.monotonic() - failed < backoff  # (else the two checks above prove little)
    deadline = time.monotonic() + backoff + 30
    while not (again := queue.claim("w1", "h")) and time.monotonic() < deadline:
        time.sleep(0.05)  # a poll of the queue until the back-off is over
    assert time.monotonic() - failed >= backoff * 0.9, "claimable before its back-off ended"
    second = again[0]
    assert (second.id, second.attempt) == (first.id, 2)
    assert queue.fail(second.id, second.attempt, "again") == "FAILED"
    assert state(queue, master) == "FAILED"
    assert [a["state"] for a in queue.get(first.id)["attempts"]] == ["FAILED", "FAILED"]


def test_a_stale_attempt_can_neither_beat_nor_record(queue: JobQueue) -> None:
    submit(queue, {"X": job("X", None)}, "X", [1], {"X": Policy(max_attempts=3, backoff=0)})
    queue.fence(1, "orch")
    old = queue.claim("zombie", "h")[0]
    reaped = queue.reap(1, lambda: set(), stale_after=60)  # its lease expired
    assert [(r.id, r.attempt) for r in reaped] == [(old.id, old.attempt)]
    new = queue.claim("w2", "h")[0]
    assert (new.id, new.attempt) == (old.id, old.attempt + 1)
    assert queue.heartbeat("zombie", [(old.id, old.attempt)]) == {old.id: "lost"}
    with pytest.raises(FencedError):
        queue.succeed(old.id, old.attempt, output=True)
    with pytest.raises(FencedError):
        queue.fail(old.id, old.attempt, "late failure")
    assert state(queue, new.id) == "RUNNING"
    queue.succeed(new.id, new.attempt)
    row = queue.get(new.id)
    assert row["state"] == "DONE" and row["attempt"] == 2


def test_succeed_and_claim_records_promotes_and_claims_in_one_step(queue: JobQueue) -> None:
    specs = {"A": job("A", None, Dependency("B")), "B": job("B", 2), "C": job("C", 1)}
    master = submit(queue, specs, "A", [1, 2, 3, 4])
    b1, b2 = queue.claim("w1", "h", limit=2)
    assert queue.succeed_and_claim(b1, False, "w1", "h", limit=5) == []  # A waits for b2
    assert sorted(queue.fresh_ids("B", "{}")) == [1, 2]
    nxt = queue.succeed_and_claim(b2, False, "w1", "h", limit=5)
    assert [c.job for c in nxt] == ["A"]  # promoted and claimed by the same transaction
    assert nxt[0].attempt == 1 and state(queue, nxt[0].id) == "RUNNING"
    assert [a["state"] for a in queue.get(nxt[0].id)["attempts"]] == ["RUNNING"]
    assert queue.succeed_and_claim(nxt[0], False, "w1", "h", limit=5) == []
    assert state(queue, master) == "DONE"


def test_a_fenced_success_changes_nothing_and_claims_nothing(queue: JobQueue) -> None:
    specs = {"X": job("X", 1)}
    master = submit(queue, specs, "X", [1, 2], {"X": Policy(max_attempts=3, backoff=0)})
    queue.fence(1, "orch")
    old = queue.claim("zombie", "h")[0]
    queue.reap(1, lambda: set(), stale_after=60)
    before = queue.get(master)
    with pytest.raises(FencedError):
        queue.succeed_and_claim(old, True, "zombie", "h", limit=2)
    assert queue.get(master)["active_left"] == before["active_left"]
    assert state(queue, old.id) == "PENDING"  # re-queued, not DONE, not claimed by the zombie
    assert [a["state"] for a in queue.get(old.id)["attempts"]] == ["FAILED"]  # reaped
    assert queue.fresh_ids("X", "{}") == {}


def test_a_batch_of_successes_records_the_ours_and_skips_a_fenced_one(queue: JobQueue) -> None:
    """``succeed_many_and_claim`` (a worker's batch of short chunks): every success
    whose attempt is still ours is recorded — freshness, dependents, the run — and a
    reclaimed one in the middle changes nothing, not even the run's count."""
    specs = {"A": job("A", None, Dependency("B")), "B": job("B", 1)}
    master = submit(queue, specs, "A", [1, 2, 3, 4], {"B": Policy(max_attempts=3, backoff=0)})
    queue.fence(1, "orch")
    b1, b2 = queue.claim("w1", "h", limit=2)
    queue.reap(1, lambda: set(), stale_after=60)  # b1 and b2 reclaimed: attempt 1 is stale
    b1, b2, b3, b4 = sorted(queue.claim("w2", "h", limit=4), key=lambda c: c.id)
    stale = [c for c in (b1, b2) if c.attempt == 2]
    assert len(stale) == 2
    zombie = replace(b2, attempt=1)
    fenced, more = queue.succeed_many_and_claim(
        [(b1, True), (zombie, False), (b3, False)], "w2", "h", limit=5
    )
    assert fenced == [b2.id] and more == []  # A still waits for b2 and b4
    assert sorted(queue.fresh_ids("B", "{}")) == [1, 3]
    assert queue.get(b1.id)["output_attempt"] == 2 and state(queue, b2.id) == "RUNNING"
    assert queue.get(master)["active_left"] == 3  # b1, b3 counted; not the zombie
    fenced, more = queue.succeed_many_and_claim([(b2, False), (b4, False)], "w2", "h", limit=5)
    assert fenced == [] and [c.job for c in more] == ["A"]  # promoted and claimed at once
    assert queue.succeed_many_and_claim([(more[0], False)], "w2", "h", limit=1) == ([], [])
    assert state(queue, master) == "DONE"


def test_reaping_counts_against_the_retry_limit_and_says_why(queue: JobQueue) -> None:
    submit(queue, {"X": job("X", None)}, "X", [1])
    queue.fence(1, "orch")
    c = queue.claim("gone", "h")[0]
    queue.reap(1, lambda: {"other"}, stale_after=60)
    row = queue.get(c.id)
    assert row["state"] == "FAILED" and "worker gone lost" in row["error"]


def test_reaping_reads_the_workers_outside_its_transaction(queue: JobQueue) -> None:
    """The control plane may take seconds to answer (or a cut-off orchestrator forever):
    a newer term's claim made meanwhile goes through, and the reap is then refused."""
    submit(queue, {"X": job("X", None)}, "X", [1])
    queue.fence(1, "old")
    c = queue.claim("gone", "h")[0]
    other = JobQueue(queue.db.url)
    claimed = threading.Event()

    def live_workers() -> set[str]:
        threading.Thread(target=lambda: (other.fence(2, "new"), claimed.set()), daemon=True).start()
        assert claimed.wait(30), "the claim waited for the reap's transaction"
        return set()

    with pytest.raises(FencedError, match=r"\(term 1\) was replaced by new \(term 2\)"):
        queue.reap(1, live_workers, stale_after=60)
    assert state(queue, c.id) == "RUNNING"  # the refused reap changed nothing
    assert [r.id for r in queue.reap(2, lambda: set(), stale_after=60)] == [c.id]
    other.close()


def test_a_demoted_orchestrator_cannot_groom(queue: JobQueue) -> None:
    queue.fence(10, "new")
    for stale in (queue.reap, queue.overdue):
        with pytest.raises(FencedError, match=r"\(term 9\) was replaced by new \(term 10\)"):
            stale(9, *([lambda: set(), 60] if stale == queue.reap else []))
    with pytest.raises(FencedError):
        queue.fence(9, "old")
    with pytest.raises(FencedError):
        queue.fire(9, "X", 0.0, True, lambda conn: 1)
    queue.fence(11, "newer")
    with pytest.raises(FencedError):
        queue.reap(10, lambda: set(), 60)


def test_cancel_ends_waiting_chunks_and_stops_running_ones(queue: JobQueue) -> None:
    master = submit(queue, SEED, "A", [1, 2, 3, 4, 5, 6])
    running = queue.claim("w1", "h", 1)[0]
    assert queue.cancel(master) == {"waiting": 7, "running": 1}
    assert queue.heartbeat("w1", [(running.id, running.attempt)]) == {running.id: "cancel"}
    assert state(queue, master) == "MASTER"  # until the running chunk is stopped
    assert queue.fail(running.id, running.attempt, "stopped", cancelled=True) == "CANCELED"
    assert state(queue, master) == "CANCELED"
    assert queue.claim("w1", "h", 10) == []


def test_bisection_isolates_poison_work_ids(queue: JobQueue) -> None:
    poison = {5, 11}
    master = submit(queue, {"X": job("X", 8)}, "X", list(range(1, 17)), {"X": Policy(bisect=True)})
    drain(queue, fail_if=lambda c: bool(poison & set(c.work_ids)))
    rows = [r for r in queue.graph(master)]
    failed = [json.loads(r["work_ids"]) for r in rows if r["state"] == "FAILED"]
    assert sorted(failed) == [[5], [11]]
    done = sorted(w for r in rows if r["state"] == "DONE" for w in json.loads(r["work_ids"]))
    assert done == sorted(set(range(1, 17)) - poison)
    assert state(queue, master) == "FAILED"
    assert {r["state"] for r in rows} == {"SPLIT", "DONE", "FAILED"}


def test_bisected_halves_still_hold_back_dependents(queue: JobQueue) -> None:
    specs = {"A": job("A", None, Dependency("B")), "B": job("B", 4)}
    master = submit(queue, specs, "A", [1, 2, 3, 4], {"B": Policy(bisect=True)})
    drain(queue, fail_if=lambda c: c.job == "B" and 3 in c.work_ids)
    graph = by_job(queue, master)
    assert [r["state"] for r in graph["A"]] == ["UPSTREAM_FAILED"]
    assert state(queue, master) == "FAILED"


def test_a_submission_is_one_transaction(queue: JobQueue) -> None:
    specs = {"A": job("A", 1, Dependency("B")), "B": job("B", 1)}
    with pytest.raises(KeyError):  # no policy for B: fails after the master row is written
        queue.submit(
            node_keys(specs, "A"),
            lambda f, a, n: resolve(specs, "A", [1, 2, 3], {}, f, a, n),
            {"A": Policy()},
        )
    with queue.db.read() as conn:
        for table in (chunks, edges, members):
            assert conn.execute(select(func.count()).select_from(table)).scalar() == 0


def test_active_chunks_are_reused_by_a_second_submission(queue: JobQueue) -> None:
    specs = {
        "A": job("A", None, Dependency("B")),
        "C": job("C", None, Dependency("B")),
        "B": job("B", 2),
    }
    first = submit(queue, specs, "A", [1, 2, 3, 4])
    second = submit(queue, specs, "C", [1, 2, 3, 4])
    b_first = {r["id"] for r in by_job(queue, first)["B"]}
    b_second = {r["id"] for r in by_job(queue, second)["B"]}
    assert b_first == b_second and len(b_first) == 2
    # The same root again: its queued chunk stands for it; nothing new is written.
    third = submit(queue, specs, "A", [1, 2, 3, 4])
    assert [r["id"] for r in queue.graph(third)] == [r["id"] for r in by_job(queue, first)["A"]]
    drain(queue)
    assert state(queue, first) == state(queue, second) == state(queue, third) == "DONE"
    with queue.db.read() as conn:
        assert conn.execute(select(func.count()).select_from(chunks)).scalar() == 3 + 4


def test_a_reused_chunk_that_already_succeeded_is_not_waited_for(queue: JobQueue) -> None:
    specs = {"A": job("A", None, Dependency("B")), "B": job("B", None)}
    first = submit(queue, specs, "A", [1])
    b = queue.claim("w", "h")[0]
    second = submit(queue, specs, "A", [1])  # reuses the running B
    queue.succeed(b.id, b.attempt)
    drain(queue)
    assert state(queue, first) == state(queue, second) == "DONE"


def test_claims_never_hand_one_attempt_to_two_workers(queue: JobQueue) -> None:
    submit(queue, {"X": job("X", 1)}, "X", list(range(120)))
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        while True:
            claims = queue.claim(name, "h", 3)
            assert len(claims) <= 3  # PostgreSQL once claimed past the limit
            if not claims:
                return
            with lock:
                got.extend((c.id, c.attempt) for c in claims)
            for c in claims:
                queue.succeed(c.id, c.attempt)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 120 and len(set(got)) == 120


def test_timeouts_are_flagged_for_the_worker(queue: JobQueue) -> None:
    submit(queue, {"X": job("X", None)}, "X", [1], {"X": Policy(timeout=0.01)})
    queue.fence(1, "o")
    c = queue.claim("w", "h")[0]
    time.sleep(0.05)
    assert queue.overdue(1, grace=0.0) == [c.id]
    assert queue.heartbeat("w", [(c.id, c.attempt)]) == {c.id: "cancel"}


def test_a_cron_fire_is_recorded_once_and_skipped_while_a_run_is_active(queue: JobQueue) -> None:
    queue.fence(1, "o")
    specs = {"X": job("X", None)}

    def fire(conn: Any) -> int:
        master, _ = queue.submit(
            node_keys(specs, "X"),
            lambda f, a, n: resolve(specs, "X", [1], {}, f, a, n),
            {"X": Policy()},
            conn=conn,
        )
        return master

    first = queue.fire(1, "X", 600.0, False, fire)
    assert first is not None
    assert queue.fire(1, "X", 600.0, False, fire) is None  # the same fire again
    assert queue.fire(1, "X", 660.0, False, fire) is None  # skipped: run still active
    assert queue.fire(1, "X", 720.0, True, fire) is not None  # allow_multiple_jobs
    assert len(queue.runs()) == 2


def test_keys_are_exact_and_a_key_too_long_for_the_database_is_refused(
    queue: JobQueue,
) -> None:
    """Freshness is keyed by (job, kwargs) byte for byte: kwargs differing only in case
    or a trailing space are different runs (MariaDB's default collations would fold
    them). Kwargs longer than the database keeps (MariaDB: 2,048 characters of JSON)
    are refused naming the job and the way out, and nothing is written."""
    specs = {"A": job("A", None)}
    variants = [{"x": "a"}, {"x": "A"}, {"x": "a "}]
    for kw in variants:
        submit(queue, specs, "A", [], kwargs=kw)
        drain(queue)
    with queue.db.read() as conn:
        fresh = sorted(json.loads(k)["x"] for k in conn.execute(select(latest.c.kwargs)).scalars())
    assert fresh == sorted(v["x"] for v in variants)

    before = len(queue.runs())
    big = {"x": "y" * 3000}
    if queue.db.dialect == "mariadb":
        with pytest.raises(QueueError, match=r"job 'A': its keyword arguments are 3008 .*2048"):
            submit(queue, specs, "A", [], kwargs=big)
        assert len(queue.runs()) == before
    else:  # the others keep any length
        submit(queue, specs, "A", [], kwargs=big)
        assert drain(queue)
