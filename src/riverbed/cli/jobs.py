"""``riverbed jobs …``: plan, run, submit and look at runs (the processes that run them,
and schedules: :mod:`riverbed.cli.workers`)."""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from riverbed.cli._common import (
    CHECKPOINTS_HELP,
    Subcommands,
    UsageError,
    config_of,
    shared_options,
)
from riverbed.config import Config

out = Console(highlight=False, soft_wrap=True)

JOBS_OPTS = (
    "--db",
    {
        "help": "jobs database URL (sqlite:///…, postgresql://… or mysql://… for MariaDB); "
        "default RIVERBED_JOBS_DB"
    },
)
DIR_OPTS = ("--jobs-dir", {"help": "directory of job modules; default RIVERBED_JOBS_DIR or ./jobs"})
JSON_OPTS = ("--json", {"action": "store_true", "help": "machine-readable output"})
CHECKPOINTS_OPTS = (
    "--checkpoints",
    {"help": CHECKPOINTS_HELP + "; with a bucket, chunk outputs go to <checkpoints>/jobs/output"},
)


def _graph_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("job", help="the job to run (a module's name in the jobs directory)")
    c.add_argument("--work-ids", help="e.g. 1-100,205 (default: the job's select_work())")
    c.add_argument(
        "--kwarg",
        action="append",
        default=[],
        metavar="K=V",
        help="keyword argument for main (V is JSON, else a string); repeatable",
    )
    c.add_argument(
        "--stale",
        action="store_true",
        help="only the chunks the job's current code has not run: a work id that never "
        "succeeded, or whose last success ran another source of the job",
    )


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "jobs",
        help="recurring jobs: plan, run, submit, list, show, cancel, rerun, freshness",
        description="Jobs are modules in the jobs directory with a `job = Job(...)` spec.",
    )
    common = shared_options(p, JOBS_OPTS, DIR_OPTS, JSON_OPTS, CHECKPOINTS_OPTS)
    cmds = Subcommands(
        p.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True), common
    )

    c = cmds.add_parser("plan", help="print the resolved graph without queueing it")
    _graph_args(c)
    c.set_defaults(run=_plan)
    c = cmds.add_parser("run", help="resolve and run the whole graph here (development)")
    _graph_args(c)
    c.set_defaults(run=_run)
    c = cmds.add_parser("submit", help="resolve and queue a run for the workers")
    _graph_args(c)
    c.add_argument("--wait", action="store_true", help="wait until the run ends")
    c.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS")
    c.set_defaults(run=_submit)
    c = cmds.add_parser("list", help="runs (or --chunks), newest first")
    c.add_argument("--state", help="only this state (MASTER, DONE, FAILED, RUNNING, …)")
    c.add_argument("--chunks", action="store_true", help="list chunks instead of runs")
    c.add_argument("--limit", type=int, default=50)
    c.set_defaults(run=_list)
    c = cmds.add_parser("show", help="a run (its graph) or a chunk (its attempts and errors)")
    c.add_argument("id", type=int)
    c.set_defaults(run=_show)
    c = cmds.add_parser("cancel", help="cancel a run or a chunk (running code is stopped)")
    c.add_argument("id", type=int)
    c.set_defaults(run=_cancel)
    c = cmds.add_parser("rerun", help="run a run or chunk again with the same inputs")
    c.add_argument("id", type=int)
    c.set_defaults(run=_rerun)
    c = cmds.add_parser("freshness", help="when a job last succeeded, per kwargs")
    c.add_argument("job")
    c.set_defaults(run=_freshness)
    p.set_defaults(func=_dispatch)


# -- plumbing ---------------------------------------------------------------------------


class _Env:
    def __init__(self, args: argparse.Namespace) -> None:
        from riverbed.jobs import Catalog
        from riverbed.jobs.queue import JobQueue

        self.config: Config = config_of(args)
        if getattr(args, "checkpoints", None):  # the setting of this process's children too
            os.environ["RIVERBED_CHECKPOINTS"] = args.checkpoints
        self.args = args
        self.jobs_dir = Path(getattr(args, "jobs_dir", None) or self.config.jobs_dir)
        self.catalog = Catalog(self.jobs_dir)
        self.db_url = getattr(args, "db", None) or self.config.jobs_db_url
        self._queue: JobQueue | None = None

    @property
    def checkpoints(self) -> str | None:
        """The checkpoints setting, checked here before any process starts (a bucket
        puts job outputs there too: :func:`riverbed.jobs.outputs.open_publication`)."""
        from riverbed.locations import parse

        given = self.config.checkpoints
        if not given:
            return None
        parse(given)  # a location that cannot work is a ConfigError naming the fix
        return given

    @property
    def queue(self) -> Any:
        from riverbed.jobs.queue import JobQueue

        if self._queue is None:
            self._queue = JobQueue(self.db_url)
        return self._queue

    def control(self) -> Any:
        from riverbed.control import connect

        return connect(self.config.control_url)

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()


