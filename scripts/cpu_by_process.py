"""Where a machine's CPU goes, by kind of process: sample every process's CPU time
(user + system, ``/proc/<pid>/stat``) every half second while something runs, then
group the processes by what they are (Spark drivers, executors, Kafka, PySpark's
workers, riverbed's CLI, …).

    python scripts/cpu_by_process.py sample OUT.json    (until SIGTERM or Ctrl-C)
    python scripts/cpu_by_process.py report OUT.json
    python scripts/cpu_by_process.py by-test OUT.json   (which tests start what)

A process is known by its pid and start time; its last sampled CPU time counts, less
what it had used when sampling began. One that lives under half a second is missed
(counted in its parent only if the parent waits for it). A process that execs another
program (``spark-class``'s bash becoming Java) is named by the last program seen. The
report compares the sum with what ``/proc/stat`` says the machine was busy.

A process started while a test runs carries pytest's ``PYTEST_CURRENT_TEST`` in its
environment; ``by-test`` sums the CPU of the processes each test file started (a
session fixture's server counts to the test that first asked for it; the xdist workers'
own CPU — the in-process tests — to none)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections import Counter
from typing import Any

HZ = os.sysconf("SC_CLK_TCK")
MAIN_CLASS = re.compile(r"^(org|kafka|io|com)\.[\w.$]*[A-Z]\w*$")
KINDS = (  # (pattern in the command line, kind): the first match names a process
    # spark-submit's bash and the short JVM it asks for the command line (three processes
    # a Spark JVM start, of which only the last, the bash exec'd into it, is the JVM)
    ("org.apache.spark.launcher.Main", "spark-submit's launchers (bash, a short JVM)"),
    ("bin/spark-class", "spark-submit's launchers (bash, a short JVM)"),
    ("SparkConnectServer", "Spark Connect servers"),
    ("CoarseGrainedExecutorBackend", "Spark executors"),
    ("deploy.master.Master", "Spark masters"),
    ("deploy.worker.Worker", "Spark workers"),
    ("SparkSubmit", "Spark driver JVMs"),
    ("kafka.", "Kafka brokers and tools"),
    ("QuorumPeerMain", "ZooKeeper"),
    ("iceberg", "Iceberg REST catalog"),
    ("foreach_batch_worker", "PySpark's Python workers"),
    ("python_streaming_source_runner", "PySpark's Python workers"),
    ("pyspark.daemon", "PySpark's Python workers"),
    ("pyspark.worker", "PySpark's Python workers"),
    ("riverbed.cli", "riverbed's CLI processes"),
    ("bin/riverbed", "riverbed's CLI processes"),
    ("exec(eval(sys.stdin.readline()))", "pytest-xdist workers"),
    ("multiprocessing", "multiprocessing children"),
)
BY_NAME = {"etcd": "etcd", "radosgw": "Ceph", "ceph-osd": "Ceph", "ceph-mon": "Ceph",
           "postgres": "PostgreSQL, MariaDB", "mariadbd": "PostgreSQL, MariaDB"}  # fmt: skip


def _busy() -> int:
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait


def _command(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        words = f.read().decode(errors="replace").split("\0")
    return " ".join(words[:3] + [w for w in words if MAIN_CLASS.match(w)] + words[-4:])[:1500]


def _test(pid: str) -> str:
    """The test file that was running when ``pid`` started, "" if none."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        for word in f.read().split(b"\0"):
            if word.startswith(b"PYTEST_CURRENT_TEST="):
                return word.split(b"=", 1)[1].decode(errors="replace").split("::")[0]
    return ""


def sample(out: str) -> None:
    seen: dict[str, list[Any]] = {}  # "pid:start" -> [ticks, base, name, command, test]
    began, first = _busy(), True

    def dump(*_: object) -> None:
        with open(out + ".tmp", "w") as f:
            json.dump({"busy": _busy() - began, "processes": list(seen.values())}, f)
        os.replace(out + ".tmp", out)

    def stop(*_: object) -> None:
        dump()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    last = time.monotonic()
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                name = stat[stat.find("(") + 1 : stat.rfind(")")]
                fields = stat[stat.rfind(")") + 2 :].split()
                ticks, key = int(fields[11]) + int(fields[12]), f"{pid}:{fields[19]}"
                entry = seen.get(key)
                if entry is None:
                    base = ticks if first else 0
                    seen[key] = [ticks, base, name, _command(pid), _test(pid)]
                else:
                    entry[0] = ticks
                    if entry[2] != name:  # an exec
                        entry[2:4] = [name, _command(pid)]
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        first = False
        if time.monotonic() - last > 60:
            dump()
            last = time.monotonic()
        time.sleep(0.5)


def kind(name: str, command: str) -> str:
    for pattern, label in KINDS:
        if pattern in command:
            return label
    if name in BY_NAME:
        return BY_NAME[name]
    if name.startswith("python") or "python" in command.split(" ")[0]:
        return "other Python (the tests' own programs, tools)"
    return "other: " + name


def report(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    seconds: Counter[str] = Counter()
    starts: Counter[str] = Counter()
    for ticks, base, name, command, *_ in data["processes"]:
        label = kind(name, command)
        seconds[label] += (ticks - base) / HZ
        starts[label] += 1
    total = sum(seconds.values())
    print(f"{total:,.0f} s of CPU seen, the machine busy {data['busy'] / HZ:,.0f} s")
    print(f"{'CPU s':>8} {'share':>6} {'starts':>7}  processes")
    for label, spent in seconds.most_common():
        if spent < 1:
            break
        print(f"{spent:8,.0f} {spent / total:6.1%} {starts[label]:7,}  {label}")


def by_test(path: str, top: int = 30) -> None:
    with open(path) as f:
        data = json.load(f)
    seconds: Counter[str] = Counter()
    drivers: Counter[str] = Counter()
    driver_seconds: Counter[str] = Counter()
    for ticks, base, name, command, *test in data["processes"]:
        if not test:
            sys.exit(f"{path} was sampled without the tests' names: sample again")
        spent, where = (ticks - base) / HZ, test[0] or "(no test: the xdist workers, tools, …)"
        seconds[where] += spent
        if kind(name, command) == "Spark driver JVMs":
            drivers[where] += 1
            driver_seconds[where] += spent
    print(f"{sum(seconds.values()):,.0f} s of CPU seen, by the test file that started it")
    print(f"{'CPU s':>8} {'drivers':>8} {'their s':>8}  test file")
    for where, spent in seconds.most_common(top):
        print(f"{spent:8,.0f} {drivers[where]:8,} {driver_seconds[where]:8,.0f}  {where}")


if __name__ == "__main__":
    COMMANDS = {"sample": sample, "report": report, "by-test": by_test}
    if len(sys.argv) != 3 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__.split("\n\n")[1])
    COMMANDS[sys.argv[1]](sys.argv[2])
