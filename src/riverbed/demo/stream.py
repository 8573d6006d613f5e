"""``riverbed demo``: hourly unique users per feature flag, exactly-once through a crash.

1. generate a synthetic clickstream into a riverbed topic: skewed flags, repeat
   users, events arriving out of order, a few very late events, into a typed topic
   (Arrow columns); a few malformed ones are refused by the producer, naming the
   field, and go to a dead-letter topic;
2. run the streaming aggregation as a separate driver process (``riverbed stream
   run``) and SIGKILL it — Spark driver JVM included — part-way through;
3. restart it: it resumes from its checkpoint;
4. compute the same answer independently with pandas over the same events and compare:
   exact distinct counts must be identical, HLL within its error bound; late and
   malformed events are accounted for in their topics.

With ``--durable s3`` the checkpoints, state and results are in a bucket — the tests'
S3 server (a Ceph RGW on loopback) unless ``AWS_ENDPOINT_URL`` names one — and after the
SIGKILL the driver's whole machine directory (its local state, everything on its disk)
is deleted: the restarted driver runs in a fresh directory and finds everything in the
bucket. The log (the source, as Kafka would be) and the control plane (as etcd would
be) live outside the machine, as they would in production.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import riverbed.log
from riverbed.config import Config, child_environment
from riverbed.log.errors import RecordRejectedError
from riverbed.processes import SessionStillAliveError, kill_session
from riverbed.stream.batchlog import open_batches
from riverbed.stream.errors import StreamError
from riverbed.stream.layout import output_url
from riverbed.stream.specjob import batch_line

console = Console(highlight=False)
T0 = datetime(2026, 11, 20, tzinfo=UTC)

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Tumbling

source = {"topic": "clicks", "schema": "user_id long, flag string, ts timestamp"}
aggregation = Aggregation(
    name="flags_hourly", key="flag", time="ts", window=Tumbling("1h"), watermark="15m",
    metrics={
        "users": Distinct("user_id"),
        "users_hll": Distinct("user_id", mode="hll"),
        "events": Count(),
    },
    state_partitions=4,
)
"""


