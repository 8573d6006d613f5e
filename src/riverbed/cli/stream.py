"""``riverbed stream run|status`` and ``riverbed query``."""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from riverbed.cli._common import CHECKPOINTS_HELP, config_of, positive_int, print_json_rows
from riverbed.cli._progress import Backlog, backlog_of
from riverbed.cli._quiet import WARNED
from riverbed.cli.changes import STAMP, _job, _new_version
from riverbed.cli.changes import add_parsers as add_change_parsers
from riverbed.errors import ConfigError

if TYPE_CHECKING:
    from riverbed.stream.leader import DriverLease

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def add_parsers(sub: Any) -> None:
    stream = sub.add_parser("stream", help="run a streaming aggregation from a spec file")
    cmds = stream.add_subparsers(dest="stream_command", metavar="COMMAND", required=True)
    c = cmds.add_parser("run", help="run SPEC.py (until stopped, or --once for the backlog)")
    c.add_argument("spec")
    c.add_argument("--once", action="store_true", help="process what is there, then stop")
    c.add_argument("--max-records-per-batch", type=int, help="bound each micro-batch")
    c.add_argument("--master", help="Spark master (default: RIVERBED_SPARK_MASTER or local[*])")
    c.add_argument(
        "--sql",
        help="also upsert results into a table: sqlite:///x.db or "
        "postgresql://user@host/db (table = the aggregation's name)",
    )
    c.add_argument(
        "--topic",
        help="also append each batch's results to this topic: a riverbed topic (in the log), "
        "or kafka://BOOTSTRAP/TOPIC (a Kafka transaction per batch)",
    )
    c.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="TABLE",
        help="also commit each batch's results to a lakehouse table, upserted by window and "
        "key: delta:PATH (a directory, file:///path or s3://bucket/prefix) or "
        "iceberg:sqlite:///catalog.db#namespace.table; repeatable",
    )
    c.add_argument(
        "--no-standby",
        action="store_true",
        help="if another driver runs this aggregation, fail instead of standing by",
    )
    c.add_argument(
        "--ttl",
        type=int,
        default=10,
        help="driver lease TTL in seconds: how soon a standby takes over (default 10)",
    )
    c.add_argument("--control", help="control plane URL (default: RIVERBED_CONTROL, else sqlite)")
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.add_argument(
        "--retain-versions",
        type=positive_int,
        default=100,
        help="retention: batches whose state and records stay loadable; older changelogs, "
        "snapshots and batch records are deleted (default 100)",
    )
    c.add_argument(
        "--snapshot-every",
        type=positive_int,
        default=10,
        help="batches between state snapshots, and between retention passes (default 10)",
    )
    c.add_argument(
        "--timestamps",
        action="store_true",
        help="start each line with the time: for a driver's log kept by a service manager",
    )
    c.add_argument(
        "--from-savepoint",
        metavar="[AGG:]NAME",
        help="start from a savepoint (`stream savepoint`): of this aggregation (a rollback) "
        "or of AGG (a fork under this spec's name); the source is read again from its cut",
    )
    c.add_argument(
        "--new-version",
        action="store_true",
        help="compute the changed spec as a new version from the oldest records the source "
        "holds, beside the running one, and switch readers to it once it has caught up",
    )
    c.set_defaults(func=_run, spark_noise="stream-run")
    add_change_parsers(cmds)  # plan, versions, savepoint(s): riverbed.cli.changes
    c = cmds.add_parser("status", help="batches, input, late, malformed, lag, state size")
    c.add_argument("spec", help="the aggregation's name, or its spec file")
    c.add_argument("--json", action="store_true")
    c.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    c.set_defaults(func=_status)

    query = sub.add_parser("query", help="read an aggregation's results, or a join's rows")
    query.add_argument("name", help="aggregation or join name (or its spec file)")
    query.add_argument("--checkpoints", help=CHECKPOINTS_HELP)
    query.add_argument("--key", action="append", help="only these keys")
    query.add_argument("--window", help="only windows starting at this time (ISO, UTC)")
    query.add_argument(
        "--from-state",
        action="store_true",
        help="answer live from the state store (needs the spec file), not the result table",
    )
    query.add_argument(
        "--batch", type=int, help="with --from-state: as of the end of this batch id"
    )
    query.add_argument("--json", action="store_true")
    query.set_defaults(func=_query)


