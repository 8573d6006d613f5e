"""A new version of a running aggregation (stream/versions.py): computed from the log
beside the running one, switched in by one create-only record.

The pure decisions first (when a version has caught up, which number a run computes,
which record rules), then the record on every store, then the whole of it as a user
runs it: a filter added to a running aggregation as a new version, its driver
SIGKILLed while it catches up and started again, readers polling through the switch
(never a mix of the two versions), the old driver stopping by itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from riverbed.config import Config
from riverbed.inspect import Sources, stream
from riverbed.processes import kill_session
from riverbed.stream.aggregation import _NAME, base_of, is_version_name, version_name
from riverbed.stream.dataframe import read_results
from riverbed.stream.versions import (
    Version,
    caught_up,
    current,
    newest,
    next_number,
    read_versions,
    switch,
)
from riverbed.ui.app import create_app
from riverbed.ui.console import Console
from tests.conftest import LOCATIONS, location_of
from tests.stream.conftest import make_events, write_events

ENDS = st.dictionaries(st.integers(0, 5), st.integers(0, 1000), max_size=6)
NAMES = st.from_regex(_NAME, fullmatch=True)


@given(ENDS, ENDS, st.dictionaries(st.integers(0, 5), st.integers(0, 50)))
def test_caught_up_means_at_or_past_every_partition_the_current_version_read(
    theirs: dict[int, int], mine: dict[int, int], more: dict[int, int]
) -> None:
    assert caught_up(theirs, theirs)
    behind = any(mine.get(p, 0) < end for p, end in theirs.items())
    assert caught_up(theirs, mine) is not behind
    if caught_up(theirs, mine):  # reading on never un-catches it
        further = {p: mine.get(p, 0) + more.get(p, 0) for p in {*mine, *more}}
        assert caught_up(theirs, further)


@given(
    st.integers(1, 20),
    st.dictionaries(st.integers(2, 30), st.sampled_from(["a", "b", "c", None]), max_size=6),
    st.sampled_from(["a", "b", "c"]),
)
def test_a_run_resumes_its_own_unswitched_version_else_takes_a_new_number(
    switched: int, shadows: dict[int, str | None], spec: str
) -> None:
    number, resumed = next_number(switched, shadows, spec)
    assert number > switched
    if resumed:
        assert shadows[number] == spec
    else:
        assert number not in shadows and all(number > n for n in shadows)
        assert not any(n > switched and s == spec for n, s in shadows.items())


@given(NAMES, st.integers(1, 10_000))
def test_a_version_name_round_trips_and_no_user_name_is_one(name: str, number: int) -> None:
    assert base_of(version_name(name, number)) == (name, number)
    assert is_version_name(version_name(name, number)) is (number > 1)
    assert base_of(name) == (name, 1)  # '-' is in no name a user can give
    assert base_of(f"{name}-v1") == (name, 1) and not is_version_name(f"{name}-v1")


@given(st.lists(st.integers(2, 50), unique=True))
def test_the_highest_switched_version_rules(numbers: list[int]) -> None:
    records = [Version(n, f"a-v{n}", None, 0.0, {}, {}) for n in numbers]
    ruling = newest(records)
    assert (ruling.number if ruling else None) == (max(numbers) if numbers else None)


@pytest.mark.parametrize("kind", LOCATIONS)
def test_the_switch_record_is_created_once_on_every_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    base = location_of(kind, request, tmp_path, "checkpoints") + "/flags"
    assert current(base, "flags").aggregation == "flags"  # nothing switched: version 1
    first = Version(2, "flags-v2", "abc", 1.0, {0: 10, 1: 5}, {0: 9, 1: 5})
    assert switch(base, first) == first
    late = Version(2, "flags-v2", "abc", 2.0, {0: 12, 1: 5}, {0: 12, 1: 5})
    assert switch(base, late) == first  # the first writer's record stays
    assert current(base, "flags").aggregation == "flags-v2"
    switch(base, Version(3, "flags-v3", "def", 3.0, {0: 20}, {0: 20}))
    assert [v.number for v in sorted(read_versions(base), key=lambda v: v.number)] == [2, 3]
    assert current(base, "flags").number == 3


SPEC = """
from riverbed.stream import Aggregation, Count, Sum, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={{"events": Count(), "spent": Sum("amount")}}, {extra}
)
"""


def _oracle(events: pd.DataFrame) -> pd.DataFrame:
    events = events.assign(window_start=events["ts"].dt.floor("1h"))
    got = events.groupby(["window_start", "flag"]).agg(
        events=("user_id", "size"), spent=("amount", "sum")
    )
    return got.rename_axis(["window_start", "key"]).sort_index()


def _rows(out: str | pd.DataFrame) -> pd.DataFrame:
    """Result rows — ``query --json``'s lines, or a frame — by (window_start, key)."""
    rows = out if isinstance(out, pd.DataFrame) else pd.DataFrame(map(json.loads, out.splitlines()))
    rows["window_start"] = pd.to_datetime(rows["window_start"], utc=True).dt.as_unit("ns")
    return rows.set_index(["window_start", "key"]).sort_index()[["events", "spent"]]


