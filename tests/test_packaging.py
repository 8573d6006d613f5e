"""What a ``pip install riverbed`` gets: every third-party module riverbed's code imports
is one of its dependencies (or an extra's, imported only where that extra is used)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import name → distribution name, where they differ
DISTRIBUTIONS = {"confluent_kafka": "confluent-kafka", "pymysql": "pymysql", "yaml": "pyyaml"}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[=<>!~ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_module_riverbed_imports_is_a_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = _requirement_names(project["dependencies"])
    extras = {
        name: _requirement_names(reqs)
        for name, reqs in project["optional-dependencies"].items()
        if name != "dev"
    }
    optional = set().union(*extras.values())
    imported: dict[str, str] = {}
    for path in (ROOT / "src" / "riverbed").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "riverbed" and top not in sys.stdlib_module_names:
                    imported.setdefault(top, str(path.relative_to(ROOT)))
    undeclared = {
        module: where
        for module, where in imported.items()
        if DISTRIBUTIONS.get(module, module).lower() not in required | optional
    }
    assert not undeclared, f"imported but not a dependency in pyproject.toml: {undeclared}"
    assert {"pyspark", "pyarrow", "pandas"} <= required  # the scan found imports at all