def _sayer(timestamps: bool) -> Any:
    """How ``stream run`` tells its progress: as is, or after the wall-clock time."""
    if not timestamps:
        return err.print

    def say(text: str) -> None:
        err.print(f"{time.strftime(STAMP)} {text}")

    # riverbed's warnings on the terminal (the lease watch's, say) as well
    for handler in logging.getLogger("riverbed").handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {WARNED}", STAMP))
    return say


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from rich.markup import escape

    from riverbed.control.errors import SessionLostError
    from riverbed.spark.lazy import deferred, ended, revived, start_now, stop
    from riverbed.stream.batchlog import BatchRecord
    from riverbed.stream.fencing import DriverFencedError
    from riverbed.stream.layout import checkpoints_location
    from riverbed.stream.leader import DriverLease
    from riverbed.stream.plan import ends_of
    from riverbed.stream.sparklog import read_ends
    from riverbed.stream.specjob import batch_line, log_options, resume_line, run
    from riverbed.stream.specrecord import check
    from riverbed.stream.versions import replaced, try_switch
    from riverbed.stream.warmup import warm_up_in_background

    say = _sayer(args.timestamps)
    config = config_of(args)
    from riverbed.stream.specsource import load_join

    join = load_join(args.spec)
    if join is not None:  # two streams joined (riverbed.stream.streamjoin)
        from riverbed.cli.joins import run_join

        return run_join(args, config, join, say)
    planned = None
    if args.new_version:
        if args.from_savepoint:
            raise ConfigError(
                "--new-version starts from the source's oldest records: drop "
                "--from-savepoint (or fork the savepoint under a new name)"
            )
        job, planned = _new_version(args.spec, config)
        say(planned.text())
    else:
        job = _job(args.spec, config)
    starting = None
    if args.from_savepoint:  # compared with the savepoint's spec, and said
        from riverbed.stream.savepoints import started_from
        from riverbed.stream.specjob import savepoint_of

        starting = savepoint_of(config, job, args.from_savepoint)
        savepoint = starting[1]
        at = started_from(job.checkpoint, savepoint)
        if at is not None:  # a restart of the same command line: once is enough
            say(
                f"{job.aggregation.name} started from savepoint {savepoint.name} of "
                f"{savepoint.aggregation} already (restore batch {at}): it runs on from "
                "its checkpoint (fork the savepoint under a new name to start from it again)"
            )
            starting = None
        else:
            say(
                f"starting from savepoint {savepoint.name} of {savepoint.aggregation} (batch "
                f"{savepoint.batch}): the source is read again from its cut"
            )
    # a change the state cannot carry is refused now; the others are said, then applied
    decided = check(
        job.checkpoint,
        job.aggregation,
        log_options(job),
        starting[1] if starting else None,
    )
    for change in decided.changed:
        say(f"spec changed since batch {decided.since_batch}: {change.short()} ({change.why})")
    if decided.backfilled and decided.replay is not None:
        say(" ".join(decided.replay.text().split()))
    job = replace(
        job,
        state=replace(
            job.state, retain_versions=args.retain_versions, snapshot_every=args.snapshot_every
        ),
    )

    def new_lease() -> DriverLease:
        return DriverLease(
            args.control or config.control_url, job.aggregation.name, job.checkpoint, args.ttl
        )

    lease = new_lease()
    try:
        if args.no_standby:
            lease.acquire(standby=False)  # fails now, before Spark starts, if one is active
        # Spark starts when a batch first needs it (riverbed.spark.lazy: a local master's
        # small batches run in this process, and a run of them never starts it), and
        # before a standby's wait: a standby takes over with its session warm
        spark_config = replace(config.spark, master=args.master) if args.master else config.spark
        spark = deferred(spark_config)
        if lease.term is None:

            def standing_by(text: str) -> None:
                say(text)
                start_now(spark)
                # a hot standby: its executors up and their Python workers started
                # while it waits, not when it takes over (riverbed.stream.warmup)
                # (its lines are plain text: an error's brackets are not markup)
                warm_up_in_background(spark, lambda line: say(escape(line)))

            try:
                lease.acquire(on_standby=standing_by)
            except SessionLostError:  # the control plane answered, then the lease ran out
                lease.close()
                say(RAN_OUT)
                lease = _stand_by_again(new_lease, say)
        say(lease.describe())
    except BaseException:
        lease.close()
        raise

    backlog = Backlog(backlog_of(job) if args.once else None, err)

    checkpoints = checkpoints_location(config.checkpoints_url)
    switched = planned is None or planned.is_current

    def switch_if_caught_up(record: BatchRecord | None) -> None:
        nonlocal switched
        if switched or planned is None:
            return
        mine = ends_of(record.slices) if record is not None and record.slices else None
        ruling = try_switch(checkpoints, planned, mine or read_ends(job.checkpoint)[0] or {})
        if ruling is None:
            return
        switched = True
        if ruling.number == planned.number:
            say(
                f"[green]version {planned.number} of {planned.name} is current now[/green]: "
                f"readers read {planned.aggregation} (it had caught up with version "
                f"{planned.current.number}, {planned.current.aggregation}, which stops)"
            )

    def progress(batch_id: int, record: BatchRecord) -> None:
        say(batch_line(batch_id, record))
        backlog.advance(record.counted("input"))
        switch_if_caught_up(record)

    def replaced_by() -> str | None:
        newer = replaced(checkpoints, job.aggregation.name)
        if newer is None:
            return None
        return (
            f"[yellow]{job.aggregation.name} was replaced: version {newer.number} of "
            f"{newer.name} ({newer.aggregation}) is current, so this driver stops (its "
            "checkpoint and results are kept)[/yellow]"
        )

    # a long-running driver that loses its lead stands by again (its Spark session
    # warm); a run of the backlog (--once), or one told not to stand by, ends instead
    rejoin = not (args.once or args.no_standby)
    try:
        while True:
            if ended(spark):  # (a standby's, while it waited: Spark's log says why)
                say(
                    "[yellow]this driver's Spark application had ended (its master removed "
                    "it: Spark's log says why): it starts a new one[/yellow]"
                )
                spark = revived(spark, spark_config)
            say(f"running [bold]{job.aggregation.name}[/bold]: results in {job.output}")
            resuming = resume_line(job)
            if resuming is not None:
                say(resuming)
            gone = replaced_by()
            if gone is not None:
                say(gone)
                break
            try:
                with backlog:
                    stopped = run(
                        spark,
                        job,
                        once=args.once,
                        max_records=args.max_records_per_batch,
                        sql=args.sql,
                        topic=args.topic,
                        tables=args.table,
                        on_progress=progress,
                        lease=lease,
                        from_savepoint=(starting[0], starting[1].name) if starting else None,
                        stop_when=replaced_by,
                    )
                if stopped is not None:
                    say(stopped)
                    break
                switch_if_caught_up(None)
                if not switched and planned is not None:
                    say(
                        f"[yellow]version {planned.number} of {planned.name} has not caught up "
                        f"with version {planned.current.number} yet (it has read less of the "
                        "source): run it again, or without --once, and it switches when it "
                        "has[/yellow]"
                    )
                break
            except DriverFencedError:
                if not rejoin:
                    raise
            lease.close()
            say(
                f"[yellow]this driver of {job.aggregation.name} lost its lead (term "
                f"{lease.term}): it wrote nothing more, and stands by again to take over "
                "when the active driver's lease ends[/yellow]"
            )
            start_now(spark)  # warm for the takeover: its first batch may be a backlog
            lease = _stand_by_again(new_lease, say)
            say(lease.describe())
    finally:
        lease.close()
    stop(spark)  # (a deferred session never started: nothing to stop)
    return 0


