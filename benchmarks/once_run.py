"""A ``riverbed stream run --once`` over a small backlog — the run of an aggregation a
scheduler starts every few minutes — as a whole process: this checkout against another
commit (before Spark was deferred to the first batch that needs it,
:mod:`riverbed.spark.lazy`), and the yardstick of starting a Spark session alone.

The backlog (``--events`` over three partitions) is written once; each run gets a fresh
copy of that home, so every run reads the whole backlog and starts with no checkpoint.
Runs alternate — this checkout, the base (its ``src`` checked out into a temporary git
worktree), Spark alone — so the machine's drift hits all three. Prints the medians of
wall and CPU seconds (the process and its children: Spark's JVM, Python workers) and
their ratios.

Usage::

    .venv/bin/python benchmarks/once_run.py [--base COMMIT] [--runs 5] [--events 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Sum, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"users": Distinct("user_id"), "events": Count(), "total": Sum("amount")},
    state_partitions=3,
)
"""
SPARK_ALONE = (
    "from riverbed.config import SparkConfig; from riverbed.spark import session; "
    "session(SparkConfig(master='local[2]')).stop()"
)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where there is one


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float | None]:
    """Wall and CPU seconds of ``command`` and every process it started — Spark's JVM
    outlives its Python parent by a moment and is never waited for, so the CPU is a
    cgroup's count (None where no cgroup v1 ``cpuacct`` hierarchy can be written)."""
    group = CPUACCT / f"rb-once-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpuacct.usage").write_text("0")
    except OSError:
        group = None  # type: ignore[assignment]
    if group is not None:
        command = ["sh", "-c", f'echo $$ > {group}/tasks && exec "$@"', "sh", *command]
    began = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - began
    if group is None:
        return wall, None
    deadline = time.monotonic() + 30
    while (group / "tasks").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)  # the JVM exits after its Python parent
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rb-once-") as tmp:
        work = Path(tmp)
        base = work / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            _measure(work, {"this checkout": ROOT / "src", args.base: base / "src"}, args)
        finally:
            with contextlib.suppress(OSError):
                (CPUACCT / f"rb-once-{os.getpid()}").rmdir()
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False, capture_output=True,
            )  # fmt: skip


def _measure(work: Path, sources: dict[str, Path], args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.stream.conftest import make_events, write_events

    prepared = work / "prepared"
    write_events(f"file://{prepared / 'log'}", make_events(args.events, hours=4), partitions=3)
    spec = work / "flags.py"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERBED_")}
    env["RIVERBED_SPARK_MASTER"] = "local[2]"
    sides = {**{name: str(src) for name, src in sources.items()}, "Spark alone": str(ROOT / "src")}
    seen: dict[str, list[tuple[float, float | None]]] = {name: [] for name in sides}
    for run in range(args.runs + 1):  # the first round warms the page cache, uncounted
        for name, src in sides.items():
            home = work / "home"
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(prepared, home)
            side_env = {**env, "PYTHONPATH": src, "RIVERBED_HOME": str(home)}
            if name == "Spark alone":
                command = [sys.executable, "-c", SPARK_ALONE]
            else:
                command = [sys.executable, "-m", "riverbed.cli.main", "stream", "run",
                           str(spec), "--once"]  # fmt: skip
            measured = timed(command, side_env)
            if run:
                seen[name].append(measured)
    wall = {name: statistics.median(w for w, _ in got) for name, got in seen.items()}
    cpu = {name: statistics.median(c for _, c in got) if all(c is not None for _, c in got)
           else None for name, got in seen.items()}  # fmt: skip
    print(f"stream run --once over {args.events:,} events, medians of {args.runs} runs each")
    print(f"{'':>16} {'wall s':>8} {'cpu s':>8}")
    for name in sides:
        print(f"{name:>16} {wall[name]:8.2f} {_s(cpu[name]):>8}")
    for name in [*list(sources)[1:], "Spark alone"]:
        ratio = _ratio(cpu["this checkout"], cpu[name])
        print(
            f"this checkout / {name}: wall {wall['this checkout'] / wall[name]:.2f}x, cpu {ratio}"
        )
    if cpu["this checkout"] is None:
        print("(CPU: no cgroup v1 cpuacct hierarchy to count a process tree's CPU in)")


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


if __name__ == "__main__":
    main()
