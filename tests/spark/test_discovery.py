"""``RIVERBED_SPARK_MASTER=riverbed``: Spark masters found through the control plane
(riverbed.spark.discovery): the pure choice, and a real standalone master announced by
``riverbed control spark-master`` while it answers and withdrawn when it is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.control import connect
from riverbed.control.processes import processes
from riverbed.errors import InvalidValueError
from riverbed.spark.discovery import ROLE, master_url, resolve, silent_too_long
from riverbed.testing import free_port
from riverbed.testing.cluster import spark_home

hosts = st.sampled_from(["10.0.0.1", "10.0.0.2", "m1.example", "198.18.0.11"])
entries = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from([ROLE, ROLE, "log-server"]),
            "url": st.one_of(
                st.builds(lambda h, p: f"spark://{h}:{p}", hosts, st.sampled_from([7077, 7078])),
                st.sampled_from(["", "spark://", "http://10.0.0.1:8080", "spark://a:1,b:2"]),
            ),
            "state": st.sampled_from(["ALIVE", "STANDBY", "RECOVERING"]),
        }
    ),
    max_size=8,
)


@given(entries)
def test_every_announced_master_once_the_leading_ones_first(announced: list[Any]) -> None:
    url = master_url(announced)
    valid = [
        (e["url"].removeprefix("spark://"), e["state"])
        for e in announced
        if e["role"] == ROLE and e["url"].startswith("spark://") and e["url"].count(":") == 2
        and "," not in e["url"]
    ]  # fmt: skip
    if not valid:
        assert url is None
        return
    assert url is not None and url.startswith("spark://")
    got = url.removeprefix("spark://").split(",")
    assert len(got) == len(set(got)) and set(got) == {a for a, _ in valid}
    leading = {a for a, s in valid if s == "ALIVE"}
    assert set(got[: len(leading)]) == leading  # the leaders first


def test_a_master_string_that_is_not_riverbed_is_kept() -> None:
    assert resolve("spark://10.0.0.1:7077", "memory://") == "spark://10.0.0.1:7077"
    assert resolve("local[2]", "memory://") == "local[2]"


def test_no_master_announced_is_one_error_naming_the_way(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match=r"knows no Spark master; run `riverbed control"):
        resolve("riverbed", f"sqlite:///{tmp_path / 'control.db'}")


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)  # another process's progress: nothing to wait on here
    raise AssertionError(f"{what} within {timeout}s")


@given(  # whole seconds: the boundary itself is exact
    silent_for=st.integers(0, 100), grace=st.integers(1, 60), now=st.integers(0, 10**6)
)
def test_a_master_is_withdrawn_only_once_silent_for_the_grace(silent_for, grace, now):
    assert silent_too_long(now - silent_for, now, grace) == (silent_for >= grace)
    assert not silent_too_long(None, now, grace)  # it answered at its last look


TTL = 8  # the presence's lease and how long a silent master is kept


@pytest.mark.slow
def test_a_real_master_is_announced_while_it_answers_and_withdrawn_when_gone(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    control = f"sqlite:///{tmp_path / 'control.db'}"
    port, ui = free_port(), free_port()
    env = {
        **subprocess_env,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOG_DIR": str(tmp_path / "spark-logs"),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "RIVERBED_CONTROL": control,
        "RIVERBED_HOST": "m1",
    }
    master = subprocess.Popen(
        [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    presence = subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "control", "spark-master", url,
         "--ui", f"http://127.0.0.1:{ui}", "--ttl", str(TTL)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    cp = connect(control)
    try:
        # a master starts as STANDBY and elects itself a moment later: the announcement
        # follows its state (asserting on the first announcement raced that: STANDBY under load)
        announced = _until(
            lambda: [p for p in processes(cp) if p.get("role") == ROLE and p["state"] == "ALIVE"],
            90,
            "the announcement of the master leading",
        )
        assert len(announced) == 1 and announced[0]["url"] == url
        assert announced[0]["host"] == "m1"
        assert resolve("riverbed", control) == url  # what a driver given `riverbed` gets
        # a master that does not answer for a moment (paused 4 s: at least one look,
        # 2 s each, timed out) is a busy one: its entry stays (it went at the first
        # look that timed out, and a driver starting then got the standby alone)
        os.killpg(master.pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            while time.monotonic() - paused < 4:
                assert [p for p in processes(cp) if p.get("role") == ROLE], "withdrawn"
                time.sleep(0.2)
        finally:
            os.killpg(master.pid, signal.SIGCONT)
        assert resolve("riverbed", control) == url
        # gone for good, it is withdrawn once silent for the TTL
        os.killpg(master.pid, signal.SIGKILL)
        master.wait(timeout=30)
        _until(lambda: not [p for p in processes(cp) if p.get("role") == ROLE], 40, "withdrawal")
        # not at its first silent look: after the TTL (counted from the pause, when its
        # silence may have begun if no look came between the pause and the kill)
        assert time.monotonic() - paused >= TTL
        with pytest.raises(InvalidValueError, match="knows no Spark master"):
            resolve("riverbed", control)
        assert presence.poll() is None  # it waits for the master to answer again
    finally:
        cp.close()
        presence.terminate()
        printed, _ = presence.communicate(timeout=30)
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGKILL)
    assert f"announcing the Spark master {url}" in printed
    assert "Traceback" not in printed
