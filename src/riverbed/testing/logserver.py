"""``riverbed log serve`` in its own process — the real command — for tests and
benchmarks whose clients must reach a log only through the server."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RIVERBED = str(Path(sys.executable).with_name("riverbed"))  # this interpreter's CLI


@contextlib.contextmanager
def log_server_process(log: Path | str, port: int = 0) -> Iterator[str]:
    """Serve ``log`` (a directory, or a ``file://`` URL) on ``port`` (0: a free one) in
    its own process; yields the server's ``flight://`` URL, and kills it after."""
    url = f"file://{log}" if isinstance(log, Path) else log
    server = subprocess.Popen(
        [RIVERBED, "log", "serve", "--log", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert " at flight://" in line, f"the log server did not start: {line!r}"
        yield line.split(" at ")[1].split()[0]
    finally:
        server.kill()
        server.wait()
