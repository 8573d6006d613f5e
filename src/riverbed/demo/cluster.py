"""``riverbed demo cluster``: lose a whole host under a running aggregation, lose nothing.

1. a test bed of three hosts (``testbed``) and riverbed's cluster on it (``cluster``):
   etcd, ZooKeeper, a Spark standalone worker and a diskless log server on each host,
   the Spark master on h1 and a standby master on h2 (elected through ZooKeeper), S3
   at the gateway;
2. the flag aggregation of ``riverbed demo`` runs on the Spark cluster — active driver
   on h2, hot standby on h3 — with its checkpoints, state and results in the bucket,
   reading a diskless topic that a producer keeps writing through the log servers;
3. h2 is killed: every process (the active driver, a Spark worker and its executors, a
   log server, an etcd member) SIGKILLed, its disk deleted; the standby takes over;
4. h2 comes back empty (its servers again, its driver now the standby); then h3, the
   active driver's host, is cut off for 20 s: the driver stops writing by itself before
   its lease can expire (self-fencing), the standby on h2 takes over, and nothing the
   cut-off driver wrote becomes current; healed, it comes back as the standby;
5. h1, the active Spark master's host, is killed mid-stream (the master, a worker, a log
   server, an etcd and a ZooKeeper member): the standby master on h2 is elected and
   recovers the workers and the running application, the driver on h2 goes on with
   its executors on h2 and h3, and h1 comes back empty with its master as the standby;
6. when the producer is done and the stream has caught up, the results are compared
   with one pass of pandas over the topic as read back: every window and flag, exact
   distinct users and counts — IDENTICAL — and a timeline shows what failed when and
   how long each part took to recover.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

import riverbed.log
from riverbed.config import overlaid
from riverbed.demo.cluster_jobs import JobsOutcome, wait_while_moving
from riverbed.demo.cluster_jobs import wait_for as _wait
from riverbed.demo.stream import SPEC, TOPIC_SCHEMA, compare, generate
from riverbed.errors import RiverbedError
from riverbed.stream import warmup
from riverbed.stream.plan import ends_of
from riverbed.testing.cluster import BUCKET, Cluster
from riverbed.testing.testbed import TestBed

__all__ = ["Outcome", "run_cluster_demo", "run_cluster_scenario"]

NAME = "flags_hourly"
TTL = 6  # the drivers' lease: how soon the standby may take over (docs/cluster.md)


@dataclass
class Outcome:
    identical: bool = False
    complete: bool = False  # the topic holds every produced event exactly once
    windows: int = 0
    events: int = 0
    takeover_s: float | None = None  # kill → first batch committed by the new driver
    fenced_s: float | None = None  # cut → the cut-off driver stopped by itself
    partition_takeover_s: float | None = None  # cut → first batch by the standby
    partition_batches: int = 0  # batches the new driver committed until the heal
    fenced_ok: bool = False  # no batch of the cut-off driver's term after the takeover
    master_s: float | None = None  # the Spark master's host killed → the standby leads
    master_batch_s: float | None = None  # … → the first batch run wholly after the kill
    master_ok: bool = False  # the same application and the live workers on the new master
    master_detail: str = ""  # when not: what was where
    timeline: list[tuple[float, str]] = field(default_factory=list)
    jobs: JobsOutcome | None = None  # phase 2, the jobs pipeline


class _Clock:
    def __init__(self, console: Console) -> None:
        self.t0 = time.monotonic()
        self.console = console
        self.lines: list[tuple[float, str]] = []

    def __call__(self, text: str) -> float:
        now = time.monotonic() - self.t0
        self.lines.append((now, text))
        self.console.print(f"[dim]{now:6.1f}s[/dim] {text}")
        return now


class _Committed:
    """The aggregation's committed batches, as the demo watches them: a committed
    record never changes, so each is read from the bucket once (the demo asks four
    times a second, while the chaos goes on)."""

    def __init__(self, checkpoint: str) -> None:
        from riverbed.stream.batchlog import open_batches

        self.batches = open_batches(checkpoint)
        self.done: dict[int, Any] = {}

    def __call__(self) -> dict[int, Any]:
        for b in self.batches.ids():
            if b not in self.done and (r := self.batches.get(b)) is not None and r.done:
                self.done[b] = r
        return dict(self.done)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _said(bed: TestBed, host: str, since: int) -> str:
    """What ``host``'s driver printed past byte ``since`` of its log."""
    with open(bed.service(host, "driver").log, "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace")


