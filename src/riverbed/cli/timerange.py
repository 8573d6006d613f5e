"""``riverbed timerange run | status | reset`` — resumable chunked time-range jobs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

from rich.console import Console

from riverbed.cli._common import (
    CHECKPOINTS_HELP,
    Subcommands,
    config_of,
    positive_int,
    shared_options,
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JSON_OPTS = ("--json", {"action": "store_true", "help": "machine-readable output"})
CONTROL_OPTS = ("--control", {"help": "control plane URL; default RIVERBED_CONTROL"})
CHECKPOINTS_OPTS = (
    "--checkpoints",
    {"help": CHECKPOINTS_HELP + " (a time-range job's output, unless its spec names one)"},
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "timerange",
        help="long aggregations on Spark in resumable chunks: run, status, reset",
        description="A spec file holds `job = TimeRangeJob(...)`; see docs/timerange.md.",
    )
    common = shared_options(p, JSON_OPTS, CONTROL_OPTS, CHECKPOINTS_OPTS)
    cmds = Subcommands(
        p.add_subparsers(dest="timerange_command", metavar="COMMAND", required=True), common
    )
    c = cmds.add_parser("run", help="compute [from, to) chunk by chunk (resumes what is done)")
    c.add_argument("spec", help="path of the spec file (.py)")
    c.add_argument("--from", dest="start", required=True, help="e.g. 2026-01-01 or …T05:00Z")
    c.add_argument("--to", dest="end", required=True, help="end of the half-open range")
    c.add_argument("--chunk", help="chunk size, e.g. 1h (default: the spec's)")
    c.add_argument(
        "--rerun", action="store_true", help="recompute done chunks in the range (late data)"
    )
    c.add_argument(
        "--batch",
        type=positive_int,
        help="chunks one Spark query computes (default: what 1/16 of the driver's heap holds "
        "at the size of the chunks before, at most 24); each chunk is still published on its "
        "own — 1 publishes each as soon as it is done",
    )
    c.add_argument("--ttl", type=int, default=10, help="driver lease TTL seconds (failover)")
    c.add_argument("--master", help="Spark master (default from riverbed.toml / local[*])")
    c.set_defaults(run=_run, spark_noise="timerange-run")
    c = cmds.add_parser("status", help="chunks done, rows, throughput, ETA, last error")
    c.add_argument("spec")
    c.set_defaults(run=_status)
    c = cmds.add_parser("reset", help="forget the job's progress (and with --output, its files)")
    c.add_argument("spec")
    c.add_argument(
        "--output", action="store_true", help="also delete the output folder (and drop its tables)"
    )
    c.set_defaults(run=_reset)
    p.set_defaults(func=lambda args: args.run(args))


def _control(args: argparse.Namespace) -> Any:
    from riverbed.control import connect

    return connect(getattr(args, "control", None) or config_of(args).control_url)


def _spec(args: argparse.Namespace) -> Any:
    from riverbed.jobs.timerange import load_spec

    config = config_of(args)
    spec = load_spec(args.spec, config.checkpoints, config.log_url)
    if getattr(args, "chunk", None):
        from riverbed.timerange.errors import SpecError

        try:  # the spec validates its chunk when it is built
            job = replace(spec.job, chunk=args.chunk)
        except SpecError as exc:
            raise SpecError(f"--chunk {args.chunk}: {exc}") from None
        spec = replace(spec, job=job)
    return spec


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def _run(args: argparse.Namespace) -> int:
    from riverbed.jobs.timerange import Driver, Event, format_time
    from riverbed.spark import session

    spec = _spec(args)
    config = config_of(args)
    spark_config = replace(config.spark, master=args.master) if args.master else config.spark
    began = time.monotonic()
    rows = 0
    bar: Any = None
    task: Any = None
    tty = sys.stderr.isatty() and not args.json

    def on_event(event: Event) -> None:
        nonlocal rows, bar, task
        if event.kind == "chunk" and event.record is not None:
            rows += event.record.rows
        if args.json:
            return
        if event.kind == "standby":
            err.print(
                f"standby: driver {json.loads(event.detail['leader'])['driver']} is "
                "running this job; waiting to take over"
            )
        elif event.kind == "leader":
            err.print(
                f"driving [bold]{spec.name}[/bold] (term {event.detail['term']}); "
                f"output in {spec.job.output}"
            )
        elif event.kind == "planned" and event.progress is not None:
            p = event.progress
            err.print(
                f"{p.done}/{p.total} chunks done from {format_time(p.origin)} to "
                f"{format_time(p.target)}"
            )
            if tty:
                from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

                bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total} chunks"),
                    TimeRemainingColumn(),
                    console=err,
                    transient=True,
                )
                bar.start()
                task = bar.add_task(spec.name, total=p.total, completed=p.done)
        elif event.kind == "chunk" and event.record is not None and event.progress is not None:
            r = event.record
            if bar is not None:
                bar.update(task, completed=event.progress.done)
            else:
                err.print(
                    f"chunk {format_time(r.start)}: {r.rows:,} rows in {r.seconds:.1f}s "
                    f"({event.progress.done}/{event.progress.total})"
                )
        elif event.kind == "nothing":
            err.print("nothing to do: every chunk in the range is done (--rerun recomputes)")

    spark_holder: list[Any] = []

    def spark() -> Any:
        spark_holder.append(session(spark_config))
        return spark_holder[-1]

    driver = Driver(spec, _control(args), spark, ttl=args.ttl, batch=args.batch, on_event=on_event)
    try:
        progress = driver.run(args.start, args.end, rerun=args.rerun)
    finally:
        if bar is not None:
            bar.stop()
        for s in spark_holder:
            s.stop()
    elapsed = time.monotonic() - began
    summary = {
        "job": spec.name,
        "done_to": format_time(progress.done_to),
        "chunks_done": progress.done,
        "chunks_total": progress.total,
        "rows": rows,
        "seconds": round(elapsed, 2),
        "output": spec.job.output,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        err.print(
            f"done: {progress.done}/{progress.total} chunks, {rows:,} rows this run in "
            f"{_duration(elapsed)}; output in {spec.job.output}"
        )
    return 0


def _status(args: argparse.Namespace) -> int:
    from riverbed.timerange.driver import status

    info = status(_control(args), _spec(args))
    if args.json:
        print(json.dumps(info))
        return 0
    if info["origin"] is None:
        out.print(f"{info['job']}: never run (riverbed timerange run {args.spec} --from … --to …)")
        return 0
    rate = info["rows_per_second"]
    out.print(f"[bold]{info['job']}[/bold]  output {info['output']}")
    out.print(f"  range     {info['origin']} → {info['target']} in {info['chunk']} chunks")
    out.print(
        f"  chunks    {info['chunks_done']} / {info['chunks_total']} done "
        f"(through {info['done_to']})"
    )
    out.print(f"  rows      {info['rows']:,}" + (f"  ({rate:,.0f} rows/s)" if rate else ""))
    out.print(f"  eta       {_duration(info['eta_seconds'])}")
    out.print(f"  driver    {info['driver'] or 'none running'}")
    if info["rerun"]:
        out.print(f"  rerun     {info['rerun'][0]} → {info['rerun'][1]} in progress")
    if info["last_error"]:
        e = info["last_error"]
        from rich.markup import escape

        said = escape(f"{e['error']} (driver {e['driver']})")
        out.print(f"  [red]last error[/red] {said}")
    return 0


def _reset(args: argparse.Namespace) -> int:
    from riverbed.jobs.timerange import Output
    from riverbed.timerange.driver import reset

    spec = _spec(args)
    removed = reset(_control(args), spec)
    if args.output:
        Output(spec.job.output).remove()
        from riverbed.tables import partition_table

        for text in spec.job.tables.values():
            partition_table(text, spec.name).drop()
    if args.json:
        print(
            json.dumps({"job": spec.name, "keys_removed": removed, "output_removed": args.output})
        )
    else:
        out.print(
            f"{spec.name}: progress forgotten ({removed} records)"
            + (
                f", {spec.job.output} deleted"
                + (f" and {len(spec.job.tables)} table(s) dropped" if spec.job.tables else "")
                if args.output
                else f"; its output stays in {spec.job.output}"
            )
        )
    return 0