def generate(n: int, flags: int, users: int, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    minutes = np.sort(rng.integers(0, 24 * 60, n))
    jitter = rng.integers(-120, 120, n)  # out of order by up to 2 minutes
    ts = T0 + pd.to_timedelta(minutes * 60 + np.clip(minutes * 60 + jitter, 0, None) % 60, unit="s")
    flag = (rng.zipf(1.3, n) - 1) % flags  # a few flags carry most traffic
    user = (rng.pareto(1.5, n) * users / 10).astype(np.int64) % users  # repeat users
    events = pd.DataFrame({"user_id": user, "flag": [f"flag-{f:02d}" for f in flag], "ts": ts})
    late = rng.choice(n, size=max(1, n // 2000), replace=False)  # arrive hours behind
    order = np.arange(n, dtype=float)
    order[late] += n * 0.5  # delivered much later than their event time
    return events.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)


TOPIC_SCHEMA = "user_id long, flag string, ts timestamp"


def run_demo_stream(
    config: Config,
    events: int = 200_000,
    seed: int = 7,
    durable: str = "file",
    master: str | None = None,
) -> int:
    """The demo (see the module doc); ``durable``: ``file`` (checkpoints on this disk)
    or ``s3`` (in a bucket, and the driver's machine directory deleted after the kill);
    ``master``: the drivers' Spark (``sc://…``: they are Spark Connect clients)."""
    home = config.home.resolve() / "demo"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    if durable == "s3":
        from riverbed.testing.s3 import demo_bucket

        with demo_bucket(home, console.print) as checkpoints:
            return _run(home, events, seed, checkpoints, master)
    return _run(home, events, seed, master=master)


def _run(
    home: Path,
    events: int,
    seed: int,
    checkpoints: str | None = None,
    master: str | None = None,
) -> int:
    env = child_environment(
        {"RIVERBED_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        | dict.fromkeys(
            ("RIVERBED_LOG", "RIVERBED_CHECKPOINTS", "RIVERBED_CONFIG", "RIVERBED_CONTROL")
        )
    )
    if checkpoints is not None:
        # the driver's machine is its own directory; the source and the control plane
        # are other machines' (Kafka's and etcd's, in production)
        env |= {  # the bucket's settings are in this environment already (demo_bucket)
            "RIVERBED_HOME": str(home / "machine-a"),
            "RIVERBED_CHECKPOINTS": checkpoints,
            "RIVERBED_LOG": f"file://{home / 'log'}",
            "RIVERBED_CONTROL": f"sqlite:///{home / 'control-plane' / 'control.db'}",
        }
        (home / "control-plane").mkdir()
    spec_path = home / "flags_hourly.py"
    spec_path.write_text(SPEC)
    console.rule("[bold]riverbed demo: hourly unique users per feature flag")
    console.print(f"working in {home}")
    if master is not None:
        console.print(f"drivers use the Spark at {master}")
    if checkpoints is not None:
        console.print(f"checkpoints, state and results in {checkpoints}")
    console.print()

    data = generate(events, flags=50, users=events // 4, seed=seed)
    log = riverbed.log.open(home / "log")
    # a typed topic: values stored as Arrow columns, checked by the producer
    log.create_topic("clicks", 4, schema=TOPIC_SCHEMA)
    producer = log.producer("clicks")
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("producing clicks", total=len(data))
        for start in range(0, len(data), 5_000):
            chunk = data.iloc[start : start + 5_000]
            producer.send_batch(
                [
                    {"user_id": int(u), "flag": f, "ts": t}
                    for u, f, t in chunk.itertuples(index=False)
                ],
                key_field="flag",
            )
            progress.update(task, advance=len(chunk))
    bad: list[dict[str, object]] = [
        {"user_id": 1, "flag": "flag-01", "ts": "yesterday"},
        {"user_id": "x", "flag": "flag-03", "ts": T0.isoformat()},
        {"user_id": 2, "flga": "flag-02"},
    ]
    log.create_topic("clicks.rejected", 1)  # untyped: it keeps whatever was refused
    rejected = log.producer("clicks.rejected")
    for value in bad:  # refused at the door, each with its reason: to a dead-letter topic
        try:
            producer.send(value, key=str(value.get("flag")))
        except RecordRejectedError as exc:
            what = f"field '{exc.field}'" if exc.field else "the record"
            console.print(f"  [yellow]refused[/yellow] {what} {exc.reason} → clicks.rejected")
            rejected.send(value, headers={"error": str(exc).encode()})
    log.close()
    console.print(
        f"{len(data):,} events ({data['flag'].nunique()} flags, "
        f"{data['user_id'].nunique():,} users, 24 h) into typed topic clicks "
        f"({TOPIC_SCHEMA})\n{len(bad)} malformed records refused → clicks.rejected\n"
    )

    command = [
        sys.executable,
        "-m",
        "riverbed.cli.main",
        "stream",
        "run",
        str(spec_path),
        "--once",
        "--max-records-per-batch",
        str(max(1, events // 10)),
        "--ttl",  # the restarted driver waits out the killed one's lease: keep it short
        "4",
        *(["--master", master] if master else []),
    ]
    checkpoint: str | Path = (
        f"{checkpoints}/flags_hourly" if checkpoints else home / "checkpoints" / "flags_hourly"
    )
    console.print(
        "[bold]1.[/bold] starting the streaming query (a separate driver process): 4 tasks "
        "a batch, each reading one log partition straight into its state partition — in "
        "the driver's own threads while batches are this small (Spark starts for bigger "
        "ones), as Spark tasks on a cluster"
    )
    # The driver's own lines come through a pipe (its Spark noise goes to a log file,
    # see riverbed.cli._quiet): relayed here, so the demo knows which batches it printed.
    driver = subprocess.Popen(
        command, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    printed: set[int] = set()
    three = threading.Event()
    relay = threading.Thread(target=_relay, args=(driver, printed, three), daemon=True)
    relay.start()
    three.wait(timeout=600)  # the driver reported three finished batches
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its Spark JVM, no goodbye
        driver.wait()
        _wait_for_session_to_end(driver.pid)
        relay.join(timeout=10)
        batches = open_batches(checkpoint)
        records = {b: r for b in batches.ids() if (r := batches.get(b)) is not None}
        done = [b for b, r in records.items() if r.done]
        console.print(
            f"[bold red]2. SIGKILL[/bold red] the driver after {len(done)} committed batches "
            "(mid-stream, no clean shutdown)"
        )
        for batch_id in done:  # committed, but the driver died before reporting them
            if batch_id not in printed:
                console.print(
                    f"{batch_line(batch_id, records[batch_id])}  [dim](committed before the "
                    "kill; the driver died before printing it)[/dim]"
                )
        for batch_id in batches.ids():
            if batch_id not in done:
                console.print(
                    f"batch {batch_id}: in flight at the kill — planned, not committed; the "
                    "restarted driver runs it again exactly as planned"
                )
    else:
        relay.join(timeout=10)
        console.print("[yellow]the query finished before it could be killed[/yellow]")
    if checkpoints is not None:
        _lose_the_machine(home, checkpoints)
        env["RIVERBED_HOME"] = str(home / "machine-b")
        console.print(
            "[bold]3.[/bold] starting a driver on a fresh machine directory "
            f"({home / 'machine-b'}): it resumes from the bucket"
        )
    else:
        console.print("[bold]3.[/bold] restarting it: it resumes from the checkpoint")
    if subprocess.run(command, env=env, check=False, stderr=sys.stderr).returncode != 0:
        console.print("[red]the restarted query failed[/red]")
        return 1
    if checkpoints is not None:
        return _verdict(home, data, output_url(checkpoints, "flags_hourly"), checkpoints)
    return _verdict(home, data, home / "output" / "flags_hourly")


def _wait_for_session_to_end(sid: int) -> None:
    """Wait until no process of the killed driver's session is left: its Spark Python
    workers leave its process group, and until the last of them is gone they may still
    write to the machine directory the demo deletes next."""
    try:
        kill_session(sid)
    except SessionStillAliveError as exc:
        raise StreamError(f"the killed driver's {exc}") from None


def _lose_the_machine(home: Path, checkpoints: str) -> None:
    """Delete everything the killed driver had on its disk, and say what the bucket
    holds instead."""
    machine = home / "machine-a"
    local = sum(f.stat().st_size for f in machine.rglob("*") if f.is_file())
    shutil.rmtree(machine)
    console.print(
        f"[bold red]   deleted[/bold red] the driver's machine directory {machine} "
        f"({local / 1e6:.1f} MB: its local state, Spark's scratch) — every local state "
        "and checkpoint directory"
    )
    from riverbed.stream.layout import checkpoint_store

    kinds: dict[str, list[int]] = {}
    for info in checkpoint_store(checkpoints).list():
        parts = info.key.split("/")
        depth = 2 if parts[0] in ("output", "state") else 3
        kind = "/".join(parts[:depth]) + ("/" if len(parts) > depth else "")
        kinds.setdefault(kind, []).append(info.size)
    console.print(f"   the bucket {checkpoints} holds:")
    for kind, sizes in sorted(kinds.items()):
        console.print(f"     {kind:<36} {len(sizes):>5} objects {sum(sizes) / 1e6:>8.2f} MB")


def _relay(driver: subprocess.Popen[str], printed: set[int], three: threading.Event) -> None:
    """Print the driver's lines as they come; note each batch it reports."""
    assert driver.stderr is not None
    for line in driver.stderr:
        found = re.match(r"batch (\d+):", line)
        if found:
            printed.add(int(found[1]))
            if len(printed) >= 3:
                three.set()
        console.print(line.rstrip("\n"), markup=False, highlight=False)
    three.set()  # the driver ended


def compare(
    events: pd.DataFrame, late: set[tuple[Any, Any, Any]], results: pd.DataFrame
) -> tuple[pd.DataFrame, bool]:
    """The demo aggregation's results beside one pass of pandas over ``events`` (less
    the ``late`` ones, by (user_id, flag, ts)): per window and flag, exact distinct
    users and counts; and whether they are all equal."""
    on_time = events[
        [
            (u, f, t) not in late
            for u, f, t in events[["user_id", "flag", "ts"]].itertuples(index=False)
        ]
    ]
    oracle = (
        on_time.assign(window_start=on_time["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])
        .agg(users_oracle=("user_id", "nunique"), events_oracle=("user_id", "size"))
        .reset_index()
        .rename(columns={"flag": "key"})
    )
    merged = oracle.merge(results, on=["window_start", "key"], how="outer")
    equal = (merged["users"] == merged["users_oracle"]).all() and (
        merged["events"] == merged["events_oracle"]
    ).all()
    return merged, bool(equal)


def _verdict(
    home: Path, data: pd.DataFrame, output: str | Path, checkpoints: str | None = None
) -> int:
    from riverbed.stream.dataframe import read_results

    results = read_results(output)
    log = riverbed.log.open(home / "log")
    late = (
        pd.DataFrame([r.value for r in log.iter_records("flags_hourly.late", 0)])
        if "flags_hourly.late" in log.topics()
        else pd.DataFrame(columns=["user_id", "flag", "ts"])
    )
    dead = [
        record
        for topic in ("flags_hourly.dlq", "clicks.rejected")
        if topic in log.topics()
        for record in log.iter_records(topic, 0)
    ]
    late = late.drop_duplicates(["user_id", "flag", "ts"])  # side outputs are at-least-once
    late_keys = set(
        zip(late["user_id"], late["flag"], pd.to_datetime(late["ts"], utc=True), strict=True)
    )
    merged, exact_ok = compare(data, late_keys, results)
    rel = (merged["users_hll"] - merged["users_oracle"]).abs() / merged["users_oracle"]
    hll_ok = bool((rel <= 3 * 1.04 / 64).all())

    console.print(
        "\n[bold]4.[/bold] results vs pandas over the same events (busiest flag, first 6 hours):"
    )
    top = data["flag"].value_counts().index[0]
    table = Table()
    for column in ("hour (UTC)", "flag", "riverbed exact", "pandas", "riverbed HLL", "HLL error"):
        table.add_column(column, justify="right")
    for row in merged[merged["key"] == top].sort_values("window_start").head(6).itertuples():
        table.add_row(
            row.window_start.strftime("%m-%d %H:00"),
            row.key,
            str(row.users),
            str(row.users_oracle),
            str(row.users_hll),
            f"{abs(row.users_hll - row.users_oracle) / row.users_oracle:.2%}",
        )
    console.print(table)
    console.print(
        f"windows x flags compared: {len(merged):,}; events counted "
        f"{int(merged['events'].sum()):,} + late {len(late):,} + malformed "
        f"{len(dead)} = {int(merged['events'].sum()) + len(late) + len(dead):,} "
        f"of {len(data) + 3:,} produced"
    )
    console.print(
        f"exact distinct users: [bold]{'IDENTICAL' if exact_ok else 'DIFFERENT'}[/bold] "
        "to the independent answer"
    )
    console.print(
        f"HLL distinct users: [bold]{'WITHIN' if hll_ok else 'OUTSIDE'}[/bold] the "
        f"error bound (max {rel.max():.2%}, bound {3 * 1.04 / 64:.2%})"
    )
    console.rule("[bold green]done" if exact_ok and hll_ok else "[bold red]mismatch")
    if checkpoints is None:
        console.print(
            "Query it:  RIVERBED_HOME=" + str(home) + " riverbed query flags_hourly --key " + top
        )
        console.print(
            "Look at it: RIVERBED_HOME=" + str(home) + " riverbed ui   "
            "→ http://127.0.0.1:8077/streams/flags_hourly"
        )
    else:
        console.print(
            f"Query it (with the bucket's AWS_* settings): riverbed query flags_hourly "
            f"--checkpoints {checkpoints} --key {top}"
        )
    log.close()
    return 0 if exact_ok and hll_ok else 1