RAN_OUT = (
    "[yellow]this standby's lease ran out while it waited (was it paused, or cut off from "
    "the control plane?): it stands by again[/yellow]"
)
# how long a driver that lost its lead waits between tries while the control plane does
# not answer (a partition not healed yet): from the first to the most
REJOIN_WAIT_S = (1.0, 10.0)


def _stand_by_again(make: Callable[[], DriverLease], say: Callable[[str], None]) -> DriverLease:
    """Campaign again, as a standby, with a new lease — through a control plane that
    may not answer yet (the partition that cost the lead not healed): tried again,
    saying so, until it does."""
    from riverbed.control.errors import ControlError, SessionLostError

    wait, most = REJOIN_WAIT_S
    while True:
        lease = None
        try:
            lease = make()  # (it connects: unreachable is a ControlError too)
            lease.acquire(on_standby=say)
            return lease
        except SessionLostError:  # granted, then ran out while it waited
            if lease is not None:
                lease.close()
            say(RAN_OUT)
        except ControlError as exc:
            if lease is not None:
                lease.close()
            say(f"the control plane does not answer yet ({exc}); trying again in {wait:.0f}s")
        time.sleep(wait)
        wait = min(wait * 2, most)


def _status(args: argparse.Namespace) -> int:
    from riverbed.inspect import QueryError, Sources, stream
    from riverbed.stream.lookupparts import parted
    from riverbed.stream.specjob import status
    from riverbed.stream.versions import resolve

    config = config_of(args)
    if args.spec.endswith(".py"):
        from riverbed.stream.specsource import load_join

        join = load_join(args.spec)
        if join is not None:  # a stream-stream join: its sides' lag and held events
            from riverbed.cli.joins import join_status

            return join_status(args, config, join)
    job = _job(args.spec, config) if args.spec.endswith(".py") else None
    sources = Sources(config)
    # a name is read as its current version (riverbed.stream.versions); name a version
    # (<name>-v<N>) to see that one
    name = job.aggregation.name if job else resolve(sources.checkpoints, args.spec).aggregation
    try:  # what the console's stream page shows, once the aggregation has run
        info = stream(sources, name, ledger=10)
    except QueryError:
        if job is None:
            raise
        info = status(job)  # not run yet: zeros, and the topic's lag
    finally:
        sources.close()
    if args.json:
        print(json.dumps(info))
        return 0
    for key in (
        "aggregation",
        "batches",
        "input_records",
        "late",
        "malformed",
        "filtered",
        "unmatched",
        "input_rate",
        "watermark",
        "state_bytes",
    ):
        if key == "unmatched" and key not in info:  # only aggregations with lookups
            continue
        out.print(f"{key:>14}: {info.get(key, '-')}")
    version = info.get("version")
    if version:  # riverbed.stream.versions
        cur = version["current"]
        said = f"{version['version']} of {version['name']}, {version['state']}"
        if version["state"] == "catching up":
            said += f": {version['behind']:,} records behind version {cur['version']}"
        elif version["state"] == "replaced":
            said += f" by version {cur['version']} ({cur['aggregation']})"
        out.print(f"{'version':>14}: {said}")
    for at, snapshot in enumerate(info.get("lookups") or []):
        read = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snapshot["at_ms"] / 1000))
        in_parts = parted(str(snapshot["id"]))
        held = f" (in {in_parts} parts)" if in_parts else ""
        out.print(f"{f'lookup {at}':>14}: version {snapshot['id'][:12]}{held}, read {read}")
    state = info.get("state")
    if state:  # rescaled: which generation, since which state version
        moved = f" (generation {state['generation']}, since state version {state['from_version']})"
        out.print(
            f"{'state':>14}: {state['partitions']} partitions{moved if state['generation'] else ''}"
        )
    # per partition of the topic; over a join's rows, per topic of its sides
    lags = info.get("lag", {}).items()
    out.print(f"{'lag':>14}: " + ", ".join(f"{'p' if p.isdigit() else ''}{p}={n}" for p, n in lags))
    joined = info.get("join")
    if joined:  # the join it runs: what each side's state holds
        held = ", ".join(f"{s['topic']}={s['held']}" for s in joined.get("sides", {}).values())
        out.print(f"{'join':>14}: {joined.get('joined', 0)} rows joined, held {held}")
    upstream = info.get("upstream")
    while upstream:  # the aggregations it runs before it, in its driver: nearest first
        said = upstream.get("error") or (
            f"{upstream.get('aggregation')}: {upstream.get('batches', 0)} batches, "
            f"{upstream.get('input_records', 0)} records, {upstream.get('late', 0)} late, "
            f"watermark {upstream.get('watermark')}"
        )
        out.print(f"{'chained after':>14}: {said}")
        upstream = upstream.get("upstream")
    driver = info.get("driver")
    if driver:
        active = driver["active"] or "none (stopped)"
        out.print(f"{'driver':>14}: {active}, {driver['standbys']} standby")
    if info.get("error"):
        out.print(f"[red]{info['error']}[/red]")
    if info.get("last_batch_ms"):
        parts = ", ".join(f"{k} {v} ms" for k, v in info["last_batch_ms"].items())
        out.print(f"{'last batch':>14}: {parts}")
    return 0


