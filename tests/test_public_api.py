"""What users import stays importable and listed in __all__."""

from __future__ import annotations

import types

import pytest

import riverbed
import riverbed.control
import riverbed.inspect
import riverbed.jobs
import riverbed.jobs.timerange
import riverbed.log
import riverbed.log.group
import riverbed.spark
import riverbed.state
import riverbed.storage
import riverbed.stream
import riverbed.ui

PACKAGES = [
    riverbed,
    riverbed.control,
    riverbed.inspect,
    riverbed.jobs,
    riverbed.jobs.timerange,
    riverbed.log,
    riverbed.log.group,
    riverbed.spark,
    riverbed.state,
    riverbed.storage,
    riverbed.stream,
    riverbed.ui,
]


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_all_names_exist_and_are_public(module: types.ModuleType) -> None:
    assert len(set(module.__all__)) == len(module.__all__)  # ruff (RUF022) keeps it sorted
    for name in module.__all__:
        assert hasattr(module, name), f"{module.__name__}.{name} is listed but missing"
    public = {n for n in vars(module) if not n.startswith("_")}
    classes = {
        n
        for n in public
        if isinstance(getattr(module, n), type)
        and getattr(module, n).__module__.startswith(module.__name__)  # its own classes
    }
    assert classes <= set(module.__all__), f"unexported classes: {classes - set(module.__all__)}"


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_every_error_derives_from_the_root(module: types.ModuleType) -> None:
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, riverbed.RiverbedError), name
