"""The shape of the code the issue-50 renovation left, kept: where the directory/bucket
difference may be asked (``is_local``), and that a module over 600 lines says at its
top why it is one module (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "riverbed"

# Outside storage/, locations.py and spark/, only what a directory of this machine can
# do that a bucket cannot: the default local state cache beside a checkpoint, the
# work-stealing boards every task reaches, and a time-range output executors on other
# machines cannot reach.
IS_LOCAL = {
    "stream/layout.py": 2,
    "timerange/output.py": 1,
}


def _calls(tree: ast.AST, name: str) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    )


def test_is_local_is_asked_only_where_a_directory_differs() -> None:
    found = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("storage/", "spark/")) or rel == "locations.py":
            continue
        count = _calls(ast.parse(path.read_text(encoding="utf-8")), "is_local")
        if count:
            found[rel] = count
    assert found == IS_LOCAL


def test_a_module_over_600_lines_says_why_at_its_top() -> None:
    long = []
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= 600:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not re.search(r"\(Over 600 lines: [^)]+\)", doc[:800]):
            long.append(path.relative_to(SRC).as_posix())
    assert long == [], f"over 600 lines with no reason at the top: {long}"
