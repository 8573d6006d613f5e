"""How long the tests take, and the scenario groups made from it.

``make test`` runs two groups of the slow Spark scenario tests (``tests/conftest.py``):
each group on one pytest-xdist worker, one test after another, so at most two such
scenarios run at once. Whole modules go to a group (a module's fixtures — a Connect
server, a Kafka cluster — start once), the longest first onto the lighter group.

A module weighs the time of its scenario tests in a full run (``test_seconds.json``: each
test of 1 s or more, by node id), written from the run's junit file::

    PYTEST_ADDOPTS="--junitxml=/tmp/run.xml" make test
    .venv/bin/python -m tests.timings /tmp/run.xml

Stale weights only make the groups less even: a test missing from the file weighs
:data:`UNKNOWN` seconds."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path

SECONDS = Path(__file__).with_name("test_seconds.json")
UNKNOWN = 1.0  # a test not in the file: under a second, or new since the file was written
KEPT = 1.0  # the file keeps the tests that took at least this long
GROUPS = 2  # scenario groups: at most this many scenarios run at once


def load(path: Path = SECONDS) -> dict[str, float]:
    """Seconds of test time by node id (``tests/…/test_x.py::test_y[p]``)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def module_of(test: str) -> str:
    """The module path of a test's node id (``tests/…/test_x.py::test_y[p]``)."""
    return test.split("::", 1)[0]


def groups_of(
    tests: Iterable[str], seconds: Mapping[str, float], groups: int = GROUPS
) -> dict[str, int]:
    """The group in ``range(groups)`` of each module of ``tests`` (node ids): the
    module weighing most first, each onto the group with the least time so far (ties:
    the lower number; modules of equal weight by name, so every worker computes the same
    answer)."""
    weight: dict[str, float] = {}
    for test in tests:
        module = module_of(test)
        weight[module] = weight.get(module, 0.0) + seconds.get(test, UNKNOWN)
    load = [0.0] * groups
    out: dict[str, int] = {}
    for module in sorted(weight, key=lambda m: (-weight[m], m)):
        g = min(range(groups), key=lambda i: (load[i], i))
        out[module] = g
        load[g] += weight[module]
    return out


def seconds_by_test(junit: Path, kept: float = KEPT) -> dict[str, float]:
    """Each test's time (at least ``kept`` s) by node id, from a junit file (pytest's
    ``--junitxml``)."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        if parts[0] != "tests" or float(case.get("time") or 0) < kept:
            continue
        classes = []  # a test in a class: the class is part of its id
        while len(parts) > 2 and parts[-1][:1].isupper():
            classes.insert(0, parts.pop())
        name = case.get("name") or ""
        if name.rfind("@") > name.rfind("]"):  # xdist's group suffix: "test_x[p]@scenarios-1"
            name = name[: name.rfind("@")]
        node = "::".join(["/".join(parts) + ".py", *classes, name])
        out[node] = round(float(case.get("time") or 0), 1)
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python -m tests.timings JUNIT.xml  (pytest --junitxml of a full run)")
        return 2
    seconds = seconds_by_test(Path(argv[0]))
    SECONDS.write_text(json.dumps(seconds, indent=0, sort_keys=True) + "\n")
    print(f"{SECONDS}: {len(seconds)} tests of {KEPT:.0f} s or more, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
