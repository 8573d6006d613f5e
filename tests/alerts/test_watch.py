"""``riverbed alerts`` as a user runs it, against a real HTTP server started here: failed
chunks and jobs retried out, a host whose process was SIGKILLed, a stream stopped,
lagging, replaced and running again — each sent once, resolved once, in JSON or
Slack's format, the webhook's secret path never printed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from riverbed.alerts import Alert, Notice, Webhook
from riverbed.alerts.webhook import RefusedError, SendError
from riverbed.control import connect
from riverbed.control.processes import hosts_of
from riverbed.processes import kill_session
from tests.cli import run_cli
from tests.jobs.cluster import until
from tests.stream.conftest import make_events, write_events

SECRET = "T000/B000/s3cr3t-webhook-path"


class Receiver:
    """A webhook receiver on loopback: keeps every JSON body; answers ``status`` (503: a
    receiver having a bad moment) to the first ``refuse`` requests."""

    def __init__(self, refuse: int = 0, status: int = 503) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.refuse, self.status = refuse, status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                if receiver.refuse > 0:
                    receiver.refuse -= 1
                    self.send_response(receiver.status)
                    self.end_headers()
                    return
                receiver.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self) -> list[dict[str, Any]]:
        got, self.bodies = self.bodies, []
        return got

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(refuse=1)
    yield r
    r.close()


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str], receiver: Receiver) -> dict[str, str]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    return {
        **subprocess_env,
        "RIVERBED_HOME": str(tmp_path / "home"),
        "RIVERBED_JOBS_DIR": str(jobs),
        "RIVERBED_JOBS_DB": f"sqlite:///{tmp_path / 'jobs.db'}",
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
        "RIVERBED_ALERT_WEBHOOK": receiver.url,
        "RIVERBED_SPARK_MASTER": "local[2]",
    }


FAILING = """from riverbed.jobs import Job

def main(ctx, work_ids, **kwargs):
    raise RuntimeError("the {name} job cannot read its input")

job = Job(main=main, retries={retries}, retry_backoff="0s")
"""


def cli(env: dict[str, str], *args: str, seen: list[str] | None = None) -> str:
    out = run_cli(*args, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    if seen is not None:
        seen.append(out.stdout + out.stderr)
    return out.stdout


def holding(env: dict[str, str], *extra: str) -> dict[str, str]:
    """What ``alerts check`` says holds now: key → kind."""
    lines = cli(env, "alerts", "check", "--json", *extra).splitlines()
    return {a["key"]: a["kind"] for a in map(json.loads, lines)}


def sent(receiver: Receiver) -> list[tuple[str, str]]:
    return sorted((b["status"], b["key"]) for b in receiver.take())


def test_a_send_is_retried_through_a_bad_moment_and_not_when_refused() -> None:
    notice = Notice("firing", 1.0, Alert("k", "host.down", "error", "host h", "down"))
    flaky, refusing = Receiver(refuse=5), Receiver(refuse=1, status=400)
    try:
        with pytest.raises(SendError) as raised:
            Webhook(flaky.url, backoff=0.01).send(notice)
        assert not isinstance(raised.value, RefusedError) and len(flaky.paths) == 3
        assert SECRET not in str(raised.value) and "HTTP 503" in str(raised.value)
        with pytest.raises(RefusedError, match="HTTP 400"):
            Webhook(refusing.url, backoff=0.01).send(notice)
        assert len(refusing.paths) == 1  # a refusal is not sent again
        Webhook(flaky.url, backoff=0.01).send(notice)  # the bad moment over
        assert flaky.take()[0]["key"] == "k"
    finally:
        flaky.close()
        refusing.close()


def test_failed_chunks_and_a_lost_host_are_sent_once_and_a_host_back_is_resolved(
    env: dict[str, str], receiver: Receiver, tmp_path: Path
) -> None:
    jobs = Path(env["RIVERBED_JOBS_DIR"])
    printed: list[str] = []
    for name, retries in (("old", 0), ("once", 0), ("flaky", 1)):
        (jobs / f"{name}.py").write_text(FAILING.format(name=name, retries=retries))
    run_cli("jobs", "run", "old", env=env)  # fails before any watcher: history
    watch = ("alerts", "watch", "--once")
    cli(env, *watch, seen=printed)
    assert receiver.take() == []  # the first look takes what failed before as history

    run_cli("jobs", "run", "once", env=env)
    run_cli("jobs", "run", "flaky", env=env)
    # a worker on host h9 (RIVERBED_HOST names hosts, as on the test bed), SIGKILLed
    worker_env = {**env, "RIVERBED_HOST": "h9"}
    cmd = [sys.executable, "-m", "riverbed.cli.main", "worker", "--ttl", "1"]
    worker = subprocess.Popen(cmd, env=worker_env, start_new_session=True)
    try:
        until(lambda: _h9(env) == "up", 60, "h9 up")
    finally:
        kill_session(worker.pid)
    until(lambda: "host:h9:down" in holding(env), 60, "h9 down after its worker's lease")

    cli(env, *watch, seen=printed)  # the receiver refuses the first POST: retried
    bodies = receiver.take()
    assert sorted((b["status"], b["kind"], b["subject"]) for b in bodies) == [
        ("firing", "chunk.failed", f"job once chunk {_chunk(env, 'once')}"),
        ("firing", "host.down", "host h9"),
        ("firing", "job.retried_out", f"job flaky chunk {_chunk(env, 'flaky')}"),
    ], bodies
    assert receiver.paths[0] == receiver.paths[1] == f"/services/{SECRET}"  # retried once
    (flaky,) = [b for b in bodies if b["kind"] == "job.retried_out"]
    assert "failed all 2 attempts" in flaky["text"]
    assert "the flaky job cannot read its input" in flaky["text"]
    assert all(b["source"] == "riverbed" and b["at"] > 0 for b in bodies)
    cli(env, *watch, seen=printed)
    assert receiver.take() == []  # nothing new: nothing sent again

    # a Slack watcher of its own memory: failures before it are history, a host down is not
    slack = ("alerts", "watch", "--once", "--format", "slack", "--name", "slack")
    cli(env, *slack, seen=printed)
    (body,) = receiver.take()
    assert set(body) == {"text"} and body["text"].startswith("🔴 *host.down* host h9 runs no")
    worker = subprocess.Popen(cmd, env=worker_env, start_new_session=True)
    try:
        until(lambda: _h9(env) == "up", 60, "h9 up again")
        cli(env, *watch, seen=printed)
        assert sent(receiver) == [("resolved", "host:h9:down")]
        cli(env, *slack, seen=printed)
        (body,) = receiver.take()
        assert body["text"].startswith("✅ *host.down* resolved: host h9")
        cli(env, *watch, seen=printed)
        cli(env, *slack, seen=printed)
        assert receiver.take() == []  # resolved once
    finally:
        kill_session(worker.pid)
    until(lambda: "host:h9:down" in holding(env), 60, "h9 down again")

    # skipped kinds are not reported; a bad kind and a missing webhook are one line each
    assert "host:h9:down" not in holding(env, "--skip", "host.down")
    bad = run_cli("alerts", "check", "--skip", "host.dwn", env=env)
    assert bad.returncode == 2 and "unknown alert kind(s) host.dwn" in bad.stderr
    no_hook = run_cli("alerts", "watch", "--once", env={**env, "RIVERBED_ALERT_WEBHOOK": ""})
    assert no_hook.returncode == 2 and "set RIVERBED_ALERT_WEBHOOK" in no_hook.stderr
    not_http = run_cli(
        "alerts", "watch", "--once", env={**env, "RIVERBED_ALERT_WEBHOOK": f"ftp://x/{SECRET}"}
    )
    assert not_http.returncode == 2 and "is not an http(s) URL" in not_http.stderr
    printed += [bad.stderr, no_hook.stderr, not_http.stdout + not_http.stderr]
    # a receiver that is gone: the notice is kept for the next round, the secret unsaid
    receiver.close()
    down = run_cli("-v", *slack, env=env)
    printed.append(down.stdout + down.stderr)
    assert down.returncode == 0 and "did not take a notice" in down.stderr
    assert "127.0.0.1" in down.stderr  # the host is named; the path is not
    assert all(SECRET not in text and "s3cr3t" not in text for text in printed)
    again = Receiver()
    try:
        cli({**env, "RIVERBED_ALERT_WEBHOOK": again.url}, *slack)
        (body,) = again.take()
        assert body["text"].startswith("🔴 *host.down* host h9")
    finally:
        again.close()


def _h9(env: dict[str, str]) -> str | None:
    """h9's state on the control plane: up, down, or None (never seen)."""
    cp = connect(env["RIVERBED_CONTROL"])
    try:
        return next((h["state"] for h in hosts_of(cp) if h["host"] == "h9"), None)
    finally:
        cp.close()


