"""The console over HTTP: every page and its JSON twin, the record browser, /metrics,
the token, read-only by default, CSRF on actions — against a real home (file log,
SQLite control plane and jobs database) filled by real clients."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from riverbed.inspect import Sources
from riverbed.ui.app import CSP, PAGES, create_app
from riverbed.ui.console import Console
from tests.cli import run_cli
from tests.ui.conftest import Home

UI = Path(__file__).resolve().parents[2] / "src" / "riverbed" / "ui"


@pytest.fixture(scope="module")
def console(home: Home) -> Iterator[Console]:
    sources = Sources(home.config)
    yield Console(sources, interval=3600)
    sources.close()


@pytest.fixture(scope="module")
def client(console: Console) -> Iterator[TestClient]:
    with TestClient(create_app(console, sample=False)) as c:
        yield c


def test_every_page_renders_names_its_cli_command_and_has_csp(client: TestClient) -> None:
    for path, title in PAGES:
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert f"<h1>{title}</h1>" in page.text
        assert "same data: <code>riverbed " in page.text and "--json</code>" in page.text
        assert page.headers["Content-Security-Policy"] == CSP
        assert page.headers["X-Frame-Options"] == "DENY"
        # htmx polls the same URL for the live part only
        live = client.get(path, headers={"HX-Request": "true"})
        assert live.status_code == 200 and "<html" not in live.text and "<nav>" not in live.text


def test_overview_says_what_is_wrong(client: TestClient, home: Home) -> None:
    o = client.get("/api/overview").json()
    lags = {g["group"]: g["lag"] for g in client.get("/api/groups").json()}
    assert lags["readers"] == home.records - home.committed  # (until the reset action test)
    # watchers never committed: its lag counts from offset 0
    assert (o["worst_lag"]["name"], o["worst_lag"]["lag"]) == ("watchers", home.records)
    assert {x["name"]: x["lag"] for x in o["lags"]} == lags
    assert o["failed_chunks"] == 1
    assert [r["id"] for r in o["failing_runs"]] == [home.failed_run]
    assert o["log_bytes"] > 0 and o["errors"] == []
    page = client.get("/").text
    assert f'href="/jobs/runs/{home.failed_run}"' in page


def test_topics_partitions_and_bytes(client: TestClient, home: Home) -> None:
    topics = {t["name"]: t for t in client.get("/api/topics").json()}
    assert set(topics) == {"clicks", "empty"}
    clicks = topics["clicks"]
    assert clicks["records"] == home.records and len(clicks["partitions"]) == 3
    assert all(p["bytes"] > 0 for p in clicks["partitions"] if p["records"])
    assert topics["empty"]["records"] == 0
    one = client.get("/api/topics/clicks").json()
    assert [p["end"] for p in one["partitions"]] == [p["end"] for p in clicks["partitions"]]
    missing = client.get("/api/topics/nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == (
        f"no topic 'nope' in file://{home.config.home.resolve() / 'log'} (topics: clicks, empty)"
    )
    assert "no topic &#39;nope&#39;" in client.get("/topics/nope").text


def test_browse_by_offset_key_filter_and_time_says_what_it_scanned(
    client: TestClient, home: Home
) -> None:
    parts = client.get("/api/topics/clicks").json()["partitions"]
    p = max(parts, key=lambda x: x["records"])
    n = p["records"]
    page = client.get(f"/api/topics/clicks/records?partition={p['partition']}&offset=5&limit=3")
    body = page.json()
    assert [r["offset"] for r in body["records"]] == [5, 6, 7]
    assert (body["scanned"], body["of"], body["next"], body["more"]) == (3, n - 5, 8, True)
    flag = body["records"][0]["key"]
    keyed = client.get(
        f"/api/topics/clicks/records?partition={p['partition']}&key={flag}&limit=1000"
    ).json()
    expected = sum(1 for i in range(home.records) if f"flag-{i % 5:02d}" == flag)
    assert len(keyed["records"]) == expected and keyed["scanned"] == n
    assert all(r["key"] == flag for r in keyed["records"])
    small = client.get(
        f"/api/topics/clicks/records?partition={p['partition']}&where=n~7&limit=1000"
    ).json()["records"]
    assert small and all("7" in str(r["value"]["n"]) for r in small)
    capped = client.get(
        f"/api/topics/clicks/records?partition={p['partition']}&where=n=-1&scan=10"
    ).json()
    assert (capped["records"], capped["scanned"], capped["more"]) == ([], 10, True)
    # seek by time: every record was stamped at append, the first is at or after itself
    first = body["records"][0]
    when = first["timestamp"].replace("+00:00", "")
    by_time = client.get(
        f"/api/topics/clicks/records?partition={p['partition']}&time={when}&limit=1"
    ).json()
    assert by_time["records"][0]["timestamp"] <= first["timestamp"]
    assert by_time["from"] <= first["offset"]
    html = client.get(f"/topics/clicks?partition={p['partition']}&offset=5&limit=3").text
    assert f"scanned 3 of {n - 5} records from offset 5" in html


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("partition=9", 404, "topic 'clicks' has partitions 0..2, not 9"),
        ("partition=0&where=flag", 404, "filter 'flag' is not FIELD=VALUE"),
        ("partition=0&offset=x", 404, "offset='x' is not a whole number"),
        ("partition=0&time=yesterday", 404, "time='yesterday' is not ISO 8601"),
        ("partition=0&offset=1&time=2026-01-01", 404, "seek by offset or by time, not both"),
        ("", 404, "name a partition: ?partition=N"),
    ],
)
def test_bad_browse_input_gets_one_clear_error(
    client: TestClient, query: str, status: int, message: str
) -> None:
    answer = client.get(f"/api/topics/clicks/records?{query}")
    assert answer.status_code == status
    assert message in answer.json()["error"]


def test_groups_lag_members_and_owners(client: TestClient, home: Home) -> None:
    groups = {g["group"]: g for g in client.get("/api/groups").json()}
    assert set(groups) == {"readers", "watchers"}
    readers = groups["readers"]
    assert readers["lag"] == home.records - home.committed and readers["members"] == []
    assert sum(p["committed"] or 0 for p in readers["partitions"]) == home.committed
    assert len(groups["watchers"]["members"]) == 1
    assert all(p["owner"] for p in groups["watchers"]["partitions"])
    assert readers["drain"] == "not draining"  # one sample: no trend yet
    page = client.get("/groups/watchers").text
    assert groups["watchers"]["members"][0] in page
    assert client.get("/groups/nope").status_code == 404


def test_hosts_show_which_host_runs_what_and_which_are_down(client: TestClient) -> None:
    import socket

    h = client.get("/api/hosts").json()
    rows = {r["host"]: r for r in h["hosts"]}
    # a live log server keeps its host up
    assert rows["host-b"]["state"] == "up" and rows["host-b"]["roles"] == ["log-server"]
    # the fixture's jobs worker ran here and stopped: the host was seen, nothing lives
    mine = rows[socket.gethostname()]
    assert mine["state"] == "down" and mine["processes"] == [] and mine["last_seen"]
    assert (h["up"], h["down"]) == (1, 1)
    page = client.get("/hosts").text
    assert "host-b" in page and "log-server" in page
    assert '<span class="state failed">down</span>' in page


def test_control_shows_leaders_locks_members_and_leases(client: TestClient) -> None:
    c = client.get("/api/control").json()
    names = {e["name"]: e for e in c["elections"]}
    assert '"driver": "host-a:1"' in names["orchestrator"]["leader"]["value"]
    assert names["orchestrator"]["term"] > 0
    assert [lock["name"] for lock in c["locks"]] == ["nightly-compaction"]
    assert 0 < c["locks"][0]["holder"]["ttl"] <= 30
    assert any(r["group"].startswith("loggroup") or r["members"] for r in c["registries"])
    assert c["leases"] and all(lease["ttl"] is None or lease["ttl"] > 0 for lease in c["leases"])


def test_jobs_grid_filters_run_graph_chunk_traceback_and_log(
    client: TestClient, home: Home
) -> None:
    j = client.get("/api/jobs").json()
    runs = {r["id"]: r for r in j["runs"]}
    assert runs[home.done_run]["state"] == "DONE"
    assert runs[home.failed_run]["state"] == "FAILED"
    assert runs[home.queued_run]["state"] == "MASTER"
    failed_only = client.get("/api/jobs?state=failed").json()["runs"]
    assert [r["id"] for r in failed_only] == [home.failed_run]
    assert client.get("/api/jobs?state=sleepy").json()["error"].startswith("state='SLEEPY'")
    run = client.get(f"/api/jobs/runs/{home.done_run}").json()
    assert [c["state"] for c in run["chunks"]] == ["DONE", "DONE"]
    assert [c["work_ids"] for c in run["chunks"]] == [[1, 2, 3], [4, 5, 6]]
    (fresh,) = run["freshness"]
    assert [w["id"] for w in fresh["work_ids"]] == [1, 2, 3, 4, 5, 6]
    assert all(w["age_s"] is not None and w["age_s"] >= 0 for w in fresh["work_ids"])
    (regional,) = client.get(f"/api/jobs/runs/{home.kwargs_run}").json()["freshness"]
    assert regional["kwargs"] == {"region": "eu"}  # looked up by the kwargs' stored JSON
    assert [w["id"] for w in regional["work_ids"]] == [10, 11, 12]
    assert all(w["age_s"] is not None for w in regional["work_ids"])
    never = client.get(f"/api/jobs/runs/{home.failed_run}").json()["freshness"][0]
    assert [w["age_s"] for w in never["work_ids"]] == [None, None]
    bad = client.get(f"/api/jobs/runs/{home.failed_run}").json()["chunks"][0]
    chunk = client.get(f"/api/jobs/chunks/{bad['id']}").json()
    error = chunk["attempts"][-1]["error"]
    assert "Traceback" in error and "RuntimeError: asked to fail" in error
    html = client.get(f"/jobs/chunks/{bad['id']}").text
    assert "RuntimeError: asked to fail" in html and "data-tail=" in html
    attempt = chunk["attempts"][-1]["attempt"]
    log = client.get(f"/api/jobs/chunks/{bad['id']}/log/{attempt}").json()
    assert "working on [1, 2]" in log["text"] and log["next"] == log["size"]
    rest = client.get(f"/api/jobs/chunks/{bad['id']}/log/{attempt}?offset={log['next']}").json()
    assert rest["text"] == "" and rest["next"] == log["next"]
    assert client.get(f"/api/jobs/runs/{bad['id']}").json()["error"].endswith("not a run")
    assert "no run or chunk 999999" in client.get("/api/jobs/chunks/999999").json()["error"]


def _metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r"([a-z_:]+)(?:\{(.*)\})? (\S+)", line)
        assert m, line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def test_metrics_are_prometheus_text_with_ids_in_labels(client: TestClient, home: Home) -> None:
    answer = client.get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = _metrics(answer.text)
    lag = {
        dict(labels)["partition"]: v
        for (name, labels), v in samples.items()
        if name == "riverbed_group_lag" and ("group", "readers") in labels
    }
    assert sum(lag.values()) == home.records - home.committed and len(lag) == 3
    assert samples[("riverbed_job_chunks", frozenset({("state", "FAILED")}))] == 1
    ends = [v for (n, labels), v in samples.items() if n == "riverbed_topic_end_offset"]
    assert sum(ends) == home.records
    assert not any("clicks" in name or "readers" in name for name, _ in samples)


def test_a_token_guards_every_page_and_is_kept_in_a_cookie(console: Console) -> None:
    with TestClient(create_app(console, token="s3cret", sample=False)) as c:
        assert c.get("/").status_code == 401
        assert "needs its token" in c.get("/api/topics").text
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        opened = c.get("/topics?token=s3cret&x=1", follow_redirects=False)
        assert opened.status_code == 303 and opened.headers["location"] == "/topics?x=1"
        assert "httponly" in opened.headers["set-cookie"].lower()
        assert c.get("/topics").status_code == 200  # the cookie from now on


def test_actions_are_refused_read_only_and_without_csrf(console: Console, home: Home) -> None:
    with TestClient(create_app(console, sample=False)) as c:
        refused = c.post(f"/actions/jobs/{home.queued_run}/cancel", data={"csrf": "x"})
        assert refused.status_code == 403 and "--allow-actions" in refused.json()["error"]
        assert 'action="/actions/' not in c.get("/jobs").text  # no buttons when read-only
        assert c.get(f"/actions/jobs/{home.queued_run}/cancel").status_code == 405
    app = create_app(console, allow_actions=True, jobs_dir=home.config.jobs_dir, sample=False)
    with TestClient(app) as c:
        no_csrf = c.post(f"/actions/jobs/{home.queued_run}/cancel", data={"csrf": "forged"})
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.json()["error"]
        assert c.get(f"/api/jobs/runs/{home.queued_run}").json()["run"]["state"] == "MASTER"
        page = c.get("/jobs").text
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token
        done = c.post(
            f"/actions/jobs/{home.queued_run}/cancel",
            data={"csrf": token.group(1), "back": "/jobs"},
            follow_redirects=False,
        )
        assert done.status_code == 303 and done.headers["location"] == "/jobs"
        assert c.get(f"/api/jobs/runs/{home.queued_run}").json()["run"]["state"] == "CANCELED"
        before = {r["id"] for r in c.get("/api/jobs").json()["runs"]}
        again = c.post(
            f"/actions/jobs/{home.failed_run}/rerun",
            data={"csrf": token.group(1)},
            headers={"Accept": "application/json"},
        )
        assert again.status_code == 200 and again.json()["message"].startswith("rerun of")
        new = {r["id"] for r in c.get("/api/jobs").json()["runs"]} - before
        assert len(new) == 1
        rerun = c.get(f"/api/jobs/runs/{new.pop()}").json()
        assert rerun["run"]["job"] == "hourly" and rerun["chunks"][0]["work_ids"] == [1, 2]
        # a stopped group's offsets move; a running group's are refused, with the reason
        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/groups/readers").text)
        assert csrf and 'action="/actions/groups/readers/reset"' in c.get("/groups/readers").text
        moved = c.post(
            "/actions/groups/readers/reset",
            data={"csrf": csrf.group(1), "to": "latest"},
            headers={"Accept": "application/json"},
        )
        assert moved.status_code == 200 and "readers reset" in moved.json()["message"]
        assert c.get("/api/groups/readers").json()["lag"] == 0
        running = c.post(
            "/actions/groups/watchers/reset", data={"csrf": csrf.group(1), "to": "earliest"}
        )
        assert running.status_code == 400 and "1 live member(s)" in running.json()["error"]


def test_no_template_or_own_asset_reaches_another_origin() -> None:
    """The console works offline: nothing it serves points at another origin."""
    external = re.compile(
        r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//"""
    )
    own = [
        *(UI / "templates").glob("*.html"),
        UI / "static" / "console.js",
        UI / "static" / "console.css",
    ]
    assert len(own) > 10
    for path in own:
        assert not external.search(path.read_text()), path
        assert "http://" not in path.read_text() and "https://" not in path.read_text(), path
    for vendored in (UI / "static" / "vendor").glob("*.js"):
        text = vendored.read_text()
        assert not re.search(r"""import\s*\(\s*["']https?:|fetch\(\s*["']https?:""", text)
    licences = sorted(p.name for p in (UI / "static" / "vendor").glob("*LICENSE*"))
    assert licences == ["htmx-LICENSE.txt", "uPlot-LICENSE.txt"]


