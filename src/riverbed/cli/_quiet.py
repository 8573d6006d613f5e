"""Keep Spark's and Java's noise out of the terminal; keep it in a log file.

The JVM writes its start-up banners, ``WARN`` lines and stack traces to file
descriptor 2, which Python cannot filter. For commands that start Spark, the CLI
points fd 2 at ``RIVERBED_HOME/logs/<command>-<time>-<pid>.log`` *before* the JVM
starts (it inherits the descriptor) and gives Python a new ``sys.stderr`` on the
terminal: riverbed's own lines and warnings stay visible; py4j's and Spark's go to
the file, whose path a failure's one-line error names. ``-v`` leaves stderr alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

# how riverbed's own warnings look on the terminal
WARNED = "%(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def noise_to_log(home: Path, command: str, verbose: bool) -> Iterator[Path | None]:
    if verbose:
        yield None
        return
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    terminal: TextIO = os.fdopen(saved, "w", buffering=1, encoding="utf-8", errors="replace")
    old = sys.stderr
    sys.stderr = terminal
    # riverbed's own warnings also stay on the terminal
    visible = logging.StreamHandler(terminal)
    visible.setLevel(logging.WARNING)
    visible.setFormatter(logging.Formatter(WARNED))
    ours = logging.getLogger("riverbed")
    ours.addHandler(visible)
    # the root logger's handler still writes to the old sys.stderr, i.e. fd 2: the file
    try:
        yield path
    finally:
        ours.removeHandler(visible)
        sys.stderr.flush()
        sys.stderr = old
        os.dup2(saved, 2)
        terminal.close()