def _chunk(env: dict[str, str], job: str) -> int:
    chunks = json.loads(cli(env, "jobs", "--json", "list", "--chunks"))
    (row,) = [c for c in chunks if c["job"] == job]
    return int(row["id"])


SPEC = """
from riverbed.stream import Aggregation, Count, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"events": Count()},
)
"""


@pytest.mark.spark
def test_a_stream_stopped_lagging_replaced_and_killed_is_reported_as_it_happens(
    env: dict[str, str], receiver: Receiver, tmp_path: Path
) -> None:
    receiver.refuse = 0
    log = f"file://{Path(env['RIVERBED_HOME']) / 'log'}"
    write_events(log, make_events(400, hours=2), partitions=3)
    spec = tmp_path / "flags.py"
    spec.write_text(SPEC)
    done = run_cli("stream", "run", str(spec), "--once", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # (the driver's host runs nothing now: down, as the console says; not this test's)
    opts = ("--lag", "100", "--skip", "host.down")
    watch = ("alerts", "watch", "--once", *opts)
    now = holding(env, *opts)
    (term,) = [k for k, kind in now.items() if kind == "stream.replaced"]
    assert now == {"stream:flags:stopped": "stream.stopped", term: "stream.replaced"}
    cli(env, *watch)  # the driver's term: history at the watcher's first look
    assert sent(receiver) == [("firing", "stream:flags:stopped")]

    write_events(log, make_events(300, hours=2, seed=1), partitions=3)  # 300 > --lag 100
    cli(env, *watch)
    assert sent(receiver) == [("firing", "stream:flags:lagging")]

    cmd = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--ttl", "2"]
    driver = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        up = lambda: set(holding(env, *opts).values()) == {"stream.replaced"}  # noqa: E731
        until(up, 240, "the driver up and caught up")
        cli(env, *watch)
        (new,) = [k for k, kind in holding(env, *opts).items() if kind == "stream.replaced"]
        assert new != term
        assert sent(receiver) == [
            ("firing", new),  # the new driver's term
            ("resolved", "stream:flags:lagging"),
            ("resolved", "stream:flags:stopped"),
        ]
    finally:
        kill_session(driver.pid)
    until(lambda: "stream:flags:stopped" in holding(env), 60, "the killed driver's lease gone")
    cli(env, *watch)
    assert sent(receiver) == [("firing", "stream:flags:stopped")]
