"""Consumer groups: assignment, rebalancing, fenced commits, run() with retries and DLQ."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import riverbed.log
from riverbed.control import ControlPlane, connect
from riverbed.log import GroupError, Log, Record
from riverbed.log.group import describe_group
from riverbed.log.group.consumer import Consumer


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = connect(f"sqlite:///{tmp_path / 'control.db'}")
    yield plane
    plane.close()


@pytest.fixture(params=["file", "flight"])
def flog(request: pytest.FixtureRequest, file_log: Log) -> Iterator[Log]:
    """A file-backed log, opened directly or through a log server (tests/log/conftest.py)."""
    if request.param == "file":
        yield file_log
        return
    server = request.getfixturevalue("log_server")
    remote = riverbed.log.open(server.url)
    yield remote
    remote.close()


def until(
    condition: Callable[[], bool], timeout: float = 10, step: Callable[[], object] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step()
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def fill(log: Log, topic: str, n: int, partitions: int = 4) -> None:
    log.create_topic(topic, partitions)
    log.producer(topic).send_batch([{"i": i, "k": f"key{i % 9}"} for i in range(n)], key_field="k")


def test_one_member_gets_everything_and_commits(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 300)
    with flog.consumer(cp, "g", "ev", member_id="a", session_ttl=2) as consumer:
        got: list[Record] = []
        until(lambda: len(got) >= 300, step=lambda: got.extend(consumer.poll(0.1)))
        consumer.poll(0)  # marks the previous records processed: commits them
        assert sorted(r.value["i"] for r in got) == list(range(300))
        desc = describe_group(flog, cp, "g")
        assert desc.members == ["a"] and desc.leader == "a"
        assert all(p.owner == "a" and p.lag == 0 for p in desc.partitions)
    # a new member resumes from the committed offsets: nothing left
    with flog.consumer(cp, "g", "ev", member_id="b", session_ttl=2) as again:
        until(lambda: len(again.assignment()) == 4, step=lambda: again.poll(0.05))
        assert again.poll(0.3) == []


def test_join_and_leave_rebalance_without_two_owners(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 50)
    a = flog.consumer(cp, "g", "ev", member_id="a", session_ttl=2, assignor="sticky")
    until(lambda: len(a.assignment()) == 4, step=lambda: a.poll(0.05))
    b = flog.consumer(cp, "g", "ev", member_id="b", session_ttl=2, assignor="sticky")
    both = lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2  # noqa: E731
    until(both, step=lambda: (a.poll(0.02), b.poll(0.02)))
    assert not a.assignment() & b.assignment()
    b.close()
    until(lambda: len(a.assignment()) == 4, step=lambda: a.poll(0.05))
    assert describe_group(flog, cp, "g").members == ["a"]
    a.close()


def test_new_partitions_are_picked_up(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 10, partitions=2)
    with flog.consumer(cp, "g", "ev", session_ttl=2, metadata_interval=0.2) as consumer:
        until(lambda: len(consumer.assignment()) == 2, step=lambda: consumer.poll(0.05))
        flog.add_partitions("ev", 3)
        flog.producer("ev").send({"new": True}, partition=2)
        got: list[Record] = []
        until(
            lambda: any(r.partition == 2 for r in got), step=lambda: got.extend(consumer.poll(0.05))
        )


def test_a_member_that_lost_its_claim_cannot_commit(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 40, partitions=1)
    with flog.consumer(cp, "g", "ev", member_id="z", session_ttl=2) as zombie:
        records: list[Record] = []
        until(lambda: len(records) >= 40, step=lambda: records.extend(zombie.poll(0.05)))
        # someone else takes the partition (e.g. after our lease was thought dead)
        cp.delete("riverbed/loggroup/g/claim/ev/0")
        cp.put("riverbed/loggroup/g/claim/ev/0", "other")
        zombie.commit()  # rejected: fenced by the claim's revision
        assert cp.get("riverbed/loggroup/g/offset/ev/0") is None
        assert zombie.assignment() == set()


def test_run_retries_in_order_and_dead_letters_poison_records(flog: Log, cp: ControlPlane) -> None:
    flog.create_topic("ev", 2)
    flog.create_topic("ev.dlq", 1)
    flog.producer("ev").send_batch([{"i": i, "k": f"k{i % 2}"} for i in range(40)], key_field="k")
    seen: list[int] = []
    attempts: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def handler(record: Record) -> None:
        i = record.value["i"]
        with lock:
            attempts[i] = attempts.get(i, 0) + 1
            if i == 7 or (i == 12 and attempts[i] < 3):
                raise RuntimeError(f"cannot handle {i}")
            seen.append(i)
            if len(seen) == 39:
                stop.set()

    with flog.consumer(cp, "g", "ev", session_ttl=5) as consumer:
        consumer.run(handler, retries=3, backoff=0.01, dead_letter="ev.dlq", stop=stop)
    assert attempts[7] == 4 and attempts[12] == 3
    for key in (0, 1):  # per-key (= per-partition) order kept despite retries
        mine = [i for i in seen if i % 2 == key]
        assert mine == sorted(mine)
    dead = flog.read("ev.dlq", 0)
    assert [r.value["i"] for r in dead] == [7]
    assert b"cannot handle 7" in dead[0].headers["error"]
    assert dead[0].headers["source"].startswith(b"ev/")


@pytest.mark.parametrize("workers", [4, 1])
def test_run_processes_its_partitions_at_once_each_in_order(
    flog: Log, cp: ControlPlane, workers: int
) -> None:
    """One member owning four partitions: with ``max_workers=4`` its handler is inside
    all four at the same moment (a barrier every partition's first record waits at —
    it breaks unless they run at once), and each partition's records are handled in
    offset order, every one once. With one worker the partitions take turns: the
    barrier of two is never met (the check that the barrier can fail)."""
    fill(flog, "ev", 400, partitions=4)
    meet = threading.Barrier(workers if workers > 1 else 2, timeout=10 if workers > 1 else 0.5)
    seen: dict[int, list[int]] = {p: [] for p in range(4)}
    threads: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()
    broke: list[int] = []

    def handler(record: Record) -> None:
        with lock:
            first = not seen[record.partition]
            seen[record.partition].append(record.offset)
            threads.add(threading.current_thread().name)
            if sum(map(len, seen.values())) == 400:
                stop.set()
        if first:
            try:
                meet.wait()
            except threading.BrokenBarrierError:
                broke.append(record.partition)

    with flog.consumer(cp, "g", "ev", session_ttl=5) as consumer:
        until(lambda: len(consumer.assignment()) == 4)  # claimed by its watch thread
        consumer.run(handler, max_workers=workers, retries=0, stop=stop)
    for p, offsets in seen.items():
        assert offsets == list(range(len(offsets))), p  # in order, none twice, none skipped
    assert sum(map(len, seen.values())) == 400
    if workers > 1:
        assert broke == [] and len(threads) == 4
    else:
        assert broke and len(threads) == 1


def test_run_without_dead_letter_raises_after_retries(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 5, partitions=1)

    def boom(record: Record) -> None:
        raise ValueError("bad record")

    with flog.consumer(cp, "g", "ev", session_ttl=5) as consumer, pytest.raises(ValueError):
        consumer.run(boom, retries=1, backoff=0.001)


def test_bad_group_configuration_is_named(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 1)
    with pytest.raises(ValueError, match="assignor"):
        flog.consumer(cp, "g", "ev", assignor="fastest")
    with pytest.raises(ValueError, match="group name"):
        flog.consumer(cp, "a/b", "ev")
    from riverbed.log import TopicNotFoundError

    with pytest.raises(TopicNotFoundError):
        flog.consumer(cp, "g", "missing")
    consumer = flog.consumer(cp, "g", "ev", session_ttl=2)
    consumer.close()
    with pytest.raises(GroupError, match="closed"):
        consumer.poll(0)


def test_a_consumer_whose_lease_ended_says_why(flog: Log, cp: ControlPlane) -> None:
    fill(flog, "ev", 10)
    consumer = flog.consumer(cp, "g", "ev", session_ttl=2)
    until(lambda: len(consumer.assignment()) == 4, step=lambda: consumer.poll(0.05))
    cp.revoke(consumer.session.lease)  # as another process's reaper or an operator would
    assert consumer.session.lost.wait(5)
    with pytest.raises(GroupError, match=r"lost its session \(lease \w+ expired or was revoked"):
        consumer.poll(0)
    consumer.close()


def test_consumer_is_importable_from_the_group_package() -> None:
    assert Consumer.__module__ == "riverbed.log.group.consumer"


def test_reset_offsets_of_a_stopped_group_replays_or_skips(flog: Log, cp: ControlPlane) -> None:
    from riverbed.log.group.consumer import reset_offsets

    fill(flog, "ev", 120, partitions=3)
    consumer = flog.consumer(cp, "g", "ev", member_id="a", session_ttl=2)
    got: list[Record] = []
    until(lambda: len(got) >= 120, step=lambda: got.extend(consumer.poll(0.1)))
    consumer.poll(0)
    consumer.commit()
    with pytest.raises(GroupError, match="1 live member"):
        reset_offsets(flog, cp, "g", "earliest")  # a running group would overwrite it
    consumer.close()
    assert describe_group(flog, cp, "g").partitions[0].lag == 0
    assert reset_offsets(flog, cp, "g", "earliest") == {"ev/0": 0, "ev/1": 0, "ev/2": 0}
    assert sum(p.lag for p in describe_group(flog, cp, "g").partitions) == 120
    with flog.consumer(cp, "g", "ev", member_id="b", session_ttl=2) as again:
        replayed: list[Record] = []
        until(lambda: len(replayed) >= 120, step=lambda: replayed.extend(again.poll(0.1)))
        assert sorted(r.value["i"] for r in replayed) == list(range(120))  # every one again
    ends = {f"ev/{p.partition}": p.end for p in describe_group(flog, cp, "g").partitions}
    assert reset_offsets(flog, cp, "g", "latest", topic="ev") == ends
    assert reset_offsets(flog, cp, "g", "1", topic="ev")["ev/0"] == 1
    with pytest.raises(GroupError, match="earliest, latest, an offset, or a time"):
        reset_offsets(flog, cp, "g", "yesterday")
    # by time: each partition's first record at or after it (past the newest: the end)
    stamps = {p: [r.timestamp for r in flog.iter_records("ev", p)] for p in range(3)}
    middle = stamps[0][20]
    moved = reset_offsets(flog, cp, "g", middle.isoformat(), topic="ev")
    for p in range(3):
        assert moved[f"ev/{p}"] == next(i for i, t in enumerate(stamps[p]) if t >= middle)
    future = reset_offsets(flog, cp, "g", "2999-01-01T00:00:00", topic="ev")
    assert future == ends
    with pytest.raises(GroupError, match="outside ev/0's retained range"):
        reset_offsets(flog, cp, "g", "100000")
    with pytest.raises(GroupError, match="no partitions of topic 'other'"):
        reset_offsets(flog, cp, "g", "earliest", topic="other")
