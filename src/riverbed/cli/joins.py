"""``riverbed stream run`` of a spec file that defines ``join = Join(...)``: a
stream-stream join (:mod:`riverbed.stream.joinquery`) run by one active driver — or
``select = Select(...)``, which runs as a one-sided join."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from riverbed.config import Config


def run_join(args: argparse.Namespace, config: Config, join: Any, say: Any) -> int:
    """``stream run`` of a spec file that defines ``join = Join(...)``: one active
    driver per join (the control plane's lease, as an aggregation's; a second one
    stands by), every write fenced by its term."""
    from dataclasses import replace

    from riverbed.spark.lazy import deferred, start_now, stop
    from riverbed.stream.fencing import DriverFencedError
    from riverbed.stream.joinquery import batch_line, start_join
    from riverbed.stream.leader import DriverLease
    from riverbed.stream.specjob import StreamFailedError, locations, root_cause

    checkpoint, output, state = locations(config, join.name)
    state = replace(state, retain_versions=args.retain_versions, snapshot_every=args.snapshot_every)
    lease = DriverLease(args.control or config.control_url, join.name, checkpoint, args.ttl)
    try:
        if args.no_standby:
            lease.acquire(standby=False)
        spark_config = replace(config.spark, master=args.master) if args.master else config.spark
        # started when a batch first needs it, or before a standby's wait (warm for the
        # takeover): as an aggregation's (riverbed.spark.lazy, cli/stream.py)
        spark = deferred(spark_config)

        def standing_by(text: str) -> None:
            say(text)
            start_now(spark)

        if lease.term is None:
            lease.acquire(on_standby=standing_by)
        say(lease.describe())
        rows = "rows" if join.select is not None else "joined rows"
        say(f"running {join.noun} [bold]{join.name}[/bold]: {rows} in {output}")
        query = start_join(
            spark,
            join,
            checkpoint=checkpoint,
            output=output,
            state=state,
            log_url=config.log_url,
            trigger={"availableNow": True} if args.once else {"processingTime": "1 second"},
            term=lease.term,
            max_records=args.max_records_per_batch,
            spec=Path(args.spec).resolve(),
        )
        shown = -1  # the newest batch reported
        try:
            while query.isActive:
                query.wait(0.5)
                for done in query.recentProgress:
                    record = query.batches.get(done["batchId"])
                    if done["batchId"] > shown and record is not None:
                        say(batch_line(done["batchId"], record, join.select is not None))
                        shown = done["batchId"]
                if not lease.still_leading():
                    query.stop()
                    raise DriverFencedError(
                        f"this driver lost the lead of {join.noun} '{join.name}' (its lease "
                        "expired: "
                        "was it paused or cut off from the control plane?); it stopped, and "
                        "the active driver carries on from the checkpoint"
                    )
            failed = query.exception()
            if failed is not None:
                raise StreamFailedError(f"{join.noun} {join.name!r} stopped: {root_cause(failed)}")
        finally:
            if query.isActive:
                query.stop()
    finally:
        lease.close()
    stop(spark)  # (a deferred session never started: nothing to stop)
    return 0


def join_status(args: argparse.Namespace, config: Config, join: Any) -> int:
    """``stream status join.py``: the join's totals and watermark, and each side's
    topic, newest event time, lag and held events (``--json``: as one object); a
    Select's totals, rows and its source's lag."""
    import json

    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)
    from riverbed.stream.joinquery import status
    from riverbed.stream.specjob import locations

    checkpoint, _, state = locations(config, join.name)
    info = status(join, checkpoint, state, config.log_url)
    if args.json:
        print(json.dumps(info))
        return 0
    select = join.select is not None
    if select:  # one stream, no partner, no watermark, nothing held
        shown = [("select", "join"), ("rows", "joined")] + [
            (k, k) for k in ("batches", "input_records", "malformed", "filtered")
        ]
    else:
        shown = [(k, k) for k in ("join", "batches", "input_records", "joined", "unmatched",
                                  "late", "malformed", "filtered")]  # fmt: skip
    for label, key in shown:
        out.print(f"{label:>14}: {info[key]}")
    if not select:
        out.print(f"{'watermark':>14}: {info['watermark'] or '-'}")
    for which, side in info["sides"].items():
        if "table" in side:  # a lookup join's right side
            out.print(f"{which:>14}: table {side['table']}, read {side['read_at'] or '-'}")
            continue
        out.print(
            f"{'source' if select else which:>14}: topic {side['topic']}, newest event "
            f"{side['newest_event'] or '-'}, "
            f"lag {side['lag'] if side['lag'] is not None else '-'} records"
            + ("" if select else f", {side['held']} events held")
            + (f" (lag unknown: {side['lag_error']})" if side.get("lag_error") else "")
        )
    return 0


def join_query(args: argparse.Namespace, config: Config, name: str) -> int:
    """``riverbed query`` of a join: every joined row so far, each once (``--json``: a
    JSON object a line); ``--key`` keeps the rows of those join keys."""
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from riverbed.cli._common import print_json_rows
    from riverbed.errors import ConfigError
    from riverbed.stream.joinquery import read_joined
    from riverbed.stream.specjob import locations

    for given, flag in ((args.window, "--window"), (args.from_state, "--from-state")):
        if given:
            raise ConfigError(
                f"{flag} reads an aggregation's windows; '{name}' is a join — its rows are "
                "read whole (filter them with --key, or read the table with any Parquet reader)"
            )
    _, output, _ = locations(config, name)
    frame = read_joined(output)
    if frame.empty:
        raise ConfigError(f"no joined rows for join '{name}' in {output}; run it first")
    if args.key:
        key = frame.columns[1] if frame.columns[0] == "window_start" else frame.columns[0]
        frame = frame[frame[key].astype(str).isin(args.key)]
    if args.json:
        print_json_rows(frame)
        return 0
    table = Table(title=f"{name} ({len(frame)} rows)")
    columns = [c for c in frame.columns if c != "batch_id"]
    for column in columns:
        table.add_column(column)
    for row in frame[columns].itertuples(index=False):
        table.add_row(
            *(
                ""
                if v is None or v is pd.NA or v != v  # (None, NA, NaN, NaT: no value)
                else v.strftime("%Y-%m-%d %H:%M:%S")
                if hasattr(v, "strftime")
                else str(v)
                for v in row
            )
        )
    Console(highlight=False, soft_wrap=True).print(table)
    return 0