def _dispatch(args: argparse.Namespace) -> int:
    env = _Env(args)
    try:
        code: int = args.run(env, args)
        return code
    finally:
        env.close()


def _kwargs(items: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--kwarg {item!r} is not NAME=VALUE (e.g. --kwarg day=2026-11-21)")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    return kwargs


def _ts(value: float | None, short: bool = False) -> str:
    """UTC; ``short`` (for tables) drops the year."""
    if value is None:
        return ""
    return datetime.fromtimestamp(value, tz=UTC).strftime(
        "%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M:%S"
    )


def _ids(ids: list[int] | tuple[int, ...]) -> str:
    from riverbed.jobs.spec import format_work_ids  # here: `riverbed` starts without jobs

    return format_work_ids(ids)


def _print_json(value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


# -- commands -------------------------------------------------------------------------


def _resolved(fn: Any, env: _Env, args: argparse.Namespace) -> Any:
    """``runs.plan`` or ``runs.submit`` of the job, work ids, kwargs and --stale given."""
    return fn(
        env.catalog,
        env.queue,
        args.job,
        args.work_ids,
        _kwargs(args.kwarg),
        stale_only=args.stale,
    )


def _plan_rows(plan: Any) -> list[dict[str, Any]]:
    rows = [
        {
            "id": 0,
            "job": plan.job,
            "status": "MASTER",
            "kwargs": plan.kwargs,
            "work_ids": list(plan.work_ids),
            "dependencies": [i + 1 for i in plan.roots],
        }
    ]
    for c in plan.chunks:
        rows.append(
            {
                "id": c.index + 1,
                "job": c.job,
                "status": f"REUSE {c.reuse}" if c.reuse is not None else "QUEUED",
                "kwargs": c.kwargs,
                "work_ids": list(c.work_ids),
                "dependencies": [u + 1 for u in c.upstream],
                "why": c.why,
            }
        )
    return rows


def _plan(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.runs import plan

    result = _resolved(plan, env, args)
    rows = _plan_rows(result)
    if args.json:
        _print_json({"rows": rows, "pruned": [list(p) for p in result.pruned]})
        return 0
    table = Table(title=f"plan for {args.job} ({len(result.work_ids)} work ids)")
    for col in ("id", "job", "status", "kwargs", "work ids", "dependencies", "why"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["job"],
            r["status"],
            json.dumps(r["kwargs"]) if r["kwargs"] else "",
            _ids(r["work_ids"]),
            json.dumps(r["dependencies"]) if r["dependencies"] else "",
            r.get("why", ""),
        )
    out.print(table)
    for job, ids, why in result.pruned:
        out.print(f"pruned {job} {_ids(ids)}: {why}")
    changed = [c for c in result.chunks if c.job == args.job and "code changed" in c.why]
    if changed and not args.stale:
        out.print(
            f"{len(changed)} chunk(s) of {args.job} last ran other code; "
            f"`riverbed jobs submit {args.job} --stale` runs only the chunks its current "
            "code has not run"
        )
    return 0


def _submit(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.runs import submit

    master, plan = _resolved(submit, env, args)
    new = len(plan.new_chunks)
    reused = len(plan.chunks) - new
    if not args.wait:
        kept = sum(1 for p in plan.pruned if p[2].startswith("kept"))
        if args.json:
            _print_json({"run": master, "chunks": new, "reused": reused, "kept": kept})
        else:
            out.print(
                f"run {master}: {new} chunk(s) queued, {reused} reused"
                + (f", {kept} kept (their last success ran this code)" if args.stale else "")
            )
        return 0
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        row = env.queue.get(master)
        if row["state"] != "MASTER":
            break
        if deadline is not None and time.monotonic() > deadline:
            out.print(f"run {master} still running after {args.timeout}s")
            return 3
        time.sleep(0.2)
    if args.json:
        _print_json({"run": master, "state": row["state"], "error": row["error"]})
    else:
        out.print(f"run {master}: {row['state']}" + (f" ({row['error']})" if row["error"] else ""))
    return 0 if row["state"] == "DONE" else 1


def _run(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.queue import Claim
    from riverbed.jobs.runs import submit
    from riverbed.jobs.worker import run_here

    master, plan = _resolved(submit, env, args)
    if not args.json:
        out.print(f"run {master}: {len(plan.new_chunks)} chunk(s); running them here")

    def report(claim: Claim, outcome: str) -> None:
        if args.json:
            return
        first, _, rest = outcome.partition("\n")
        out.print(f"  chunk {claim.id} {claim.job} [{_ids(claim.work_ids)}] → {first}")
        if rest:
            out.print(rest.rstrip())

    cp = env.control()
    try:
        state = run_here(
            env.queue,
            cp,
            env.jobs_dir,
            env.config.home,
            master,
            report,
            spark_master=env.config.spark.master,
            checkpoints=env.checkpoints,
            config=env.config,
        )
    finally:
        cp.close()
    if args.json:
        _print_json({"run": master, "state": state})
    else:
        out.print(f"run {master}: {state}")
    return 0 if state == "DONE" else 1


def _list(env: _Env, args: argparse.Namespace) -> int:
    rows = (env.queue.chunks_in if args.chunks else env.queue.runs)(args.state, args.limit)
    if args.json:
        _print_json(rows)
        return 0
    table = Table(title="chunks" if args.chunks else "runs")
    for col in ("id", "job", "state", "work ids", "attempt", "created", "finished", "error"):
        table.add_column(col, no_wrap=col != "error")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["job"],
            r["state"],
            _ids(json.loads(r["work_ids"])),
            str(r["attempt"]) if r["kind"] != "master" else "",
            _ts(r["created_at"], short=True),
            _ts(r["finished_at"], short=True),
            (r["error"] or "").strip().splitlines()[-1][:60] if r["error"] else "",
        )
    out.print(table)
    return 0


def _show(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.outputs import open_publication

    row = env.queue.get(args.id)
    graph = env.queue.graph(args.id) if row["kind"] == "master" else []
    output: dict[str, Any] | None = None
    if row["kind"] != "master":  # what the chunk published, wherever it is
        pub = open_publication(env.config.home, env.checkpoints)
        attempt = pub.published_attempt(row["job"], row["id"])
        if attempt is not None:
            output = {"attempt": attempt, "files": pub.published_urls(row["job"], row["id"])}
    if args.json:
        _print_json({**row, "graph": graph, "output": output})
        return 0
    kind = "run" if row["kind"] == "master" else "chunk"
    out.print(f"[bold]{kind} {row['id']}[/bold] {row['job']} — {row['state']}")
    out.print(f"  kwargs {row['kwargs']}  work ids {_ids(json.loads(row['work_ids']))}")
    out.print(
        f"  code {row['code_version']}  created {_ts(row['created_at'])}"
        f"  finished {_ts(row['finished_at'])}"
    )
    if row["kind"] != "master":
        out.print(f"  upstream {row['upstream'] or '—'}  run {row['master']}")
        if output is None:
            out.print("  output: none published")
        else:
            out.print(f"  output of attempt {output['attempt']}:")
            for name in output["files"]:
                out.print(f"    {name}")
    if graph:
        table = Table(title="chunks")
        for col in ("id", "job", "state", "work ids", "attempt", "dependencies", "error"):
            table.add_column(col)
        for g in graph:
            err = (g["error"] or "").strip().splitlines()
            table.add_row(
                str(g["id"]),
                g["job"],
                g["state"],
                _ids(json.loads(g["work_ids"])),
                str(g["attempt"]),
                json.dumps(g["upstream"]) if g["upstream"] else "",
                err[-1][:60] if err else "",
            )
        out.print(table)
    for a in row["attempts"]:
        out.print(
            f"  attempt {a['attempt']} on {a['worker']} ({a['host']}): {a['state']} "
            f"{_ts(a['started_at'])} → {_ts(a['finished_at'])}"
        )
        if a["error"]:
            out.print("    " + a["error"].strip().replace("\n", "\n    "))
    return 0


def _cancel(env: _Env, args: argparse.Namespace) -> int:
    counts = env.queue.cancel(args.id)
    if args.json:
        _print_json({"id": args.id, **counts})
    else:
        out.print(
            f"{args.id}: {counts['waiting']} waiting chunk(s) cancelled, "
            f"{counts['running']} running chunk(s) being stopped"
        )
    return 0


def _rerun(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.runs import rerun

    master = rerun(env.catalog, env.queue, args.id)
    if args.json:
        _print_json({"rerun_of": args.id, "run": master})
    else:
        out.print(f"run {master}: reruns {args.id} with the same job, kwargs and work ids")
    return 0


def _freshness(env: _Env, args: argparse.Namespace) -> int:
    rows = env.queue.freshness(args.job)
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        out.print(f"job '{args.job}' has never succeeded")
        return 0
    table = Table(title=f"freshness of {args.job}")
    for col in ("kwargs", "work ids", "oldest success", "newest success", "age of oldest", "code"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["kwargs"],
            str(r["work_ids"]),
            _ts(r["oldest"], short=True),
            _ts(r["newest"], short=True),
            f"{r['now'] - r['oldest']:.1f}s",
            ", ".join(
                f"{code or 'not recorded'} ({n})" for code, n in sorted(r["code_versions"].items())
            ),
        )
    out.print(table)
    return 0
