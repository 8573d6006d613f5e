"""How long a riverbed process takes to start: this checkout against another commit.

Workers, orchestrators, drivers, executors and CLI calls are all fresh interpreters that
import ``riverbed.cli.main`` first; the tests start hundreds of them. Times that import
in a new process, this checkout's ``src`` and a base commit's (checked out into a
temporary git worktree) in turn, both byte-compiled first as ``make test`` does, and
prints the medians and their ratio.

Usage::

    .venv/bin/python benchmarks/startup.py [--base COMMIT] [--runs 8]

The baseline in the same run: a bare ``python -c pass`` (the interpreter alone).
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start(code: str, src: Path) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(src)}, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base],
            check=True,
        )
        try:
            for src in (ROOT / "src", base / "src"):
                compileall.compile_dir(src, quiet=1)
            times: dict[str, list[float]] = {"bare": [], "base": [], "head": []}
            for _ in range(args.runs):  # interleaved, so the machine's drift hits all three
                times["bare"].append(start("pass", ROOT / "src"))
                times["base"].append(start("import riverbed.cli.main", base / "src"))
                times["head"].append(start("import riverbed.cli.main", ROOT / "src"))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"median of {args.runs} process starts (python -c ...):")
    print(f"  bare interpreter          {med['bare']:.2f} s")
    print(f"  riverbed CLI at {args.base:<9} {med['base']:.2f} s")
    ratio = med["head"] / med["base"]
    print(f"  riverbed CLI here         {med['head']:.2f} s   here/base {ratio:.2f}x")


if __name__ == "__main__":
    main()
