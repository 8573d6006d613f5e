"""``riverbed stream plan|versions|savepoint|savepoints``: changing a running
aggregation (docs/stream.md, "Changing an aggregation") — and the spec-file jobs every
``stream`` command starts from (:func:`_job`: a spec's current version)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from riverbed.cli._common import CHECKPOINTS_HELP, config_of, positive_int
from riverbed.config import Config
from riverbed.errors import ConfigError

STAMP = "%Y-%m-%d %H:%M:%S"  # how `stream` commands print a time (riverbed.cli.stream too)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def add_parsers(cmds: Any) -> None:
    """The commands under ``riverbed stream`` that change, version or save a running
    aggregation."""
    c = cmds.add_parser(
        "savepoint",
        help="save the aggregation's newest committed batch as NAME: its state, offsets, "
        "spec and results, kept until deleted (`stream run --from-savepoint NAME`)",
    )
    c.add_argument("spec")
    c.add_argument("name")
    c.add_argument(
        "--delete", action="store_true", help="delete the savepoint (its state copy and rows)"
    )
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.set_defaults(func=_savepoint)
    c = cmds.add_parser("savepoints", help="the aggregation's savepoints")
    c.add_argument("spec")
    c.add_argument("--json", action="store_true")
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.set_defaults(func=_savepoints)
    c = cmds.add_parser(
        "plan",
        help="what `stream run SPEC` would do with a changed spec: kept, applied, or refused "
        "(writes nothing; exit 1 when run would refuse)",
    )
    c.add_argument("spec")
    c.add_argument("--json", action="store_true")
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.add_argument(
        "--new-version",
        action="store_true",
        help="what `stream run SPEC --new-version` would compute, beside the running version",
    )
    c.set_defaults(func=_plan)
    c = cmds.add_parser(
        "versions",
        help="an aggregation's versions (`stream run --new-version`): which is current, "
        "which replaced; --delete N deletes a replaced or abandoned one for good",
    )
    c.add_argument("spec", help="the aggregation's name, or its spec file")
    c.add_argument("--json", action="store_true")
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.add_argument(
        "--delete",
        type=positive_int,
        metavar="N",
        help="delete version N (not the current one, nor one a driver runs): its state, "
        "results and checkpoint",
    )
    c.set_defaults(func=_versions)


def _job(spec: str, config: Config, version: bool = True) -> Any:
    """The stream job of a spec file: of its aggregation's current version (a version
    switched in by ``stream run --new-version``), unless ``version`` is False (the
    aggregation under the spec's own name)."""
    from dataclasses import replace

    from riverbed.stream.layout import checkpoints_location
    from riverbed.stream.specjob import job_for
    from riverbed.stream.specsource import load_spec
    from riverbed.stream.versions import resolve

    aggregation, source = load_spec(spec)
    if version:
        now = resolve(checkpoints_location(config.checkpoints_url), aggregation.name)
        if now.aggregation != aggregation.name:
            aggregation = replace(aggregation, name=now.aggregation)
    return job_for(config, aggregation, source, spec=Path(spec))


def _new_version(spec: str, config: Config) -> tuple[Any, Any]:
    """The job of ``stream run SPEC --new-version``, and the version plan it runs."""
    from dataclasses import replace

    from riverbed.stream.layout import checkpoints_location
    from riverbed.stream.specjob import job_for
    from riverbed.stream.versions import plan_new_version

    base = _job(spec, config, version=False)
    planned = plan_new_version(checkpoints_location(config.checkpoints_url), base.aggregation)
    aggregation = replace(base.aggregation, name=planned.aggregation)
    return job_for(config, aggregation, base.source, spec=Path(spec)), planned


def _savepoint(args: argparse.Namespace) -> int:
    from riverbed.stream.savepoints import delete, take

    job = _job(args.spec, config_of(args))
    if args.delete:
        if delete(job.checkpoint, job.state, job.aggregation.name, args.name):
            out.print(f"savepoint {args.name} of {job.aggregation.name} deleted", markup=False)
            return 0
        out.print(f"{job.aggregation.name} has no savepoint {args.name!r}", markup=False)
        return 1
    taken = take(
        job.checkpoint,
        job.output,
        job.state,
        job.aggregation.name,
        job.aggregation.sessions,
        args.name,
        say=lambda text: out.print(text, markup=False),
    )
    out.print(
        f"start from it: riverbed stream run {args.spec} --from-savepoint {taken.name} "
        f"(a rollback), or another spec with --from-savepoint {taken.aggregation}:{taken.name} "
        "(a fork)",
        markup=False,
    )
    return 0


def _savepoints(args: argparse.Namespace) -> int:
    from riverbed.stream.savepoints import listed

    job = _job(args.spec, config_of(args))
    found = listed(job.checkpoint)
    if args.json:
        print(json.dumps([{k: v for k, v in s.to_json().items() if k != "shape"} for s in found]))
        return 0
    if not found:
        out.print(f"{job.aggregation.name} has no savepoints", markup=False)
    for s in found:
        out.print(s.line(), markup=False)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from riverbed.stream.specjob import log_options
    from riverbed.stream.specrecord import plan_start

    config = config_of(args)
    if args.new_version:
        job, planned = _new_version(args.spec, config)
        if args.json:
            print(json.dumps(planned.to_json()))
        else:
            out.print(planned.text(), markup=False)
        return 0
    job = _job(args.spec, config)
    decided = plan_start(job.checkpoint, job.aggregation, log_options(job))
    if args.json:
        print(json.dumps(decided.to_json()))
    else:
        out.print(decided.text(), markup=False)
    return 1 if decided.refused else 0


def _versions(args: argparse.Namespace) -> int:
    from riverbed.inspect import Sources, active_driver
    from riverbed.stream.aggregation import base_of, version_name
    from riverbed.stream.layout import checkpoints_location
    from riverbed.stream.specjob import locations
    from riverbed.stream.versions import delete, listed

    config = config_of(args)
    checkpoints = checkpoints_location(config.checkpoints_url)
    if args.spec.endswith(".py"):
        name = _job(args.spec, config, version=False).aggregation.name
    else:
        name = base_of(args.spec)[0]
    if args.delete is not None:
        doomed = version_name(name, args.delete)
        sources = Sources(config)
        try:
            running = active_driver(sources, doomed)
        finally:
            sources.close()
        if running is not None:
            raise ConfigError(
                f"a driver runs version {args.delete} ({doomed}) now: {running}; stop it, "
                "then delete the version"
            )
        _, output, state = locations(config, doomed)
        for line in delete(checkpoints, name, args.delete, output, state):
            err.print(f"deleted {line}")
        err.print(f"version {args.delete} of {name} ({doomed}) is deleted")
    rows = listed(checkpoints, name)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"versions of {name}")
    for column in ("version", "aggregation", "state", "switched in"):
        table.add_column(column)
    for row in rows:
        at = row["switched_at"]
        when = time.strftime(STAMP, time.gmtime(at)) + " UTC" if at else "—"
        table.add_row(str(row["version"]), row["aggregation"], row["state"], when)
    out.print(table)
    return 0