def test_unknown_pages_and_ids_say_so(client: TestClient) -> None:
    assert client.get("/nope").status_code == 404
    assert "no aggregation 'nope'" in client.get("/api/streams/nope").json()["error"]
    assert "no state namespace 'nope'" in client.get("/api/state/nope/keys").json()["error"]


def test_cli_refuses_a_public_bind_without_a_token_and_names_a_taken_port(home: Home) -> None:
    import socket

    out = run_cli("ui", "--host", "0.0.0.0", "--port", "0", env=home.env, timeout=60)
    assert out.returncode == 1
    assert "refusing to serve the console on 0.0.0.0 without a token" in out.stderr
    assert "Traceback" not in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli("ui", "--port", str(port), env=home.env, timeout=60)
    assert out.returncode == 1
    assert f"cannot serve the console on 127.0.0.1:{port}" in out.stderr
    assert "pick another --port" in out.stderr


def test_status_cli_prints_the_overview(home: Home) -> None:
    import json

    out = run_cli("status", "--json", env=home.env, timeout=60)
    assert out.returncode == 0, out.stderr
    o = json.loads(out.stdout)
    assert o["failed_chunks"] == 1 and o["worst_lag"]["name"] == "watchers"
    text = run_cli("status", env=home.env, timeout=60)
    assert f"worst lag: {home.records} (group watchers" in text.stdout