def _same(rows: pd.DataFrame, oracle: pd.DataFrame) -> bool:
    return list(rows.index) == list(oracle.index) and bool(
        (rows["events"].astype(int) == oracle["events"]).all()
        and (rows["spent"].astype(float) == oracle["spent"]).all()
    )


@pytest.mark.spark
def test_a_filter_added_as_a_new_version_switches_readers_in_one_step(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[1]"}
    events = make_events(1500, hours=5)
    write_events(f"file://{home / 'log'}", events, partitions=3)
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC.format(extra=""))
    cli = [sys.executable, "-m", "riverbed.cli.main"]

    def riverbed(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    done = riverbed("stream", "run", str(spec), "--once", "--ttl", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    v1, v2 = _oracle(events), _oracle(events[events["amount"] > 50])
    assert _same(_rows(riverbed("query", "flags", "--json").stdout), v1)

    # version 1 keeps running (a long-running driver), while the spec is edited
    old_log = open(tmp_path / "v1.log", "w")  # noqa: SIM115 (the driver's whole life)
    old = subprocess.Popen(
        [*cli, "stream", "run", str(spec), "--ttl", "3"],
        env=env,
        stdout=old_log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    spec.write_text(SPEC.format(extra='where="amount > 50",'))
    planned = riverbed("stream", "plan", str(spec), "--new-version", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout) == {
        "name": "flags",
        "version": 2,
        "aggregation": "flags-v2",
        "current": {"version": 1, "aggregation": "flags"},
        "resumed": False,
        "is_current": False,
    }
    assert not (home / "checkpoints" / "flags-v2").exists()  # plan writes nothing

    # readers poll the whole time: each read is version 1's answer or version 2's
    reads: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            got = riverbed("query", "flags", "--json", timeout=120)
            if got.returncode == 0:
                rows = _rows(got.stdout)
                reads.append("v1" if _same(rows, v1) else "v2" if _same(rows, v2) else "mix")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # the new version's driver, SIGKILLed after its second batch committed: nothing
        # switched, and the same command again resumes version 2 (not a version 3)
        commits = home / "checkpoints" / "flags-v2" / "riverbed" / "commits"
        new_version = [*cli, "stream", "run", str(spec), "--new-version", "--once"]
        new_version += ["--max-records-per-batch", "300", "--ttl", "3"]
        killed = subprocess.Popen(
            new_version, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        deadline = time.monotonic() + 240
        while not (commits.exists() and len(list(commits.glob("*.json"))) >= 2):
            assert killed.poll() is None, killed.stderr.read() if killed.stderr else ""
            assert time.monotonic() < deadline, "the new version committed no second batch"
            time.sleep(0.1)
        kill_session(killed.pid)
        assert killed.wait() == -signal.SIGKILL
        assert not (home / "checkpoints" / "flags" / "riverbed" / "versions").exists()
        status = json.loads(riverbed("stream", "status", "flags-v2", "--json").stdout)
        assert status["version"]["state"] == "catching up" and status["version"]["behind"] > 0
        deadline = time.monotonic() + 120
        while "v1" not in reads:  # (a read takes a second or two)
            assert time.monotonic() < deadline, reads
            time.sleep(0.2)

        again = riverbed(*new_version[3:])
        assert again.returncode == 0, again.stderr[-3000:]
        said = " ".join(again.stderr.split())
        assert "new version 2 (flags-v2) resumed" in said, said
        assert "version 2 of flags is current now: readers read flags-v2" in said, said
        deadline = time.monotonic() + 120
        while "v2" not in reads[-1:]:
            assert time.monotonic() < deadline, reads[-5:]
            time.sleep(0.2)
        # the old driver saw the record and stopped by itself
        assert old.wait(timeout=120) == 0
    finally:
        stop.set()
        reader.join(timeout=180)
        if old.poll() is None:
            kill_session(old.pid)
        old_log.close()
    said = " ".join((tmp_path / "v1.log").read_text().split())
    assert "flags was replaced: version 2 of flags (flags-v2) is current, so this driver" in said
    assert "mix" not in reads and "v1" in reads and "v2" in reads
    assert reads.index("v2") > max(i for i, r in enumerate(reads) if r == "v1")

    # after the switch: the name is version 2 everywhere; version 1's results are kept
    assert _same(_rows(riverbed("query", "flags", "--json").stdout), v2)
    assert _same(_rows(riverbed("query", str(spec), "--json").stdout), v2)
    status = json.loads(riverbed("stream", "status", "flags", "--json").stdout)
    assert status["aggregation"] == "flags-v2"
    assert status["version"] == {
        "name": "flags",
        "version": 2,
        "current": {"version": 2, "aggregation": "flags-v2"},
        "behind": None,
        "state": "current",
    }
    said = riverbed("stream", "status", "flags-v1", "--json")  # version 1, named so
    assert json.loads(said.stdout)["version"]["state"] == "replaced", said.stderr[-2000:]
    # the console lists both: version 1 as replaced, its results as they were
    sources = Sources(Config(home=home))
    try:
        assert stream(sources, "flags")["version"]["state"] == "replaced"
        with TestClient(create_app(Console(sources, interval=3600), sample=False)) as client:
            listed = client.get("/streams").text
            assert "v2 current</span>" in listed and "v1 replaced</span>" in listed
            page = client.get("/streams/flags").text
            assert 'replaced by <a href="/streams/flags-v2">version 2</a>' in page
            assert "2 of flags</p>" in client.get("/streams/flags-v2").text
    finally:
        sources.close()
    assert _same(_rows(read_results(home / "output" / "flags")), v1)  # kept, until deleted
    assert _same(_rows(riverbed("query", "flags-v2", "--json").stdout), v2)
    # the versions listed; the current one cannot be deleted, the replaced one can
    listed = json.loads(riverbed("stream", "versions", "flags", "--json").stdout)
    assert [(v["version"], v["state"]) for v in listed] == [(1, "replaced"), (2, "current")]
    assert listed[0]["switched_at"] is None and listed[1]["switched_at"] > 0
    refused = riverbed("stream", "versions", "flags", "--delete", "2")
    assert refused.returncode == 2 and "is the current version of 'flags'" in refused.stderr
    deleted = riverbed("stream", "versions", str(spec), "--delete", "1")
    assert deleted.returncode == 0, deleted.stderr[-2000:]
    assert "version 1 of flags (flags) is deleted" in " ".join(deleted.stderr.split())
    assert not (home / "output" / "flags").exists() and not (home / "state" / "flags").exists()
    assert sorted(p.name for p in (home / "checkpoints" / "flags").rglob("*.json")) == [
        "000002.json"  # only the switch record: every reader of 'flags' needs it
    ]
    listed = json.loads(riverbed("stream", "versions", "flags", "--json").stdout)
    assert [(v["version"], v["state"]) for v in listed] == [(1, "deleted"), (2, "current")]
    assert _same(_rows(riverbed("query", "flags", "--json").stdout), v2)
    plan = riverbed("stream", "plan", str(spec))
    assert "aggregation 'flags-v2'" in plan.stdout and "nothing changed" in plan.stdout
    rerun = riverbed("stream", "run", str(spec), "--new-version", "--once", "--ttl", "3")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "computes this spec and is the current one: it runs on" in " ".join(rerun.stderr.split())


def test_a_new_version_killed_before_its_first_batch_is_resumed_not_begun_again(
    tmp_path: Path,
) -> None:
    """A ``--new-version`` run records its spec's shape (and manifest) before its first
    batch; killed there, the same command resumes that version instead of beginning the
    next one — and another spec begins the next."""
    from dataclasses import replace

    from riverbed.stream import Aggregation, Count, Tumbling
    from riverbed.stream.layout import MANIFEST, checkpoint_store
    from riverbed.stream.specrecord import start
    from riverbed.stream.versions import plan_new_version

    checkpoints = tmp_path / "checkpoints"
    v1 = Aggregation(name="flags", key="flag", time="ts", window=Tumbling("1h"),
                     metrics={"events": Count()})  # fmt: skip
    start(checkpoints / "flags", v1)  # version 1 has run (its shape recorded)
    v2 = replace(v1, where="amount > 50")
    planned = plan_new_version(checkpoints, v2)
    assert (planned.number, planned.resumed, planned.is_current) == (2, False, False)
    # what the run writes before its first batch, then the kill
    start(checkpoints / "flags-v2", replace(v2, name="flags-v2"))
    checkpoint_store(checkpoints / "flags-v2").put(MANIFEST, b'{"name": "flags-v2"}')
    again = plan_new_version(checkpoints, v2)
    assert (again.number, again.aggregation, again.resumed) == (2, "flags-v2", True)
    other = plan_new_version(checkpoints, replace(v1, where="amount > 10"))
    assert (other.number, other.resumed) == (3, False)


def test_a_version_a_driver_runs_is_not_deleted(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`stream versions NAME --delete N` while a driver holds version N's lease: refused,
    naming the driver, nothing deleted."""
    from riverbed.stream.leader import DriverLease
    from tests.cli import run_cli

    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home)}
    control = f"sqlite:///{home / 'control.db'}"
    home.mkdir()
    checkpoint = home / "checkpoints" / "flags-v2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "kept").write_text("x")
    lease = DriverLease(control, "flags-v2", checkpoint, ttl=5)
    try:
        lease.acquire(standby=False)
        refused = run_cli("stream", "versions", "flags", "--delete", "2",
                          env={**env, "RIVERBED_CONTROL": control})  # fmt: skip
        assert refused.returncode == 1, refused.stderr  # the world's state, not bad input
        assert "a driver runs version 2 (flags-v2) now" in " ".join(refused.stderr.split())
        assert (checkpoint / "kept").read_text() == "x"
    finally:
        lease.close()