def _printed(bed: TestBed, host: str, since: int, text: str) -> bool:
    """Whether ``host``'s driver printed ``text`` past byte ``since`` of its log."""
    return text in _said(bed, host, since)


def _warm(bed: TestBed, host: str, since: int) -> bool:
    """Whether ``host``'s standby driver said its executors are warm past byte ``since``
    of its log; what kept them cold, raised, when it said that instead (the scenario
    stops with the driver's reason, not after waiting for a line that will not come)."""
    said = _said(bed, host, since)
    if warmup.WARM in said:
        return True
    failed = next(
        (line for line in said.splitlines() if warmup.FAILED in line or warmup.ENDED in line), None
    )
    if failed is not None:
        raise RiverbedError(f"the standby driver on {host} stays cold: {failed.strip()}")
    return False


def run_cluster_demo(home: Path, events: int = 40_000) -> int:
    """``riverbed demo cluster``: the scenario under ``home`` (its test bed in
    ``home/testbed``, where ``riverbed chaos`` finds it); 0 when nothing was lost."""
    import shutil

    console = Console(highlight=False)
    console.rule("[bold]riverbed demo cluster: losing a whole host")
    root = home / "cluster"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    out = run_cluster_scenario(root, events, console, bed_dir=home / "testbed")
    ok = out.identical and out.complete and out.fenced_ok and out.master_ok
    jobs = out.jobs
    ok = ok and jobs is not None and jobs.exactly_once and jobs.counts_ok
    ok = ok and jobs is not None and jobs.tr_once and jobs.tr_rows_ok
    console.rule("[bold green]done" if ok else "[bold red]mismatch")
    console.print(f"the test bed's action log: {home / 'testbed' / 'actions.log'}")
    return 0 if ok else 1


