"""The console in a real browser (Debian's chromium driven by Playwright): every page
renders without a console error and updates itself; a failing job shows its traceback
and tailing log; a consumer SIGKILLed shows up as a rebalance without a reload; a
running aggregation's page shows batches advancing and its lag draining.

Screenshots land in build/screenshots/ (one per page and moment)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from riverbed.testing import free_port
from tests.ui.conftest import Home

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def start_ui(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "ui", "--port", str(port), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "riverbed ui at http://127.0.0.1:" in line, (line, proc.stderr and proc.stderr.read())
    base = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/static/console.css", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, base


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: run `make test` (it installs Debian's chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A page with its console errors collected."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)

    def _failed(self, request: Any) -> None:
        # a page's own poll still in flight when the test navigates away is cancelled by
        # the browser (net::ERR_ABORTED): not a failure of the console
        if "ERR_ABORTED" not in str(request.failure):
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def open(self, path: str) -> Any:
        answer = self.page.goto(self.base + path)
        assert answer is not None and answer.status == 200, (path, answer and answer.status)
        return self.page

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def text(self, selector: str) -> str:
        return str(self.page.locator(selector).first.inner_text())

    def until(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                self.shot(f"timeout-{re.sub(r'[^a-z0-9]+', '-', what.lower())}")
                raise AssertionError(f"{what}: not seen within {timeout:.0f} s")
            self.page.wait_for_timeout(250)

    def close(self) -> None:
        self.page.close()


@pytest.fixture(scope="module")
def console_url(home: Home) -> Iterator[str]:
    proc, base = start_ui(home.env, "--interval", "0.5")
    yield base
    stop(proc)


def test_every_page_renders_without_console_errors_and_updates_itself(
    browser: Any, console_url: str, home: Home
) -> None:
    import httpx

    bad_chunk = httpx.get(f"{console_url}/api/jobs/runs/{home.failed_run}").json()["chunks"][0]
    pages = {
        "overview": "/",
        "topics": "/topics",
        "topic-browser": "/topics/clicks?partition=0&where=n~1",
        "groups": "/groups",
        "group": "/groups/watchers",
        "streams": "/streams",
        "state": "/state",
        "control": "/control",
        "hosts": "/hosts",
        "jobs": "/jobs",
        "jobs-failed": "/jobs?state=FAILED",
        "run": f"/jobs/runs/{home.done_run}",
        "chunk": f"/jobs/chunks/{bad_chunk['id']}",
    }
    page = Page(browser, console_url)
    try:
        for name, path in pages.items():
            p = page.open(path)
            assert p.locator("h1").count() == 1
            assert "riverbed " in page.text(".cli")  # the CLI command with the same data
            stamp = page.text("#updated")
            page.until(f"{name} refreshed", lambda s=stamp: page.text("#updated") != s, 10)
            page.shot(name)
            assert page.problems == [], (name, page.problems)
        # the browser form seeks, filters, and says what it scanned
        page.open("/topics/clicks")
        page.page.fill("input[name=partition]", "0")
        page.page.fill("input[name=where]", "n~1")
        page.page.click("form.browse button")
        page.page.wait_for_url(re.compile(r"partition=0"))
        assert re.search(r"scanned \d+ of \d+ records from offset 0", page.text("#scanned"))
        values = page.page.locator("table.records td code").all_inner_texts()
        assert values and all('"n": ' in v and "1" in v.split('"n": ')[1] for v in values)
        # the lag chart is drawn by uPlot (vendored) on the group page
        page.open("/groups/readers")
        page.until("lag chart", lambda: page.page.locator(".chart canvas").count() > 0, 15)
        assert page.problems == [], page.problems
    finally:
        page.close()


def test_a_failing_job_shows_its_traceback_and_its_log(
    browser: Any, console_url: str, home: Home
) -> None:
    page = Page(browser, console_url)
    try:
        page.open("/jobs?state=FAILED")
        page.page.click(f"a[href='/jobs/runs/{home.failed_run}']")
        page.page.click("table a[href^='/jobs/chunks/']")
        page.until("traceback", lambda: "RuntimeError: asked to fail" in page.text("pre.traceback"))
        page.until("log tail", lambda: "working on [1, 2]" in page.text("pre.log"))
        page.shot("failed-chunk")
        assert page.problems == []
    finally:
        page.close()


def test_a_killed_consumer_shows_up_as_a_rebalance_without_a_reload(
    browser: Any, console_url: str, home: Home
) -> None:
    members = [
        subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli.main", "consume", "clicks", "--group", "live",
             "--from-beginning", "--ttl", "2"],
            env=home.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]  # fmt: skip
    import httpx

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            g = httpx.get(f"{console_url}/api/groups/live")
            if g.status_code == 200 and len(g.json()["members"]) == 2:
                break
            time.sleep(0.3)
        page = Page(browser, console_url)
        page.open("/groups/live")
        page.until("two members", lambda: page.page.locator(".member").count() == 2, 30)
        before = int(page.text(".generation"))
        page.shot("group-two-members")
        os.kill(members[0].pid, signal.SIGKILL)
        members[0].wait()
        # the page polls itself: the lease (2 s) expires, the group rebalances
        page.until("one member", lambda: page.page.locator(".member").count() == 1, 30)
        page.until("new generation", lambda: int(page.text(".generation")) > before, 30)
        survivor = page.page.locator(".member").first.inner_text()

        def owned() -> bool:  # the survivor claims the dead member's partitions (from —)
            owners = page.page.locator("table td:nth-child(3)").all_inner_texts()
            return len(owners) == 3 and set(owners) == {survivor}

        page.until("survivor owns every partition", owned, 30)
        page.shot("group-after-rebalance")
        assert page.problems == []
        page.close()
    finally:
        for m in members:
            m.kill()
            m.wait()


SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}
aggregation = Aggregation(
    name="watched", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={"users": Distinct("user_id"), "users_hll": Distinct("user_id", mode="hll"),
             "events": Count()},
    state_partitions=2,
)
"""


