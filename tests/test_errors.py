"""One error tree: every error riverbed raises on purpose is a RiverbedError, so a caller
catches riverbed's errors without catching bugs (httpx's habit)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import riverbed
from riverbed.errors import InvalidValueError, RiverbedError

SRC = Path(riverbed.__file__).parent

# Bare builtin raises that are not a caller's error: caught where they are raised, or
# a broken invariant of riverbed's own code (a bug, which should not be caught).
ALLOWED = {
    ("stream/batchlog.py", "ValueError"),  # caught in read_record → CorruptStateError
    ("state/durable.py", "ValueError"),  # caught in _manifest → CorruptStateError
    ("ui/metrics.py", "ValueError"),  # riverbed's own metric names: a bug if wrong
    ("timerange/plan.py", "ValueError"),  # the pure core fed out of order: a bug
}


# Exceptions that are not errors a caller handles: a test failpoint's simulated crash
# must not be caught as a riverbed error.
NOT_ERRORS = {("riverbed.stream.engine", "InjectedFault")}


def _modules() -> list[str]:
    names = ["riverbed"]
    for info in pkgutil.walk_packages([str(SRC)], "riverbed."):
        if ".ui.static" in info.name or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_every_exception_class_of_riverbed_is_a_riverbed_error() -> None:
    strays = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency: say which
            pytest.fail(f"{name} does not import: {exc}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if cls.__name__.startswith("_") or (name, cls.__name__) in NOT_ERRORS:
                continue
            if not issubclass(cls, RiverbedError):
                strays.append(f"{name}.{cls.__name__}")
    assert strays == []


def test_no_bare_value_or_runtime_error_is_raised_outside_the_allowed_places() -> None:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in ("ValueError", "RuntimeError"):
                    found.add((rel, func.id, node.lineno))
    stray = sorted(f"{rel}:{line} raises {name}" for rel, name, line in found
                   if (rel, name) not in ALLOWED)  # fmt: skip
    assert stray == []


def test_a_callers_bad_value_is_a_value_error_and_a_riverbed_error_of_its_package() -> None:
    from riverbed.durations import duration_seconds
    from riverbed.log.errors import LogError
    from riverbed.stream import Aggregation, Count, Tumbling
    from riverbed.stream.errors import StreamError

    with pytest.raises(InvalidValueError) as caught:
        duration_seconds("ten minutes")
    assert isinstance(caught.value, ValueError) and "write e.g. '10m'" in str(caught.value)
    with pytest.raises(StreamError, match="at least one metric"):
        Aggregation(name="a", key="k", time="ts", window=Tumbling("1h"), metrics={})
    with pytest.raises(ValueError, match="state_partitions"):  # still a ValueError
        Aggregation(
            name="a", key="k", time="ts", window=Tumbling("1h"), metrics={"n": Count()},
            state_partitions=0,
        )  # fmt: skip
    from riverbed.log.base import TopicConfig

    with pytest.raises(LogError, match="at least 1 partition"):
        TopicConfig(name="t", partitions=0)
