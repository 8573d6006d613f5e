"""What the tests check, compared between two commits: per file under tests/, its test
functions and its checks (``assert`` statements, ``pytest.raises``/``warns``, and calls
of helpers named ``assert…``/``_assert…``/``expect…``), and every file whose counts went
down — the files a change that claims to drop nothing must explain.

    usage: python scripts/test_checks.py BASE [HEAD]    (run in the repository)

Counts are syntactic: a check moved into a shared helper counts once where the helper
is defined, and a wait that polls a condition instead of asserting it once counts the
same. A lower count is a question to answer, not a verdict."""

from __future__ import annotations

import ast
import subprocess
import sys

HELPER_PREFIXES = ("assert", "_assert", "expect", "_expect")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def _files(commit: str) -> list[str]:
    names = _git("ls-tree", "-r", "--name-only", commit, "tests").split()
    return [name for name in names if name.endswith(".py")]


def _counts(commit: str, path: str) -> tuple[int, int]:
    tests = checks = 0
    for node in ast.walk(ast.parse(_git("show", f"{commit}:{path}"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            tests += node.name.startswith("test")
        elif isinstance(node, ast.Assert):
            checks += 1
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            checks += name in ("raises", "warns") or name.startswith(HELPER_PREFIXES)
    return tests, checks


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    base, head = argv[1], argv[2] if len(argv) == 3 else "HEAD"
    before = {path: _counts(base, path) for path in _files(base)}
    after = {path: _counts(head, path) for path in _files(head)}
    fewer = 0
    for path in sorted(before.keys() | after.keys()):
        (t0, c0), (t1, c1) = before.get(path, (0, 0)), after.get(path, (0, 0))
        if t1 < t0 or c1 < c0:
            gone = " (file gone)" if path not in after else ""
            print(f"fewer  {path}{gone}: tests {t0} -> {t1}, checks {c0} -> {c1}")
            fewer += 1
    tests = [sum(t for t, _ in side.values()) for side in (before, after)]
    checks = [sum(c for _, c in side.values()) for side in (before, after)]
    print(
        f"{base} -> {head}: {len(before)} -> {len(after)} files, test functions "
        f"{tests[0]} -> {tests[1]}, checks {checks[0]} -> {checks[1]}; {fewer} files with fewer"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
