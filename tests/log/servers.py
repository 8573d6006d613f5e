"""``riverbed log serve --store s3://…`` in a process of its own, for the tests that kill
and replace log servers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A log server of the diskless topics at ``store``, in its own directory (its
    machine's disk); ``start`` returns once it serves."""

    def __init__(self, home: Path, store: str, env: dict[str, str]) -> None:
        self.home, self.store, self.env = home, store, env
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "riverbed.cli.main", "log", "serve", "--store",
                   self.store, "--port", str(self.port)]  # fmt: skip
        env = {**self.env, "RIVERBED_HOME": str(self.home)}
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "serving" in line, line

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)  # the machine's disk is gone too
