"""The riverbed command: etcdctl-like output, one clear line and non-zero exit on errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import run_cli


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, timeout=60)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'control.db'}"


def test_put_get_del_roundtrip(url: str) -> None:
    assert run("control", "--url", url, "put", "app/a", "1").stdout.strip() == "OK"
    run("control", "--url", url, "put", "app/b", "2")
    got = run("control", "--url", url, "get", "app/", "--prefix")
    assert got.stdout.split() == ["app/a", "1", "app/b", "2"]
    js = run("control", "--url", url, "--json", "get", "app/a")
    record = json.loads(js.stdout)
    assert record["value"] == "1" and record["version"] == 1
    # options also work after the subcommand, where etcdctl users put them
    after = run("control", "get", "app/", "--prefix", "--json", "--url", url)
    assert [json.loads(line)["key"] for line in after.stdout.splitlines()] == ["app/a", "app/b"]
    assert run("control", "--url", url, "del", "app/", "--prefix").stdout.strip() == "2"


def test_watch_replays_from_revision(url: str) -> None:
    run("control", "--url", url, "put", "k", "v1")
    run("control", "--url", url, "put", "k", "v2")
    out = run("control", "--url", url, "--json", "watch", "k", "--rev", "1", "--count", "2")
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(e["type"], e["value"]) for e in events] == [("PUT", "v1"), ("PUT", "v2")]


def test_lease_lifecycle(url: str) -> None:
    grant = json.loads(run("control", "--url", url, "--json", "lease", "grant", "30").stdout)
    lease = grant["id"]
    run("control", "--url", url, "put", "eph", "x", "--lease", lease)
    ttl = run("control", "--url", url, "--json", "lease", "timetolive", lease)
    assert 0 < json.loads(ttl.stdout)["ttl"] <= 30
    assert run("control", "--url", url, "lease", "keepalive", lease, "--once").returncode == 0
    run("control", "--url", url, "lease", "revoke", lease)
    missing = run("control", "--url", url, "get", "eph")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_lock_runs_command_with_fencing_token(url: str) -> None:
    out = run(
        "control",
        "--url",
        url,
        "lock",
        "job",
        "--ttl",
        "5",
        "--",
        sys.executable,
        "-c",
        "import os; print('token', os.environ['RIVERBED_LOCK_TOKEN'])",
    )
    assert out.returncode == 0
    assert out.stdout.splitlines()[-1].startswith("token ")
    failing = run(
        "control", "--url", url, "lock", "job", "--", sys.executable, "-c", "raise SystemExit(7)"
    )
    assert failing.returncode == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["control", "--url", "bogus://x", "get", "a"], "unknown control-plane URL"),
        (["control", "--url", "sqlite://host/x.db", "get", "a"], "three slashes"),
        (["control", "--url", "etcd://nohostport", "get", "a"], "not host:port"),
        (["control", "--url", "etcd://127.0.0.1:1?timeout=0.5", "get", "a"], "no etcd endpoint"),
        (["control", "--url", "memory://", "get", "nope"], "key 'nope' not found"),
        (["control", "--url", "memory://", "lease", "revoke", "xyz"], "is not hex"),
        (["control", "--url", "memory://", "put", "a", "b", "--", "x"], "only understood"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    out = run(*args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_an_error_shows_its_brackets(tmp_path: Path) -> None:
    """The console prints an error's text as text: a bracket in it (``[@WAREHOUSE]``,
    ``['rows', …]``) is not taken for markup and dropped."""
    spec = tmp_path / "job.py"
    spec.write_text(
        "from riverbed.jobs.timerange import ParquetInput, Rolling, TimeRangeJob\n"
        "job = TimeRangeJob(input=ParquetInput('in'), key='k', time='ts',\n"
        "    metrics=[Rolling('1h', 'v')], tables={'rows': 'delt:x'})\n"
    )
    out = run("timerange", "status", str(spec))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "tables['rows'] 'delt:x': write delta:PATH" in out.stderr, out.stderr
    assert "namespace.table[@WAREHOUSE]" in out.stderr, out.stderr


def test_corrupt_control_database_is_reported_and_left_alone(tmp_path: Path) -> None:
    bad = tmp_path / "control.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    out = run("control", "--url", f"sqlite:///{bad}", "get", "a")
    assert out.returncode == 1 and "not a riverbed control database" in out.stderr
    assert "Traceback" not in out.stderr
    assert bad.read_bytes() == b"this is not sqlite" * 100


def test_default_url_comes_from_riverbed_home(tmp_path: Path) -> None:
    import os

    env = dict(os.environ, RIVERBED_HOME=str(tmp_path / "home"))
    env.pop("RIVERBED_CONTROL", None)
    assert run("control", "put", "x", "1", env=env).returncode == 0
    assert (tmp_path / "home" / "control.db").exists()


def test_a_server_that_is_not_etcd_is_named(tmp_path: Path) -> None:
    from riverbed.testing import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import time

        import httpx

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        out = run("control", "--url", f"etcd://127.0.0.1:{port}", "get", "a")
    finally:
        server.terminate()
        server.wait()
    assert out.returncode == 1
    assert "not etcd's JSON gateway" in out.stderr and "Traceback" not in out.stderr


def test_starting_the_command_loads_no_data_library() -> None:
    """Workers, orchestrators and CLI calls start often (tests start hundreds): the entry
    point leaves numpy, pyarrow, pandas, pyspark and SQLAlchemy to the commands that use
    them (~1 s a start on 2 cores)."""
    heavy = ("numpy", "pyarrow", "pandas", "pyspark", "sqlalchemy")
    code = f"import sys, riverbed.cli.main; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