def run_cluster_scenario(
    root: Path,
    events: int = 40_000,
    console: Console | None = None,
    partition_s: float = 20,
    bed_dir: Path | None = None,
    jobs: bool = True,
) -> Outcome:
    """Run the scenario in ``root`` (the bed goes to ``bed_dir``, else
    ``root/testbed``); see the module docstring."""
    console = console or Console(highlight=False)
    clock = _Clock(console)
    out = Outcome()
    bed = TestBed.create(bed_dir or root / "testbed", hosts=3)
    cluster = Cluster(bed)
    scope = contextlib.ExitStack()
    put = scope.enter_context(overlaid())  # this process plays the driver's machine
    try:
        control = cluster.start_etcd()
        clock(f"etcd: a member on each of h1 h2 h3 ({bed.plan.mode}: {bed.status()['why']})")
        put(cluster.start_s3())
        clock(f"S3 server at the gateway {bed.plan.gateway}, bucket {BUCKET}")
        log_url = cluster.start_log_servers(control)
        put({"RIVERBED_LOG_TOKEN": cluster.token, "RIVERBED_CONTROL": control})
        clock("log servers on h1 h2 h3: diskless topics in the bucket, offsets in etcd")
        # h1 leads the ensemble: h2's loss and h3's cut take only followers, so the
        # Spark masters' sessions (each with its own host's member) ride them out
        cluster.start_zookeeper(leader="h1")
        clock("ZooKeeper: a member on each of h1 h2 h3 (h1's leads the ensemble)")
        master = cluster.start_spark(cores=2, memory="2g", standby="h2", control=control)
        clock(f"Spark standalone: master on h1, standby master on h2 ({master}, announced in "
              "the control plane), a worker on each host")  # fmt: skip

        data = generate(events, flags=20, users=max(events // 4, 1))
        log = riverbed.log.open(log_url)
        log.create_topic("clicks", 4, schema=TOPIC_SCHEMA)
        producer = log.producer("clicks")
        rows = [{"user_id": int(u), "flag": f, "ts": t} for u, f, t in data.itertuples(index=False)]
        chunk = max(len(rows) // 160, 1)  # a chunk each 0.5 s: the chaos happens meanwhile
        first = len(rows) // 4
        producer.send_batch(rows[:first], key_field="flag")
        clock(f"{first:,} of {len(rows):,} events produced into diskless topic clicks")
        produced = threading.Event()
        chaos_over = threading.Event()
        # the rest goes in four parts, the second from the kill of h2 on, the third
        # from the cut of h3 on and the last from the kill of h1 on: each failure has
        # input to show it in, however long the steps before it took (on a slow host the
        # producer used to be done before the cut, and the standby on h2 had no batch to
        # run: CI of 2026-11-28)
        killing, cutting, unmastering = threading.Event(), threading.Event(), threading.Event()
        quarter = (len(rows) - first) // 4
        parts = [
            (None, first, first + quarter),
            (killing, first + quarter, first + 2 * quarter),
            (cutting, first + 2 * quarter, first + 3 * quarter),
            (unmastering, first + 3 * quarter, len(rows)),
        ]
        failures: list[BaseException] = []
        sent = [first]  # events sent so far: the producer's progress

        def produce() -> None:
            try:
                for released, start, end in parts:
                    if released is not None:
                        released.wait()
                    for i in range(start, end, chunk):
                        producer.send_batch(rows[i : min(i + chunk, end)], key_field="flag")
                        sent[0] = min(i + chunk, end)
                        if not chaos_over.is_set():
                            time.sleep(0.5)
            except BaseException as exc:  # reported after the run
                failures.append(exc)
            finally:
                produced.set()

        checkpoints = f"s3://{BUCKET}/checkpoints"
        _done = _Committed(f"{checkpoints}/{NAME}")
        spec = root / f"{NAME}.py"
        spec.write_text(SPEC)

        def driver(host: str) -> None:
            conf = cluster.driver_conf(host)
            conf["spark.cores.max"] = "3"
            env = {
                **cluster.process_env(host, control, log_url),
                "RIVERBED_CHECKPOINTS": checkpoints,
                "RIVERBED_SPARK_MASTER": "riverbed",  # the masters the control plane knows
                "RIVERBED_SPARK_CONF": json.dumps(conf),
            }
            argv = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec),
                    "--ttl", str(TTL), "--max-records-per-batch", str(chunk * 8),
                    "--timestamps"]  # fmt: skip
            bed.spawn(host, "driver", argv, env=env, kind="driver")

        driver("h2")
        _wait("the first committed batch", lambda: _done(), 300)
        clock("active driver on h2: first batch committed")
        driver("h3")
        feeder = threading.Thread(target=produce, daemon=True)
        feeder.start()
        before = len(_done())
        _wait("two more batches", lambda: len(_done()) >= before + 2, 300)
        _wait("the standby's executors", lambda: _warm(bed, "h3", 0), 300)
        clock("hot standby on h3 (its Spark session up, its executors warm, waiting on the "
              "lease)")  # fmt: skip
        old_term = max(r.term or 0 for r in _done().values())

        killed = clock("[bold red]kill-host h2[/bold red]: active driver, Spark worker, log "
                       "server, etcd member SIGKILLed; its disk deleted")  # fmt: skip
        killing.set()
        bed.kill_host("h2")

        def by_term_above(term: int) -> list[int]:
            return sorted(b for b, r in _done().items() if (r.term or 0) > term)

        _wait("a batch by the standby", lambda: by_term_above(old_term), 120)
        out.takeover_s = clock("first batch committed by the standby on h3") - killed
        cluster.wait_etcd(["h1", "h3"])
        mark = _size(bed.service("h2", "driver").log)
        bed.restart_host("h2")
        cluster.wait_etcd()
        cluster.wait_zookeeper()  # h3's cut must leave a quorum: h1 and h2
        clock("h2 restarted with an empty disk: its etcd and ZooKeeper members rejoined, its "
              "Spark worker, standby master and log server are back")  # fmt: skip
        _wait("the driver on h2 to stand by", lambda: _warm(bed, "h2", mark), 300)
        clock("the driver on h2 is the hot standby now (its executors warm)")

        # the active driver's host is cut off: it must stop by itself (self-fencing)
        # before its lease can expire, and the standby on h2 takes over
        h3_term = max(r.term or 0 for r in _done().values())
        cut = clock(f"[bold red]partition h3[/bold red] for {partition_s:.0f}s: the active "
                    "driver, a worker, a log server and an etcd member cut off")  # fmt: skip
        bed.partition("h3")
        cutting.set()
        mark = _size(bed.service("h3", "driver").log)
        _wait("the cut-off driver to stop", lambda: _printed(bed, "h3", mark, "pauses writing"), 60)
        out.fenced_s = clock("the driver on h3 stops writing, by itself: its lease clock ran low "
                             "(it says so)") - cut  # fmt: skip
        first = _wait("a batch by the standby on h2", lambda: by_term_above(h3_term), 120)
        out.partition_takeover_s = clock("first batch committed by the standby on h2") - cut
        left = partition_s - (time.monotonic() - clock.t0 - cut)
        time.sleep(max(left, 0))
        mark = _size(bed.service("h3", "driver").log)
        bed.heal("h3")
        chaos_over.set()
        _wait("the cut-off driver to stand by again",
              lambda: _printed(bed, "h3", mark, "standby for"), 120)  # fmt: skip
        clock("h3 healed; its driver, still running, is the standby now")
        out.partition_batches = len(by_term_above(h3_term))
        # nothing the cut-off driver wrote became current: every batch from the new
        # driver's first on was committed by a newer term
        done = _done()
        out.fenced_ok = all((done[b].term or 0) > h3_term for b in done if b >= first[0])
        _lose_the_master(bed, cluster, clock, _done, unmastering, out)

        wait_while_moving("the producer to send every event", produced.is_set,
                          lambda: f"{sent[0]:,} of {len(rows):,} sent", 240)  # fmt: skip
        if failures:
            raise failures[0]
        clock("producer done")
        ends = {o.partition: o.end for o in log.offsets("clicks")}

        def covered() -> dict[int, int]:  # where the newest committed batch ended
            done = _done()
            return ends_of(done[max(done)].slices or {})

        def caught_up() -> bool:
            return all(covered().get(p, 0) >= e for p, e in ends.items())

        wait_while_moving("the stream to catch up", caught_up, covered, 240)
        clock("the stream caught up with every produced event")
        for svc in bed.services():
            if svc.kind == "driver":  # stopped for good: not started again with its host
                bed.retire(svc.host, svc.name)
        out = _verdict(log, checkpoints, rows, out, console)
        log.close()
        if jobs:
            from riverbed.demo.cluster_jobs import run_jobs_phase

            console.rule("[bold]phase 2: the jobs pipeline, through the same failures")
            out.jobs = run_jobs_phase(bed, cluster, control, log_url, clock, console, root)
    except Exception:
        _last_words(bed, cluster, console)
        raise
    finally:
        out.timeline = clock.lines
        cluster.stop()
        scope.close()
    return out


def _lose_the_master(
    bed: TestBed,
    cluster: Cluster,
    clock: _Clock,
    committed: Any,
    released: threading.Event,
    out: Outcome,
) -> None:
    """Kill the active Spark master's host mid-stream: the standby master leads, the
    running application and the live workers are its, batches go on; then the host comes
    back empty and its master stands by."""
    cluster.wait_zookeeper()  # all three serve: h1's loss leaves a quorum of two
    _wait("the master on h1 to lead", lambda: cluster.active_master() == "h1", 60)
    # the whole cluster first: h3's worker, given up during its cut, registered again
    # (else the new master would not know it, and it would ask again only a minute on)
    cluster.wait_spark_workers("h1", 3)
    apps = {a["id"] for a in cluster.spark_apps("h1") if a.get("state") == "RUNNING"}
    released.set()  # the producer's last part: input for the batches after the kill
    newest = max(committed())
    killed = clock(
        "[bold red]kill-host h1[/bold red]: the active Spark master, a Spark worker, a log "
        "server, an etcd and a ZooKeeper member SIGKILLed; its disk deleted"
    )
    bed.kill_host("h1")
    # batch newest + 1 may have been running at the kill; newest + 2 began after it
    steps: dict[str, Callable[[], bool]] = {
        "leads": lambda: cluster.master_status("h2") == "ALIVE",
        "batch": lambda: max(committed()) >= newest + 2,
    }
    said = {
        "leads": "the standby Spark master on h2 leads: elected through ZooKeeper, it "
        "recovered the workers and applications",
        "batch": "first batch begun after the master's loss committed",
    }
    at: dict[str, float] = {}  # when each was first seen (the clock's reading)

    def both() -> bool:
        for k, ok in steps.items():
            if k not in at and ok():
                at[k] = clock(said[k])
        return len(at) == 2

    _wait("the standby master to lead and a batch begun after the kill", both, 120)
    out.master_s, out.master_batch_s = at["leads"] - killed, at["batch"] - killed
    moved = {a["id"] for a in cluster.spark_apps("h2") if a.get("state") == "RUNNING"}

    def alive() -> list[dict[str, Any]]:
        return [w for w in cluster.spark_workers("h2") if w.get("state") == "ALIVE"]

    # a worker that did not answer the new master within its recovery timeout (a
    # loaded host) is dropped and registers again at its next heartbeat: Spark's way
    with contextlib.suppress(TimeoutError):
        _wait("the live workers on h2's master", lambda: len(alive()) >= 2, 60)
    workers = len(alive())
    out.master_ok = bool(apps) and apps <= moved and workers >= 2
    if not out.master_ok:  # which part did not move, for the verdict (the master's log says why)
        out.master_detail = (
            f"applications running before: {', '.join(sorted(apps)) or 'none'}; on h2 after: "
            f"{', '.join(sorted(moved)) or 'none'}; workers alive on h2: {workers}"
        )
    cluster.wait_etcd(["h2", "h3"])
    bed.restart_host("h1")
    cluster.wait_etcd()
    cluster.wait_zookeeper()
    cluster.wait_spark_workers("h2", 3)
    _wait("h1's master to stand by", lambda: cluster.master_status("h1") == "STANDBY", 120)
    clock("h1 restarted with an empty disk: its master is the standby now, its worker "
          "registered with the master on h2")  # fmt: skip


def _last_words(bed: TestBed, cluster: Cluster, console: Console, lines: int = 12) -> None:
    """When the scenario fails: what each driver, orchestrator and jobs worker printed
    last, a driver's last warnings from Spark, and what the Spark masters say of their
    workers and applications — so the one-line error comes with their side of it (a
    CI run's directory is gone when its output is read)."""
    for svc in bed.services():
        if svc.kind not in ("driver", "orchestrator", "jobs-worker"):
            continue
        with contextlib.suppress(OSError):
            tail = Path(svc.log).read_text(errors="replace").splitlines()[-lines:]
            console.print(f"[bold]{svc.name} on {svc.host}, last lines[/bold] ({svc.log}):")
            for line in tail:
                console.print(f"  {line}", markup=False, highlight=False)
        if svc.kind == "driver":
            _spark_warnings(bed, svc.host, console)
    with contextlib.suppress(Exception):  # evidence, best effort: never the error itself
        for line in cluster.spark_summary():
            console.print(line, markup=False, highlight=False)


def _spark_warnings(bed: TestBed, host: str, console: Console, lines: int = 8) -> None:
    """The last WARN and ERROR lines of the newest Spark log of a driver on ``host``
    (``RIVERBED_HOME/logs`` in its data directory: gone when the host was lost)."""
    logs = sorted((bed.host_dir(host) / "home" / "logs").glob("stream-run-*.log"),
                  key=lambda f: f.stat().st_mtime)  # fmt: skip
    if not logs:
        return
    with contextlib.suppress(OSError):
        text = logs[-1].read_text(errors="replace").splitlines()
        said = [line for line in text if " WARN " in line or " ERROR " in line][-lines:]
        if said:
            console.print(f"[bold]Spark on {host}, last warnings[/bold] ({logs[-1]}):")
            for line in said:
                console.print(f"  {line[:400]}", markup=False, highlight=False)


def _verdict(
    log: Any, checkpoints: str, rows: list[dict[str, Any]], out: Outcome, console: Console
) -> Outcome:
    from riverbed.stream.dataframe import read_results
    from riverbed.stream.layout import output_url

    results = read_results(output_url(checkpoints, NAME))
    events = pd.DataFrame([r.value for p in range(4) for r in log.iter_records("clicks", p)])
    late = set()
    if f"{NAME}.late" in log.topics():
        for p in range(log.topic(f"{NAME}.late").partitions):
            for r in log.iter_records(f"{NAME}.late", p):
                v = r.value
                late.add((v["user_id"], v["flag"], pd.Timestamp(v["ts"])))
    events["ts"] = pd.to_datetime(events["ts"], utc=True)
    sent = pd.DataFrame(rows)
    sent["ts"] = pd.to_datetime(sent["ts"], utc=True)
    key = ["user_id", "flag", "ts"]
    # every acknowledged event is in the topic once: nothing lost, nothing doubled
    out.complete = len(events) == len(sent) and events[key].sort_values(key).reset_index(
        drop=True
    ).equals(sent[key].sort_values(key).reset_index(drop=True))
    merged, out.identical = compare(events, late, results)
    out.windows = len(merged)
    out.events = len(events)
    table = Table(title="what failed, and how long each part took to recover")
    table.add_column("part")
    table.add_column("recovered")
    table.add_row("stream (active driver on h2 lost)",
                  f"first batch by the standby {out.takeover_s:.1f}s after the kill")  # fmt: skip
    table.add_row(
        "Spark master on h1 lost (its host killed)",
        f"the standby master on h2 led {out.master_s:.1f}s after the kill; the first batch "
        f"begun after it committed {out.master_batch_s:.1f}s after it",
    )
    table.add_row("active driver on h3 cut off (partition)",
                  f"it stopped writing {out.fenced_s:.1f}s after the cut (lease TTL {TTL}s); "
                  f"first batch by the standby on h2 {out.partition_takeover_s:.1f}s after "
                  f"it; {out.partition_batches} batches before the heal")  # fmt: skip
    console.print(table)
    console.print(
        "fencing: "
        + ("no batch of the cut-off driver after the takeover" if out.fenced_ok
           else "[bold red]a batch of the cut-off driver's term after the takeover[/bold red]")
    )  # fmt: skip
    console.print(
        "Spark master: "
        + ("the application and the live workers moved to the standby on h2" if out.master_ok
           else "[bold red]the application or the workers did not move to h2[/bold red] "
                f"({out.master_detail})")
    )  # fmt: skip
    console.print(
        f"topic clicks: {out.events:,} events for {len(sent):,} produced — "
        f"[bold]{'NOTHING LOST OR DOUBLED' if out.complete else 'MISMATCH'}[/bold]"
    )
    console.print(
        f"{out.windows:,} windows x flags over {out.events:,} events in the topic "
        f"({len(late)} late): exact distinct users and counts "
        f"[bold]{'IDENTICAL' if out.identical else 'DIFFERENT'}[/bold] to one pass of pandas"
    )
    return out
