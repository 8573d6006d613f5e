"""Entry point of the ``riverbed`` command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from riverbed import __version__
from riverbed.cli import alerts as alerts_cli
from riverbed.cli import chaos as chaos_cli
from riverbed.cli import control as control_cli
from riverbed.cli import jobs as jobs_cli
from riverbed.cli import log as log_cli
from riverbed.cli import setup as setup_cli
from riverbed.cli import state as state_cli
from riverbed.cli import stream as stream_cli
from riverbed.cli import timerange as timerange_cli
from riverbed.cli import ui as ui_cli
from riverbed.cli import workers as workers_cli
from riverbed.cli._common import UsageError
from riverbed.errors import InvalidValueError, RiverbedError

err = Console(stderr=True, highlight=False, soft_wrap=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="riverbed",
        description="Resilient, stateful stream aggregation and recurring data jobs on Spark.",
    )
    parser.add_argument("--version", action="version", version=f"riverbed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    control_cli.add_parser(sub)
    state_cli.add_parser(sub)
    log_cli.add_parsers(sub)
    stream_cli.add_parsers(sub)
    jobs_cli.add_parsers(sub)
    workers_cli.add_parsers(sub)
    timerange_cli.add_parsers(sub)
    ui_cli.add_parsers(sub)
    alerts_cli.add_parsers(sub)
    chaos_cli.add_parser(sub)
    setup_cli.add_parsers(sub)
    demo = sub.add_parser("demo", help="run the end-to-end demo on embedded defaults")
    demo.add_argument(
        "which",
        nargs="?",
        default="stream",
        choices=["stream", "control", "jobs", "timerange", "cluster"],
        help="stream (default): the streaming main job; control: the control-plane tour; "
        "jobs: a pipeline of recurring jobs through a worker and an orchestrator crash; "
        "timerange: a chunked time-range job through a driver SIGKILL, vs one pass; "
        "cluster: three test hosts (network namespaces; needs root), the aggregation on a "
        "Spark standalone cluster through losing a whole host and a partition",
    )
    demo.add_argument("--days", type=int, default=14, help="jobs demo: days of usage")
    demo.add_argument(
        "--hours", type=int, default=6, help="timerange demo: hours of readings (2 to 168)"
    )
    demo.add_argument(
        "--events", type=int, help="events to generate (stream: 200,000; cluster: 40,000)"
    )
    demo.add_argument("--workers", type=int, default=3, help="control tour: worker processes")
    demo.add_argument("--ttl", type=int, default=2, help="control tour: lease TTL seconds")
    demo.add_argument(
        "--durable",
        choices=["file", "s3"],
        default="file",
        help="stream and jobs demos: where checkpoints, state and results go — this disk "
        "(file), or a bucket (s3: the tests' S3 server on loopback unless AWS_ENDPOINT_URL "
        "names one), losing the killed driver's or worker's whole machine directory",
    )
    demo.add_argument(
        "--master",
        help="stream demo: the Spark its drivers use, e.g. sc://host:15002 (a Spark "
        "Connect server) or spark://host:7077 (default: local[*])",
    )
    demo.set_defaults(func=_demo, spark_noise="demo")
    return parser


def _demo(args: argparse.Namespace) -> int:
    from riverbed.config import load_config

    if args.master and args.which != "stream":
        raise UsageError(
            f"--master is for the stream demo; the {args.which} demo starts its own Spark "
            "(leave --master out)"
        )
    if args.durable != "file" and args.which not in ("stream", "jobs"):
        raise UsageError(
            f"--durable {args.durable} is for the stream and jobs demos; the {args.which} "
            "demo keeps its own layout (leave --durable out)"
        )
    if args.which == "control":
        from riverbed.demo.control import run_demo

        return run_demo(load_config(), workers=args.workers, ttl=args.ttl)
    if args.which == "jobs":
        from riverbed.demo.jobs import run_demo_jobs

        return run_demo_jobs(load_config(), days=args.days, durable=args.durable)
    if args.which == "timerange":
        from riverbed.demo.timerange import run_demo_timerange

        if not 2 <= args.hours <= 168:
            raise UsageError(
                f"--hours {args.hours}: the time-range demo needs 2 to 168 hours "
                "(it SIGKILLs its driver after 3 of the 30-minute chunks)"
            )
        return run_demo_timerange(load_config(), hours=args.hours)
    if args.which == "cluster":
        from riverbed.demo.cluster import run_cluster_demo

        return run_cluster_demo(load_config().home, events=args.events or 40_000)
    from riverbed.demo.stream import run_demo_stream

    return run_demo_stream(
        load_config(), events=args.events or 200_000, durable=args.durable, master=args.master
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is a command to run (``control lock NAME -- cmd ...``); split it
    # off first, since argparse cannot mix options and a trailing command in a subparser.
    trailing: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if trailing is not None:
        if not hasattr(args, "cmd"):
            parser.error("'--' is only understood by `riverbed control lock NAME -- COMMAND`")
        args.cmd = [*args.cmd, *trailing]
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # -v is riverbed's story, not a line per HTTP request to etcd or a webhook
    for library in ("httpx", "httpcore"):
        logging.getLogger(library).setLevel(logging.WARNING)
    # SIGTERM unwinds like Ctrl-C, so sessions revoke their leases on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    noisy = getattr(args, "spark_noise", None)
    if noisy == "demo":  # the control tour starts no Spark; the others do (or children do)
        noisy = None if args.which == "control" else f"demo-{args.which}"
    quiet: contextlib.AbstractContextManager[Path | None]
    if noisy:
        from riverbed.cli._quiet import noise_to_log
        from riverbed.config import load_config

        quiet = noise_to_log(load_config().home, noisy, args.verbose)
    else:
        quiet = contextlib.nullcontext(None)
    with quiet as logfile:
        return _call(args, logfile)


def _call(args: argparse.Namespace, logfile: Path | None) -> int:
    from rich.markup import escape  # a message's own brackets are text, not markup

    where = escape(f" (Spark's and Java's output: {logfile})") if logfile else ""
    try:
        code: int = args.func(args)
        return code
    except InvalidValueError as exc:  # the caller's input: exit 2, as for argparse
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except RiverbedError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}{where}")
        return 1
    except ValueError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if logfile is None:
            raise
        # a failure inside Spark: one line here, the whole trace in the log file
        from riverbed.stream.specjob import root_cause

        with open(logfile, "a", encoding="utf-8") as f:
            traceback.print_exception(exc, file=f)
        err.print(f"[red]error:[/red] {escape(f'{root_cause(exc)} (full trace: {logfile})')}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
