"""``riverbed worker``, ``riverbed orchestrator``, ``riverbed schedule``: the processes that
run jobs, and the schedules they fire (``riverbed jobs …``: :mod:`riverbed.cli.jobs`)."""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

from rich.table import Table

from riverbed.cli._common import Subcommands, UsageError, shared_options
from riverbed.cli.jobs import (
    CHECKPOINTS_OPTS,
    DIR_OPTS,
    JOBS_OPTS,
    JSON_OPTS,
    _dispatch,
    _Env,
    _ids,
    _print_json,
    _ts,
    out,
)
from riverbed.locations import shown


def add_parsers(sub: Any) -> None:
    w = sub.add_parser("worker", help="run chunks from the jobs queue until stopped")
    shared_options(w, JOBS_OPTS, DIR_OPTS, CHECKPOINTS_OPTS)
    w.add_argument("--concurrency", type=int, default=1, help="chunks at once (default 1)")
    w.add_argument("--kinds", default="python,spark", help="job kinds to take (python,spark)")
    w.add_argument("--ttl", type=int, default=10, help="registry lease TTL seconds")
    w.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="chunks claimed ahead while chunks run under a second (default 0: never)",
    )
    w.set_defaults(func=_worker)

    o = sub.add_parser("orchestrator", help="campaign and, when elected, groom the queue")
    shared_options(o, JOBS_OPTS, DIR_OPTS, CHECKPOINTS_OPTS)
    o.add_argument("--ttl", type=int, default=10, help="election lease TTL seconds")
    o.add_argument("--name", help="this orchestrator's name (default host-pid)")
    o.set_defaults(func=_orchestrator)

    s = sub.add_parser("schedule", help="schedules (cron or every) found in the job specs")
    sc = Subcommands(
        s.add_subparsers(dest="schedule_command", metavar="COMMAND", required=True),
        shared_options(s, JOBS_OPTS, DIR_OPTS, JSON_OPTS),
    )
    c = sc.add_parser("list", help="schedules, their last and next fire")
    c.set_defaults(run=_schedule_list)
    s.set_defaults(func=_dispatch)


def _schedule_list(env: _Env, args: argparse.Namespace) -> int:
    from riverbed.jobs.cron import next_fire

    stored = {r["job"]: r for r in env.queue.schedules()}
    jobs, errors = env.catalog.load_all()
    now = env.queue.now()
    rows = []
    for loaded in jobs:
        for sched in loaded.spec.schedules:
            key = sched.key(loaded.name)
            last = stored.get(key, {}).get("last_fire")
            rows.append(
                {
                    "job": loaded.name,
                    "schedule": key,
                    "name": sched.name,
                    "cron": sched.trigger,  # a cron expression, or "@every <duration>"
                    "kwargs": dict(sched.kwargs),
                    "work_ids": None if sched.work_ids is None else list(sched.work_ids),
                    "last_fire": last,
                    "next_fire": next_fire(sched.trigger, now),
                    "stored": key in stored,
                }
            )
    if args.json:
        _print_json({"schedules": rows, "errors": [str(e) for e in errors]})
        return 0
    table = Table(title="schedules (UTC)")
    for col in ("job", "schedule", "when", "kwargs", "work ids", "last fire", "next fire"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["job"],
            r["name"] or "",
            r["cron"],
            json.dumps(r["kwargs"]) if r["kwargs"] else "",
            _ids(r["work_ids"]) if r["work_ids"] is not None else "select_work",
            _ts(r["last_fire"]),
            _ts(r["next_fire"]),
        )
    out.print(table)
    for e in errors:
        out.print(f"[red]not loaded:[/red] {e}")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from riverbed.jobs.worker import Worker

    env = _Env(args)
    cp = env.control()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    bad = set(kinds) - {"python", "spark"}
    if bad:
        raise UsageError(f"--kinds takes python and/or spark, not {', '.join(sorted(bad))}")
    worker = Worker(
        env.queue,
        cp,
        env.jobs_dir,
        env.config.home,
        concurrency=args.concurrency,
        kinds=kinds,
        ttl=args.ttl,
        prefetch=args.prefetch,
        spark_master=env.config.spark.master,
        checkpoints=env.checkpoints,
        config=env.config,
    )
    stop = threading.Event()
    try:
        out.print(
            f"worker on {shown(env.db_url)} (jobs in {env.jobs_dir}, concurrency "
            f"{args.concurrency}); Ctrl-C to stop"
        )
        worker.run(stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        cp.close()
        env.close()
    return 0


def _orchestrator(args: argparse.Namespace) -> int:
    from riverbed.jobs.orchestrator import Orchestrator

    env = _Env(args)
    cp = env.control()
    orch = Orchestrator(
        env.queue,
        cp,
        env.catalog,
        env.config.home,
        name=args.name,
        ttl=args.ttl,
        checkpoints=env.checkpoints,
    )
    try:
        out.print(f"orchestrator {orch.name} campaigning on {shown(env.config.control_url)}")
        orch.run()
    except KeyboardInterrupt:
        pass
    finally:
        cp.close()
        env.close()
    return 0