@pytest.mark.spark
@pytest.mark.slow
def test_a_running_aggregation_shows_batches_advancing_and_its_lag_draining(
    browser: Any, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    watch_a_running_aggregation(browser, tmp_path, subprocess_env)


@pytest.mark.s3
def test_an_aggregation_checkpointed_in_a_bucket_shows_the_same_without_its_keys(
    browser: Any, tmp_path: Path, subprocess_env: dict[str, str], s3_server: Any
) -> None:
    """Checkpoints, state and results in the tests' bucket (RIVERBED_CHECKPOINTS): the
    console reads everything it shows from there, and no page holds a key."""
    import httpx

    from tests.conftest import S3_BUCKET

    checkpoints = f"s3://{S3_BUCKET}/console-{os.urandom(3).hex()}"
    env = {**subprocess_env, **s3_server.env(), "RIVERBED_CHECKPOINTS": checkpoints}

    def from_the_bucket(base: str) -> None:
        page = httpx.get(f"{base}/streams/watched", timeout=30).text
        api = httpx.get(f"{base}/api/streams/watched", timeout=30).text
        assert f"{checkpoints}/watched" in page  # the checkpoint it read, named
        for secret in (s3_server.secret_key, s3_server.access_key):
            assert secret not in page and secret not in api

    watch_a_running_aggregation(browser, tmp_path, env, from_the_bucket)


def watch_a_running_aggregation(
    browser: Any,
    tmp_path: Path,
    subprocess_env: dict[str, str],
    then: Callable[[str], None] | None = None,
) -> None:
    """A driver runs an aggregation over a backlog while its console page is open: the
    page shows batches advancing and the lag draining to 0, live chart and HLL band;
    ``then`` checks more with the console's address before it stops."""
    import httpx

    from tests.stream.conftest import make_events, write_events

    home = tmp_path / "home"
    env = {
        **subprocess_env,
        "RIVERBED_HOME": str(home),
        "RIVERBED_SPARK_MASTER": "local[2]",
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
    }
    write_events(f"file://{home / 'log'}", make_events(4000, hours=4), partitions=2)
    spec = tmp_path / "watched.py"
    spec.write_text(SPEC)
    ui, base = start_ui(env, "--interval", "0.5")
    driver = subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
         "--max-records-per-batch", "250", "--ttl", "3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    page = Page(browser, base)
    try:
        deadline = time.monotonic() + 180
        while httpx.get(f"{base}/api/streams/watched", timeout=30).status_code != 200:
            assert driver.poll() is None, driver.stderr and driver.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the aggregation never started"
            time.sleep(0.5)
        page.open("/streams/watched")
        seen: list[tuple[int, int]] = []

        def progress() -> bool:
            batches = int(page.text("#batches").replace(",", "") or 0)
            lag = int(page.text("#lag").replace(",", "") or 0)
            if not seen or seen[-1] != (batches, lag):
                seen.append((batches, lag))
            return lag == 0 and batches >= 16

        page.until("lag drained", progress, 180)
        assert page.text(".card .ok") == "active"
        batch_counts = [b for b, _ in seen]
        lags = [lag for _, lag in seen]
        assert batch_counts == sorted(batch_counts) and len(set(batch_counts)) >= 3, seen
        assert max(lags) > 0 and lags[-1] == 0, seen
        assert lags == sorted(lags, reverse=True), seen  # it only drains (no new input)
        page.until("live chart", lambda: page.page.locator(".livechart canvas").count() > 0, 30)
        page.page.select_option("select.metric", "users_hll")
        page.until("error band", lambda: "HLL: ±" in page.text(".live-note"), 10)
        page.shot("stream-running-bucket" if "RIVERBED_CHECKPOINTS" in env else "stream-running")
        assert page.problems == [], page.problems
        if then is not None:
            then(base)
    finally:
        page.close()
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()
        stop(ui)