def test_cli_json_commands_print_what_the_pages_show(client: TestClient, home: Home) -> None:
    import json

    control = json.loads(run_cli("control", "status", "--json", env=home.env).stdout)
    page = client.get("/api/control").json()
    assert [e["name"] for e in control["elections"]] == [e["name"] for e in page["elections"]]
    assert [lock["name"] for lock in control["locks"]] == ["nightly-compaction"]
    group = json.loads(run_cli("group", "describe", "readers", "--json", env=home.env).stdout)
    assert group == client.get("/api/groups/readers").json()


def test_jobs_page_shows_live_workers_and_their_slots(client: TestClient, home: Home) -> None:
    import subprocess
    import sys
    import time

    worker = subprocess.Popen(  # takes no python chunks: the queued run stays queued
        [sys.executable, "-m", "riverbed.cli.main", "worker", "--concurrency", "3",
         "--kinds", "spark", "--ttl", "5"],
        env=home.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        live: list[dict[str, object]] = []
        while not live and time.monotonic() < deadline:
            live = [w for w in client.get("/api/jobs").json()["workers"] if w["live"]]
            time.sleep(0.2)
        assert [(w["slots"], w["chunks"], w["kinds"]) for w in live] == [(3, [], ["spark"])]
        assert f"{live[0]['worker']} · 0/3" in client.get("/jobs").text
    finally:
        worker.terminate()
        worker.wait(30)


def test_a_checkpoint_from_before_manifests_says_so_on_its_page(
    client: TestClient, home: Home
) -> None:
    """Batch records but no manifest (a checkpoint an older riverbed wrote): the page
    and its JSON say what to do, not a server error."""
    import shutil

    from riverbed.stream.batchlog import BatchRecord, open_batches
    from riverbed.stream.layout import local_path

    root = local_path(home.config.checkpoints_url) / "oldie"
    open_batches(str(root)).put(0, BatchRecord(done=True, input=3))
    try:
        page = client.get("/streams/oldie")
        assert page.status_code == 200, page.text[-2000:]
        assert "written before manifests" in page.text
        assert "written before manifests" in client.get("/api/streams/oldie").json()["error"]
    finally:
        shutil.rmtree(root)
