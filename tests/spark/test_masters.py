"""What a Spark master string says about where tasks run (riverbed.spark)."""

from __future__ import annotations

import pytest

from riverbed.spark import tasks_in_this_process, tasks_on_this_machine


@pytest.mark.parametrize(
    ("master", "machine", "process"),
    [
        ("local", True, True),
        ("local[2]", True, True),
        ("local[2,3]", True, True),
        (" local[*] ", True, True),
        ("local-cluster[2,1,1024]", True, False),
        ("spark://10.0.0.1:7077", False, False),
        ("yarn", False, False),
    ],
)
def test_where_a_masters_tasks_run(master: str, machine: bool, process: bool) -> None:
    assert tasks_on_this_machine(master) is machine
    assert tasks_in_this_process(master) is process