def _joined_rows(args: argparse.Namespace, config: Any) -> int | None:
    """``riverbed query`` of a join (its spec file, or a name whose checkpoint is a
    join's): its joined rows; None for anything else."""
    from riverbed.stream.specjob import locations
    from riverbed.stream.specsource import load_join

    if args.name.endswith(".py"):
        join = load_join(args.name)
        if join is None:
            return None
        name = join.name
    else:
        from riverbed.stream.layout import JOIN, checkpoint_store

        name = args.name
        checkpoint, _, _ = locations(config, name)
        if checkpoint_store(checkpoint).head(JOIN) is None:
            return None
    from riverbed.cli.joins import join_query

    return join_query(args, config, name)


def _query(args: argparse.Namespace) -> int:
    import pandas as pd

    from riverbed.stream.dataframe import read_results
    from riverbed.stream.specjob import results_location

    config = config_of(args)
    name = args.name
    job = None
    joined = _joined_rows(args, config)
    if joined is not None:  # a stream-stream join's rows (riverbed.cli.joins)
        return joined
    if args.batch is not None and not args.from_state:
        raise ConfigError("--batch reads state as of a batch: add --from-state")
    if args.from_state:
        from riverbed.stream.dataframe import read_live

        if not name.endswith(".py"):
            raise ConfigError(
                "--from-state decodes the state with the aggregation's metrics: pass its "
                f"spec file (riverbed query {name}.py --from-state), not its name"
            )
        job = _job(name, config)
        name = job.aggregation.name
        frame = read_live(job.aggregation, job.state, args.batch, job.checkpoint)
    else:
        if name.endswith(".py"):
            name = _job(name, config).aggregation.name
        else:  # its current version's results (riverbed.stream.versions)
            from riverbed.stream.layout import checkpoints_location
            from riverbed.stream.versions import resolve

            name = resolve(checkpoints_location(config.checkpoints_url), name).aggregation
        root = results_location(config, name)
        frame = read_results(root)
        if frame.empty and "window_start" not in frame:
            raise ConfigError(f"no results for aggregation '{name}' in {root}; run it first")
    if args.key:
        frame = frame[frame["key"].isin(args.key)]
    if args.window:
        start = pd.Timestamp(args.window)
        start = start.tz_localize("UTC") if start.tzinfo is None else start
        frame = frame[frame["window_start"] == start]
    if args.json:
        print_json_rows(frame)
        return 0
    table = Table(title=f"{name} ({len(frame)} rows)")
    # a session's window_end is its own; a fixed window's is its start + size, left out
    sessions = frame.attrs.get("sessions") or (job is not None and job.aggregation.sessions)
    hidden = ("batch_id", "deleted") if sessions else ("window_end", "batch_id")
    columns = [c for c in frame.columns if c not in hidden]
    for column in columns:
        table.add_column(column)
    for row in frame[columns].itertuples(index=False):
        table.add_row(
            *(
                v.strftime("%Y-%m-%d %H:%M")
                if hasattr(v, "strftime")
                else f"{v:.4f}"
                if isinstance(v, float)
                else _cell(v)
                for v in row
            )
        )
    out.print(table)
    return 0


def _cell(value: object) -> str:
    """A result's value in the table: TopK's pairs as ``value:count, ...``."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(p, dict) and "count" in p for p in value):
        return ", ".join(f"{p['value']}:{p['count']}" for p in value)
    return str(value)
