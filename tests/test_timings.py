"""The scenario groups of ``make test`` (tests/timings.py): even, stable, every module in
one group, weights read from a real junit file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests import timings

modules = st.lists(st.sampled_from([f"tests/m{i}.py" for i in range(12)]), max_size=40)
weights = st.dictionaries(st.integers(0, 11), st.floats(0, 600), max_size=12)


def _tests(names: list[str]) -> list[str]:
    return [f"{m}::test_{i}" for i, m in enumerate(names)]


@given(modules, weights, st.integers(1, 4))
def test_groups_are_even_within_one_module_and_cover_every_module(names, w, groups):
    tests = _tests(names)
    seconds = {t: w.get(i % 12, 0.0) for i, t in enumerate(tests)}
    got = timings.groups_of(tests, seconds, groups)
    assert set(got) == {t.split("::")[0] for t in tests}
    assert all(0 <= g < groups for g in got.values())
    load = [0.0] * groups
    weight: dict[str, float] = {}
    for t in tests:
        weight[t.split("::")[0]] = weight.get(t.split("::")[0], 0.0) + seconds[t]
    for module, g in got.items():
        load[g] += weight[module]
    if weight:  # greedy, longest first: the groups differ by at most one module
        assert max(load) - min(load) <= max(weight.values()) + 1e-6


@given(modules, weights)
def test_every_worker_computes_the_same_groups_in_any_order(names, w):
    tests = _tests(names)
    seconds = {t: w.get(i % 12, 0.0) for i, t in enumerate(tests)}
    assert timings.groups_of(tests, seconds) == timings.groups_of(tests[::-1], seconds)


def test_a_test_missing_from_the_file_weighs_the_default():
    got = timings.groups_of(["tests/a.py::x", "tests/b.py::y", "tests/b.py::z"], {})
    assert got == {"tests/b.py": 0, "tests/a.py": 1}  # b: 2 unknown tests, a: 1


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.stream.test_a" name="test_slow[x-1]" time="42.25"/>
<testcase classname="tests.stream.test_a" name="test_quick" time="0.2"/>
<testcase classname="tests.stream.test_b" name="test_kill[x]@scenarios-2" time="5.0"/>
<testcase classname="tests.state.test_model.TestRocksState" name="runTest" time="3.0"/>
</testsuite></testsuites>"""


def test_the_seconds_come_from_a_junit_file_by_node_id(tmp_path: Path):
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    assert timings.seconds_by_test(junit) == {
        "tests/state/test_model.py::TestRocksState::runTest": 3.0,
        "tests/stream/test_a.py::test_slow[x-1]": 42.2,
        "tests/stream/test_b.py::test_kill[x]": 5.0,  # without xdist's group suffix
    }


def test_the_file_is_read_back_and_the_command_refuses_a_missing_junit(tmp_path: Path):
    seconds = timings.load()
    assert seconds and all(v >= timings.KEPT for v in seconds.values())
    assert all("::" in k and k.startswith("tests/") for k in seconds)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "tests.timings", str(tmp_path / "none.xml")],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "usage: python -m tests.timings" in done.stdout
    assert timings.load(tmp_path / "none.json") == {}


SCENARIO = """import pytest
pytestmark = [pytest.mark.slow, pytest.mark.spark]
def test_one(): pass
def test_two(): pass
def test_three(): pass
"""


def test_make_tests_groups_reach_xdist_and_each_runs_on_one_worker(tmp_path: Path):
    """``pytest -n 2 --dist loadgroup`` — the installed pytest and xdist, tests/conftest.py's
    own hook — over two scenario modules and plain tests: each module's tests carry their
    group and run on one worker, the two groups on two. (With pytest 9.2, or the hook
    after xdist's, the groups were silently dropped and the scenarios spread freely.)"""
    root = Path(__file__).resolve().parents[1]
    tests = tmp_path / "tests"
    (tests / "stream").mkdir(parents=True)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntestpaths = tests\nmarkers =\n    slow: s\n    spark: s\n"
    )
    (tests / "conftest.py").write_text(
        "from tests_of_riverbed_conftest import pytest_collection_modifyitems  # noqa\n"
    )
    (tmp_path / "tests_of_riverbed_conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa\n"
    )
    for name in ("test_a_kills.py", "test_b_kills.py"):
        (tests / "stream" / name).write_text(SCENARIO)
    (tests / "test_plain.py").write_text(
        "def test_p1(): pass\ndef test_p2(): pass\ndef test_p3(): pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "-p", "no:timeout"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\](?: \[\s*\d+%\])? PASSED (\S+)", done.stdout)
    assert len(ran) == 9, done.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, node in ran:
        if "_kills.py" in node:
            module, group = node.partition("::")[0], node.rpartition("@")[2]
            assert group.startswith("scenarios-"), node  # the group is in the test's id
            workers.setdefault(module, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), ran  # a module on one worker
    assert len(set().union(*workers.values())) == 2, ran  # the two groups on two
