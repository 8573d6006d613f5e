"""A log server in its own process, for tests whose clients must reach the log only
through it (``riverbed log serve``, the real command)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RIVERBED = str(Path(sys.executable).with_name("riverbed"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def log_server_process(path: Path, port: int = 0) -> Iterator[str]:
    """``riverbed log serve`` of ``path`` in its own process; yields its URL."""
    server = subprocess.Popen(
        [RIVERBED, "log", "serve", "--log", f"file://{path}", "--port", str(port)],
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
