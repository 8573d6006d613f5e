"""``riverbed jobs …`` as a user runs it: plans, development runs, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from riverbed.storage import open_store, storage_environment
from tests.cli import run_cli

SEED_JOBS = {
    "A": 'Job(main=main, chunk_size=3, dependencies=[Dependency("B", max_lag="1h"), '
    'Dependency("C", max_lag="1h")])',
    "B": 'Job(main=main, chunk_size=2, dependencies=[Dependency("E", max_lag="1h")])',
    "C": 'Job(main=main, chunk_size=6, dependencies=[Dependency("D", max_lag="1h")])',
    "D": "Job(main=main, chunk_size=6)",
    "E": "Job(main=main, chunk_size=6)",
}

MODULE = """from riverbed.jobs import Dependency, Job

def main(ctx, work_ids, **kwargs):
    ctx.output.write_json("ids.json", work_ids)
    if kwargs.get("fail"):
        raise RuntimeError("asked to fail")

job = {spec}
"""


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name, spec in SEED_JOBS.items():
        (jobs / f"{name}.py").write_text(MODULE.format(spec=spec))
    return {
        **subprocess_env,
        "RIVERBED_HOME": str(tmp_path / "home"),
        "RIVERBED_JOBS_DIR": str(jobs),
        "RIVERBED_JOBS_DB": f"sqlite:///{tmp_path / 'jobs.db'}",
        "RIVERBED_CONTROL": f"sqlite:///{tmp_path / 'control.db'}",
    }


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env)


def test_plan_prints_the_seeds_queue_table_after_c_ran(env: dict[str, str]) -> None:
    assert run(env, "jobs", "run", "C", "--work-ids", "1-6").returncode == 0
    out = run(env, "jobs", "plan", "A", "--work-ids", "1-6", "--json")
    assert out.returncode == 0, out.stderr
    rows = [
        (r["id"], r["job"], r["status"], r["work_ids"], r["dependencies"])
        for r in json.loads(out.stdout)["rows"]
    ]
    assert rows == [
        (0, "A", "MASTER", [1, 2, 3, 4, 5, 6], [1, 2]),
        (1, "A", "QUEUED", [1, 2, 3], [3, 4]),
        (2, "A", "QUEUED", [4, 5, 6], [4, 5]),
        (3, "B", "QUEUED", [1, 2], [6]),
        (4, "B", "QUEUED", [3, 4], [6]),
        (5, "B", "QUEUED", [5, 6], [6]),
        (6, "E", "QUEUED", [1, 2, 3, 4, 5, 6], []),
    ]
    table = run(env, "jobs", "plan", "A", "--work-ids", "1-6")
    assert "pruned C 1..6: fresh within max_lag" in table.stdout


def test_run_executes_the_graph_here_and_show_lists_it(env: dict[str, str], tmp_path: Path) -> None:
    out = run(env, "jobs", "run", "A", "--work-ids", "1-6", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["state"] == "DONE"
    shown = json.loads(run(env, "jobs", "show", str(result["run"]), "--json").stdout)
    assert sorted(g["job"] for g in shown["graph"]) == ["A", "A", "B", "B", "B", "C", "D", "E"]
    assert {g["state"] for g in shown["graph"]} == {"DONE"}
    outputs = sorted((tmp_path / "home" / "jobs" / "output" / "A").glob("chunk=*/ids.json"))
    assert [json.loads(p.read_text()) for p in outputs] == [[1, 2, 3], [4, 5, 6]]
    (first,) = [g for g in shown["graph"] if g["job"] == "A" and g["work_ids"] == "[1, 2, 3]"]
    chunk = json.loads(run(env, "jobs", "show", str(first["id"]), "--json").stdout)
    assert chunk["output"]["attempt"] == 1
    assert [json.loads(Path(f).read_text()) for f in chunk["output"]["files"]] == [[1, 2, 3]]
    fresh = json.loads(run(env, "jobs", "freshness", "B", "--json").stdout)
    assert fresh[0]["work_ids"] == 6
    listed = json.loads(run(env, "jobs", "list", "--state", "done", "--json").stdout)
    assert [r["id"] for r in listed] == [result["run"]]


@pytest.mark.s3
def test_with_checkpoints_in_a_bucket_outputs_go_there_and_show_names_them(
    env: dict[str, str], tmp_path: Path, s3_url: str
) -> None:
    env = {**env, **storage_environment()}
    out = run(env, "jobs", "run", "A", "--work-ids", "1-6", "--checkpoints", s3_url, "--json")
    assert out.returncode == 0, out.stderr
    graph = json.loads(
        run(env, "jobs", "show", str(json.loads(out.stdout)["run"]), "--json").stdout
    )
    assert {g["state"] for g in graph["graph"]} == {"DONE"}  # A read B's and C's outputs
    assert not (tmp_path / "home" / "jobs" / "output").exists()
    (first,) = [g for g in graph["graph"] if g["job"] == "A" and g["work_ids"] == "[1, 2, 3]"]
    shown = run(env, "jobs", "show", str(first["id"]), "--checkpoints", s3_url)
    url = f"{s3_url}/jobs/output/A/.attempts/chunk={first['id']}-1/ids.json"
    assert f"output of attempt 1:\n    {url}" in shown.stdout
    store = open_store(f"{s3_url}/jobs/output")
    assert json.loads(store.get(url.removeprefix(store.url + "/"))) == [1, 2, 3]
    for secret in (env["AWS_SECRET_ACCESS_KEY"], env["AWS_ACCESS_KEY_ID"]):
        assert secret not in shown.stdout + shown.stderr + out.stdout + out.stderr
    without = run(env, "jobs", "show", str(first["id"]))  # the setting says where to look
    assert "output: none published" in without.stdout


def test_a_failing_chunk_shows_its_traceback_and_the_run_fails(env: dict[str, str]) -> None:
    out = run(env, "jobs", "run", "D", "--kwarg", "fail=true")
    assert out.returncode == 1
    assert "RuntimeError: asked to fail" in out.stdout
    runs = json.loads(run(env, "jobs", "list", "--chunks", "--json").stdout)
    chunk = json.loads(run(env, "jobs", "show", str(runs[0]["id"]), "--json").stdout)
    assert chunk["state"] == "FAILED"
    assert "RuntimeError: asked to fail" in chunk["attempts"][0]["error"]
    rerun = json.loads(run(env, "jobs", "rerun", str(chunk["id"]), "--json").stdout)
    again = json.loads(run(env, "jobs", "show", str(rerun["run"]), "--json").stdout)
    assert json.loads(again["kwargs"]) == {"fail": True} and again["parent"] == chunk["id"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "plan", "Z"], "no job 'Z'"),
        (["jobs", "plan", "A", "--work-ids", "1-x"], "is not a whole number or a range"),
        (["jobs", "plan", "A", "--kwarg", "oops"], "is not NAME=VALUE"),
        (["jobs", "show", "424242"], "no run or chunk 424242"),
        (["jobs", "plan", "A", "--db", "oracle://x"], "unsupported jobs database"),
        (["worker", "--kinds", "java"], "--kinds takes python and/or spark"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(
    env: dict[str, str], args: list[str], message: str
) -> None:
    out = run(env, *args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_broken_module_and_a_cycle_are_named(env: dict[str, str]) -> None:
    jobs = Path(env["RIVERBED_JOBS_DIR"])
    (jobs / "E.py").write_text("from riverbed.jobs import Job\n\nimport not_a_module\n")
    out = run(env, "jobs", "plan", "A")
    assert f"{jobs / 'E.py'}:3: job module 'E' failed to import: ModuleNotFoundError" in out.stderr
    (jobs / "E.py").write_text(MODULE.format(spec='Job(main=main, dependencies=[Dependency("A")])'))
    out = run(env, "jobs", "plan", "A")
    assert "A → B → E → A" in out.stderr and "Traceback" not in out.stderr


def test_a_code_change_makes_chunks_stale_and_submit_stale_reruns_only_those(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A job edited after its runs: ``jobs plan`` names every chunk whose last success ran
    the old source, ``--stale`` keeps what the new source already ran, and a dependency
    fresh within its max_lag runs again once its own source changed."""
    jobs = Path(env["RIVERBED_JOBS_DIR"])
    ran = tmp_path / "ran.log"
    module = (
        "from riverbed.jobs import Dependency, Job\n\n"
        "def main(ctx, work_ids, **kwargs):\n"
        f"    with open({str(ran)!r}, 'a') as f:\n"
        "        f.write(f'{{ctx.job}} v{version} {{work_ids}}\\n')\n\n"
        "job = {spec}\n"
    )

    def write(name: str, version: int, spec: str) -> None:
        (jobs / f"{name}.py").write_text(module.format(version=version, spec=spec))

    def ran_lines() -> list[str]:
        lines = ran.read_text().splitlines()
        ran.write_text("")
        return sorted(lines)

    top = 'Job(main=main, chunk_size=2, dependencies=[Dependency("base", max_lag="1h")])'
    write("top", 1, top)
    write("base", 1, "Job(main=main, chunk_size=6)")
    assert run(env, "jobs", "run", "top", "--work-ids", "1-6").returncode == 0
    assert ran_lines() == [
        "base v1 [1, 2, 3, 4, 5, 6]",
        "top v1 [1, 2]",
        "top v1 [3, 4]",
        "top v1 [5, 6]",
    ]

    def plan(*extra: str) -> dict[str, Any]:
        out = run(env, "jobs", "plan", "top", "--work-ids", "1-6", "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert [r["why"] for r in plan()["rows"][1:]] == ["submitted"] * 3  # base: fresh, same code
    nothing = plan("--stale")
    assert nothing["rows"][1:] == []
    assert [(p[1], p[2]) for p in nothing["pruned"]] == [
        ([1, 2], "kept: its last success ran this code"),
        ([3, 4], "kept: its last success ran this code"),
        ([5, 6], "kept: its last success ran this code"),
    ]

    write("top", 2, top)  # the user fixes the job
    table = run({**env, "COLUMNS": "250"}, "jobs", "plan", "top", "--work-ids", "1-6")
    assert table.stdout.count("code changed (src:") == 3, table.stdout
    assert "3 chunk(s) of top last ran other code" in table.stdout
    assert "jobs submit top --stale" in table.stdout
    # one chunk re-run by hand with the new code; --stale then runs the two others only
    assert run(env, "jobs", "run", "top", "--work-ids", "3-4").returncode == 0
    assert ran_lines() == ["top v2 [3, 4]"]
    (fresh,) = json.loads(run(env, "jobs", "freshness", "top", "--json").stdout)
    assert sorted(fresh["code_versions"].values()) == [2, 4]  # 3-4 on v2, the rest on v1
    stale = plan("--stale")
    assert [(r["work_ids"], r["why"].split(" (")[0]) for r in stale["rows"][1:]] == [
        ([1, 2], "code changed"),
        ([5, 6], "code changed"),
    ]
    out = run(env, "jobs", "run", "top", "--work-ids", "1-6", "--stale")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ran_lines() == ["top v2 [1, 2]", "top v2 [5, 6]"]
    assert plan("--stale")["rows"][1:] == []
    out = run(env, "jobs", "submit", "top", "--work-ids", "1-6", "--stale")
    assert "0 chunk(s) queued, 0 reused, 3 kept (their last success ran this code)" in out.stdout

    write("base", 2, "Job(main=main, chunk_size=6)")  # a dependency's code changed
    rows = plan()["rows"]
    (base,) = [r for r in rows if r["job"] == "base"]
    assert base["why"].startswith("code changed (src:")
    # work ids that never ran are stale too: with new ones, --stale runs only theirs
    stale = plan("--stale", "--work-ids", "1-8")
    assert [(r["job"], r["work_ids"], r["why"]) for r in stale["rows"][1:]] == [
        ("top", [7, 8], "work id 7 never succeeded"),
        ("base", [7, 8], "work id 7 never succeeded"),
    ]


@pytest.mark.mariadb
def test_on_mariadb_with_a_password_nothing_shows_it(
    env: dict[str, str], mariadb_server: Any, mariadb_db: str
) -> None:
    """A user's MariaDB jobs database behind a password: submit, a worker runs the
    graph, the runs list; a wrong password is one line naming the database. The
    password appears in no output, banner or error."""
    name = mariadb_db.rsplit("/", 1)[1]
    password = "pw-7Hq2xKe9"  # the secret the test looks for
    mariadb_server.execute(f"CREATE USER 'rb_{name}'@'%' IDENTIFIED BY '{password}'")
    mariadb_server.execute(f"GRANT ALL ON {name}.* TO 'rb_{name}'@'%'")
    url = f"mysql://rb_{name}:{password}@127.0.0.1:{mariadb_server.port}/{name}"
    env = {**env, "RIVERBED_JOBS_DB": url}
    seen = []
    wrong = run({**env, "RIVERBED_JOBS_DB": url.replace(password, "not-it")}, "jobs", "list")
    assert wrong.returncode == 1 and "Access denied" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    seen.append(wrong.stdout + wrong.stderr)
    submitted = run(env, "jobs", "--json", "submit", "D", "--work-ids", "1-12")
    assert submitted.returncode == 0, submitted.stderr
    master = json.loads(submitted.stdout)["run"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "riverbed.cli.main", "worker", "--concurrency", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        start = time.monotonic()
        waited = run(env, "jobs", "--json", "show", str(master))
        while json.loads(waited.stdout)["state"] != "DONE":
            assert time.monotonic() - start < 60, waited.stdout
            time.sleep(0.2)  # another process's progress: nothing to wait on here
            waited = run(env, "jobs", "--json", "show", str(master))
    finally:
        worker.terminate()
        banner, _ = worker.communicate(timeout=30)
    seen += [banner, submitted.stdout + submitted.stderr, waited.stdout]
    listed = run(env, "jobs", "list")
    assert listed.returncode == 0 and "DONE" in listed.stdout
    seen.append(listed.stdout + listed.stderr)
    assert "worker on mysql://127.0.0.1" in banner
    assert not [s for s in seen if password in s]


def test_a_jobs_chunks_are_published_to_its_table_too(env: dict[str, str], tmp_path: Path) -> None:
    """``Job(table="delta:…")``: each chunk's Parquet output is a partition of the table
    (``chunk`` = the chunk id), equal to the chunk's published files; a table spelled
    wrong is one line naming the spellings."""
    from deltalake import DeltaTable

    jobs = Path(env["RIVERBED_JOBS_DIR"])
    lake = tmp_path / "lake"
    (jobs / "T.py").write_text(
        "import pyarrow as pa\n"
        "from riverbed.jobs import Job\n\n"
        "def main(ctx, work_ids, **kwargs):\n"
        "    ctx.output.write_parquet('ids.parquet', pa.table({'id': work_ids}))\n\n"
        f"job = Job(main=main, chunk_size=2, table={f'delta:{lake}'!r})\n"
    )
    out = run(env, "jobs", "run", "T", "--work-ids", "1-6", "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(
        run(env, "jobs", "show", str(json.loads(out.stdout)["run"]), "--json").stdout
    )
    chunks = {g["id"]: json.loads(g["work_ids"]) for g in shown["graph"]}
    got = DeltaTable(str(lake)).to_pyarrow_table().to_pydict()
    assert sorted(zip(got["chunk"], got["id"], strict=True)) == sorted(
        (str(c), i) for c, ids in chunks.items() for i in ids
    )
    (jobs / "T.py").write_text((jobs / "T.py").read_text().replace("delta:", "deltalake:"))
    bad = run(env, "jobs", "run", "T", "--work-ids", "1-2")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "write delta:PATH" in bad.stderr, bad.stderr
