"""The fencing contract (riverbed.fencing), run on every backend a writer is fenced on:
the object store of a stream checkpoint (file, memory, s3), the control plane of a
time-range job (memory, sqlite, etcd) and the jobs database (sqlite, postgresql)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from riverbed.control import connect
from riverbed.control.base import Compare, Put
from riverbed.errors import FencedError
from riverbed.fencing import ControlFence, Fence, StoreFence
from riverbed.jobs.queue import JobQueue
from riverbed.jobs.schema import meta
from riverbed.storage import open_store
from tests.control.conftest import backend_url

BACKENDS = [
    "store-file",
    "store-memory",
    pytest.param("store-s3", marks=pytest.mark.s3),
    "control-memory",
    "control-sqlite",
    pytest.param("control-etcd", marks=pytest.mark.etcd),
    "jobs-sqlite",
    pytest.param("jobs-postgres", marks=pytest.mark.postgres),
]


class Oops(FencedError):
    """The error class a fence is given is the one it raises."""


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """A factory of fresh fences (each call: a new, empty one) on one backend."""
    kind, backend = request.param.split("-")
    closers: list[object] = []
    count = iter(range(1_000_000))

    def new() -> Fence:
        n = next(count)
        if kind == "store":
            if backend == "file":
                url = (tmp_path / f"objects{n}").as_uri()
            elif backend == "memory":
                url = f"memory://fence-{os.urandom(4).hex()}"
            else:
                url = f"{request.getfixturevalue('s3_url')}/fence-{os.urandom(4).hex()}"
            store = open_store(url)
            closers.append(store)
            return StoreFence(store, "riverbed/terms/", "this writer", Oops, kept=3)
        if kind == "control":
            (tmp_path / f"cp{n}").mkdir()
            cp = connect(backend_url(backend, tmp_path / f"cp{n}", request))
            closers.append(cp)
            name = f"t/{os.urandom(5).hex()}"  # etcd's server is shared by the run
            return ControlFence(cp, name, "this writer", Oops)
        if not queues:  # one database per test; each fence starts it over
            url = (
                f"sqlite:///{tmp_path / 'jobs.db'}"
                if backend == "sqlite"
                else request.getfixturevalue("postgres_db")
            )
            queues.append(JobQueue(url))
            closers.append(queues[0])
        queue = queues[0]
        with queue.db.write() as conn:  # as a new database has it: no orchestrator yet
            conn.execute(update(meta).values(term=0, leader="", since=0.0))
        return queue.term_fence

    queues: list[JobQueue] = []
    yield new
    for c in closers:
        c.close()  # type: ignore[attr-defined]


def fresh(make: object) -> Fence:
    return make()  # type: ignore[operator,no-any-return]


def test_nothing_is_claimed_at_first_and_any_check_fails(make: object) -> None:
    fence = fresh(make)
    assert fence.current() is None
    with pytest.raises(FencedError, match="was replaced by nobody"):
        fence.check(1)


def test_a_newer_term_fences_the_older_one_and_names_who_took_over(make: object) -> None:
    fence = fresh(make)
    first = fence.claim(5, "driver-a")
    assert (first.term, first.holder) == (5, "driver-a")
    fence.check(5)
    fence.claim(9, "driver-b")
    current = fence.current()
    assert current is not None and (current.term, current.holder) == (9, "driver-b")
    fence.check(9)
    with pytest.raises(FencedError, match=r"\(term 5\) was replaced by driver-b \(term 9\)"):
        fence.check(5)


def test_an_older_term_cannot_claim_and_changes_nothing(make: object) -> None:
    fence = fresh(make)
    fence.claim(9, "driver-b")
    with pytest.raises(FencedError, match="driver-b"):
        fence.claim(7, "driver-late")
    current = fence.current()
    assert current is not None and (current.term, current.holder) == (9, "driver-b")
    fence.check(9)


def test_the_current_term_can_be_claimed_again(make: object) -> None:
    fence = fresh(make)
    fence.claim(4, "driver-a")
    fence.claim(4, "driver-a")
    current = fence.current()
    assert current is not None and current.term == 4
    fence.check(4)


def test_errors_are_the_fences_own_class(make: object) -> None:
    fence = fresh(make)
    fence.claim(3, "a")
    fence.claim(4, "b")
    with pytest.raises(FencedError) as caught:
        fence.check(3)
    assert isinstance(caught.value, fence.error)


def test_concurrent_claims_leave_the_highest_term(make: object) -> None:
    fence = fresh(make)
    terms = [3, 17, 8, 12, 5, 16, 1, 11]
    outcomes: dict[int, bool] = {}

    def claim(term: int) -> None:
        try:
            fence.claim(term, f"driver-{term}")
            outcomes[term] = True
        except FencedError:
            outcomes[term] = False

    threads = [threading.Thread(target=claim, args=(t,)) for t in terms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    current = fence.current()
    assert current is not None and (current.term, current.holder) == (17, "driver-17")
    assert outcomes[17] is True
    for term in terms:
        if term != 17:
            with pytest.raises(FencedError):
                fence.check(term)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=8))
def test_claims_in_any_order_behave_like_a_maximum(make: object, terms: list[int]) -> None:
    """The model: a claim succeeds iff its term is at least every term claimed before;
    the acting term is the highest claimed; only it passes a check."""
    fence = fresh(make)
    highest = 0
    for term in terms:
        if term >= highest:
            fence.claim(term, f"w{term}")
            highest = term
        else:
            with pytest.raises(FencedError):
                fence.claim(term, f"w{term}")
        current = fence.current()
        assert current is not None and current.term == highest
    for term in set(terms):
        if term == highest:
            fence.check(term)
        else:
            with pytest.raises(FencedError):
                fence.check(term)


# -- what one backend adds -----------------------------------------------------------------


def test_a_control_fence_guards_a_transaction(tmp_path: Path) -> None:
    """The control plane's check is inside the write: a transaction guarded by a term
    that was replaced writes nothing."""
    cp = connect(f"sqlite:///{tmp_path / 'control.db'}")
    fence = ControlFence(cp, "job", "this driver")
    assert not cp.txn(fence.guard(1), [Put.of("k", "before any claim")]).succeeded
    fence.claim(1, "a")
    assert cp.txn(fence.guard(1), [Put.of("k", "one")]).succeeded
    fence.claim(10, "b")  # 10 and 1 differ in width: byte order is still term order
    assert not cp.txn(fence.guard(1), [Put.of("k", "stale")]).succeeded
    assert cp.txn([*fence.guard(10), Compare.version("k") > 0], [Put.of("k", "ten")]).succeeded
    kv = cp.get("k")
    assert kv is not None and kv.value == b"ten"
    cp.close()


def test_a_store_fence_prunes_old_terms_and_still_reads_the_legacy_record(
    tmp_path: Path,
) -> None:
    store = open_store((tmp_path / "ckpt").as_uri())
    store.put("riverbed/driver.json", b'{"term": 2, "driver": "old", "since": "then"}')
    fence = StoreFence(store, "riverbed/terms/", "this driver", legacy="riverbed/driver.json")
    current = fence.current()
    assert current is not None and (current.term, current.holder) == (2, "old")
    for term in range(3, 12):
        fence.claim(term, f"d{term}")
    assert fence.terms() == [7, 8, 9, 10, 11]  # five kept
    with pytest.raises(FencedError, match=r"replaced by d11 \(term 11\)"):
        fence.check(2)
    store.close()
