"""What users import stays importable and listed in __all__."""

from __future__ import annotations

import types

import pytest

import riverbed
import riverbed.control
import riverbed.jobs
import riverbed.log
import riverbed.state


@pytest.mark.parametrize(
    "module", [riverbed, riverbed.control, riverbed.jobs, riverbed.log, riverbed.state]
)
def test_all_names_exist_and_are_public(module: types.ModuleType) -> None:
    assert sorted(module.__all__) == module.__all__
    for name in module.__all__:
        assert hasattr(module, name), f"{module.__name__}.{name} is listed but missing"
    public = {n for n in vars(module) if not n.startswith("_")}
    classes = {
        n
        for n in public
        if isinstance(getattr(module, n), type)
        and getattr(module, n).__module__.startswith("riverbed")
    }
    assert classes <= set(module.__all__), f"unexported classes: {classes - set(module.__all__)}"


@pytest.mark.parametrize("module", [riverbed.control, riverbed.jobs, riverbed.log, riverbed.state])
def test_every_error_derives_from_the_root(module: types.ModuleType) -> None:
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, riverbed.RiverbedError), name
