"""``riverbed topic|produce|consume|group``: the event log from a shell.

(Over 600 lines: one argparse table for the log's four command families and their thin
handlers, which share how a log, a control plane and a record are opened and printed;
split per family when one grows.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from riverbed.cli._common import Subcommands, shared_options
from riverbed.config import load_config

if TYPE_CHECKING:  # the log's modules load numpy and pyarrow: only commands that use them pay
    from riverbed.control import ControlPlane
    from riverbed.log import Log, Record
    from riverbed.log.base import Damage, PartitionReport, Placement
    from riverbed.log.diskless import DisklessLogStorage

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

LOG_OPTS = (
    "--log",
    {
        "help": "log location: file:///path, memory:// or flight://host:port (default: "
        "RIVERBED_LOG, else RIVERBED_HOME/log)"
    },
)
CONTROL_OPTS = (
    "--control",
    {"help": "control plane URL (default: RIVERBED_CONTROL, else sqlite under RIVERBED_HOME)"},
)
JSON_OPTS = ("--json", {"action": "store_true", "help": "JSON lines output"})


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _duration_ms(text: str) -> int:
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


def add_parsers(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, alter topics")
    common = shared_options(topic, LOG_OPTS, JSON_OPTS)
    cmds = Subcommands(
        topic.add_subparsers(dest="topic_command", metavar="COMMAND", required=True), common
    )
    c = cmds.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--partitioner", default="key-hash", choices=["key-hash", "round-robin"])
    c.add_argument("--serde", default="json", choices=["json", "msgpack", "bytes"])
    c.add_argument("--retention", help="keep at most this age per partition, e.g. 7d, 12h")
    c.add_argument("--retention-bytes", help="keep at most this size per partition, e.g. 10G")
    c.add_argument("--segment-bytes", default="64M", help="segment size (default 64M)")
    c.add_argument("--fsync", default="batch", choices=["batch", "interval", "never"])
    c.add_argument(
        "--schema",
        help='make the topic typed: its fields, e.g. "user_id long, flag string, ts timestamp" '
        "(producers check every value against it)",
    )
    c.set_defaults(func=_topic_create)
    c = cmds.add_parser("list", help="list topics")
    c.set_defaults(func=_topic_list)
    c = cmds.add_parser(
        "describe", help="configuration, offsets per partition, damage and skipped ranges"
    )
    c.add_argument("name")
    c.add_argument(
        "--no-verify",
        action="store_true",
        help="do not read every batch to check it (faster on big topics)",
    )
    c.set_defaults(func=_topic_describe)
    c = cmds.add_parser("verify", help="check every batch and index of a topic (or all)")
    c.add_argument("name", nargs="?", help="the topic (default: every topic)")
    c.add_argument(
        "--rebuild-indexes",
        action="store_true",
        help="rewrite every index from its segment (fixes a corrupt index; the log is untouched)",
    )
    c.set_defaults(func=_topic_verify)
    c = cmds.add_parser(
        "skip",
        help="let readers read past a damaged range of offsets (recorded in the topic)",
    )
    c.add_argument("name")
    c.add_argument("partition", type=int)
    c.add_argument("start", type=int, help="first damaged offset")
    c.add_argument("end", type=int, help="first offset after the damage")
    c.add_argument("--reason", required=True, help="why, for whoever reads describe later")
    c.set_defaults(func=_topic_skip)
    for name, help_ in (
        ("alter", "grow a topic to N partitions; new records are placed by N from now on"),
        ("add-partitions", "the same as alter (its older name)"),
    ):
        c = cmds.add_parser(name, help=help_)
        c.add_argument("name")
        c.add_argument("--partitions", type=int, required=True, help="the new count")
        c.set_defaults(func=_topic_alter)

    produce = sub.add_parser("produce", help="append JSON lines from stdin to a topic")
    produce.add_argument("topic")
    produce.add_argument("--key-field", help="use this field of each record as its key")
    produce.add_argument("--batch", type=int, default=1000, help="records per append")
    shared_options(produce, LOG_OPTS, JSON_OPTS)
    produce.set_defaults(func=_produce)

    consume = sub.add_parser("consume", help="print records as JSON lines and commit")
    consume.add_argument("topic")
    consume.add_argument("--group", required=True)
    consume.add_argument(
        "--from-beginning",
        action="store_true",
        help="a new group starts at the earliest offset (default: latest)",
    )
    consume.add_argument("--max", type=int, help="exit after this many records")
    consume.add_argument("--timeout", type=float, help="exit after this many idle seconds")
    consume.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    shared_options(consume, LOG_OPTS, CONTROL_OPTS, JSON_OPTS)
    consume.set_defaults(func=_consume)

    group = sub.add_parser("group", help="list consumer groups, describe one")
    gcommon = shared_options(group, LOG_OPTS, CONTROL_OPTS, JSON_OPTS)
    gcmds = Subcommands(
        group.add_subparsers(dest="group_command", metavar="COMMAND", required=True), gcommon
    )
    c = gcmds.add_parser("list", help="groups with committed state")
    c.set_defaults(func=_group_list)
    c = gcmds.add_parser("describe", help="members, assignment, offsets and lag")
    c.add_argument("name")
    c.set_defaults(func=_group_describe)
    c = gcmds.add_parser(
        "reset-offsets",
        help="move a stopped group's committed offsets (earliest, latest, N, a time)",
    )
    c.add_argument("name")
    c.add_argument(
        "--to",
        required=True,
        help="earliest, latest, an offset, or an ISO time (UTC unless given): each "
        "partition's first record at or after it",
    )
    c.add_argument("--topic", help="only this topic's partitions")
    c.set_defaults(func=_group_reset)

    serve = sub.add_parser("log", help="serve this machine's log to other machines")
    serve_cmds = serve.add_subparsers(dest="log_command", metavar="COMMAND", required=True)
    c = serve_cmds.add_parser(
        "serve",
        help="serve a log directory over Arrow Flight (clients open flight://HOST:PORT)",
    )
    c.add_argument(
        "--log",
        "--store",
        dest="log",
        help="the log to serve: file:///path, or s3://bucket/prefix — diskless topics, "
        "their offsets in the control plane (RIVERBED_CONTROL): any number of servers "
        "can serve them at once (default: RIVERBED_LOG, else RIVERBED_HOME/log)",
    )
    c.add_argument(
        "--flush-ms",
        type=float,
        default=None,
        help="diskless topics: how long appends wait to share one object (default 50; "
        "lower: faster acknowledgements, more PUTs)",
    )
    c.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    c.add_argument("--port", type=int, default=8815, help="port (default 8815; 0: any free)")
    c.add_argument(
        "--token",
        help="clients must send this token (default: RIVERBED_LOG_TOKEN); required to bind "
        "anything but loopback",
    )
    c.add_argument("--tls-cert", help="PEM certificate: serve TLS (flight+tls://)")
    c.add_argument("--tls-key", help="PEM private key of --tls-cert")
    c.add_argument(
        "--max-batch-bytes", default="64M", help="refuse produced batches over this (default 64M)"
    )
    c.set_defaults(func=_log_serve)


def _log_serve(args: argparse.Namespace) -> int:
    import riverbed.log
    from riverbed.log import LogError
    from riverbed.log.server import LogServer, keep_freed_memory
    from riverbed.log.wire import SCHEMES

    url = args.log or load_config().log_url
    if urlsplit(url).scheme in SCHEMES:
        raise LogError(
            f"{url} is a log server already; serve a file:///path log or s3://bucket/prefix"
        )
    log = riverbed.log.open(url, flush_ms=args.flush_ms)
    token = args.token or os.environ.get("RIVERBED_LOG_TOKEN")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise LogError("TLS needs both --tls-cert and --tls-key")
    tls = None
    if args.tls_cert:
        tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())
    server = LogServer(  # names a taken port or a foreign address itself
        log.storage,
        args.host,
        args.port,
        token=token,
        tls=tls,
        max_batch_bytes=_size(args.max_batch_bytes),
    )
    keep_freed_memory()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from riverbed.control.processes import Presence
    from riverbed.log.discovery import ROLE
    from riverbed.log.diskless import DisklessLogStorage

    # on the control plane: the console's hosts view (this host serves the log), and
    # riverbed:// clients find this server there (riverbed.log.discovery)
    presence, own = None, None
    if isinstance(log.storage, DisklessLogStorage):
        presence = Presence(log.storage.control, ROLE, {"url": server.url, "log": log.url})
    else:  # a file log needs no control plane to serve: announcing is best effort
        from riverbed.control import connect
        from riverbed.errors import RiverbedError

        try:
            own = connect(load_config().control_url)
            presence = Presence(own, ROLE, {"url": server.url, "log": log.url})
        except RiverbedError as exc:  # a control plane out of reach, or misconfigured
            print(  # stderr: the first line of stdout says where it serves
                f"not announced on the control plane ({exc}): riverbed:// will not find it",
                file=sys.stderr,
            )
    if isinstance(log.storage, DisklessLogStorage):  # diskless topics: any server tidies
        threading.Thread(
            target=_maintain,
            args=(log, log.storage, stop),
            name="riverbed-log-maintenance",
            daemon=True,
        ).start()
    guard = "token required" if token else "loopback only, no token"
    out.print(f"serving {log.url} at {server.url} ({guard}{', TLS' if tls else ''})")
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    if presence is not None:
        presence.close()
    if own is not None:
        own.close()
    server.shutdown()
    log.close()
    return 0


MAINTAIN_EVERY_S = 60.0


def _maintain(log: Log, storage: DisklessLogStorage, stop: threading.Event) -> None:
    """Every minute: retention and compaction of every diskless topic, the compaction
    backlog it left, then the objects
    no partition refers to any more (an hour after they were written). Several servers
    doing it at once is safe (compare-and-set, fenced, or idempotent), only redundant."""
    import logging

    while not stop.wait(MAINTAIN_EVERY_S):
        try:
            topics = log.topics()
            for topic in topics:
                storage.enforce_retention(topic)
                storage.compact(topic)
            storage.measure_backlog(topics)  # what this pass left: /metrics, the console
            storage.collect_garbage()
        except Exception as exc:  # the next round tries again; serving goes on
            logging.getLogger("riverbed.log").warning("log maintenance failed: %s", exc)


def _log(args: argparse.Namespace) -> Log:
    import riverbed.log

    return riverbed.log.open(getattr(args, "log", None) or load_config().log_url)


def _control(args: argparse.Namespace) -> ControlPlane:
    from riverbed.control import connect

    return connect(getattr(args, "control", None) or load_config().control_url)


def _topic_create(args: argparse.Namespace) -> int:
    log = _log(args)
    config = log.create_topic(
        args.name,
        args.partitions,
        partitioner=args.partitioner,
        serde=args.serde,
        segment_bytes=_size(args.segment_bytes),
        retention_bytes=_size(args.retention_bytes) if args.retention_bytes else None,
        retention_ms=_duration_ms(args.retention) if args.retention else None,
        fsync=args.fsync,
        schema=args.schema,
    )
    if args.json:
        print(json.dumps(config.to_dict()))
    else:
        typed = f", typed: {config.schema}" if config.schema else ""
        out.print(f"created topic {config.name} with {config.partitions} partitions{typed}")
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    log = _log(args)
    for name in log.topics():
        config = log.topic(name)
        if args.json:
            print(json.dumps({"name": name, "partitions": config.partitions}))
        else:
            out.print(f"{name}  partitions={config.partitions}  serde={config.serde}")
    return 0


def _topic_describe(args: argparse.Namespace) -> int:
    log = _log(args)
    config = log.topic(args.name)
    reports = None if args.no_verify else log.storage.verify(args.name)
    offsets = log.offsets(args.name)
    damaged = [d for r in reports or () for d in r.damage]
    problems = [q for r in reports or () for q in r.index_problems]
    if args.json:
        print(
            json.dumps(
                {
                    **config.to_dict(),
                    "offsets": [
                        {"partition": o.partition, "start": o.start, "end": o.end} for o in offsets
                    ],
                    "verified": reports is not None,
                    "damage": [
                        _damage_json(r.partition, d) for r in reports or () for d in r.damage
                    ],
                    "index_problems": problems,
                }
            )
        )
        return 1 if damaged or problems else 0
    out.print(
        f"[bold]{config.name}[/bold]  partitioner={config.partitioner} "
        f"serde={config.serde} fsync={config.fsync}"
    )
    if config.schema:
        out.print(f"schema: {config.schema}")
    table = Table()
    for col in ("partition", "first offset", "next offset", "records"):
        table.add_column(col, justify="right")
    for o in offsets:
        table.add_row(str(o.partition), str(o.start), str(o.end), str(o.end - o.start))
    out.print(table)
    for epoch in config.epochs:
        out.print(_placement_line(epoch))
    for skip in config.skipped:
        out.print(
            f"skipped: partition {skip.partition} offsets {skip.start}..{skip.end - 1} "
            f"({skip.reason})"
        )
    if reports is None:
        out.print("not verified (--no-verify)")
    elif damaged or problems:
        _print_damage(args.name, reports)
        return 1
    else:
        out.print("every batch verified")
    return 0


def _damage_json(partition: int, damage: Damage) -> dict[str, Any]:
    return {
        "partition": partition,
        "file": damage.path,
        "byte": damage.position,
        "start": damage.start,
        "end": damage.span_end,
        "readable_after": damage.resume is not None and damage.end is not None,
    }


def _print_damage(topic: str, reports: list[PartitionReport]) -> None:
    for r in reports:
        for d in r.damage:
            out.print(f"[red]damaged:[/red] partition {r.partition}: {d.describe()}")
            out.print(
                f"  to read past it: riverbed topic skip {topic} {r.partition} "
                f"{d.start} {d.span_end} --reason '...'",
                soft_wrap=True,
            )
        for q in r.index_problems:
            out.print(f"[red]bad index:[/red] {q}", soft_wrap=True)
            out.print(f"  fix: riverbed topic verify {topic} --rebuild-indexes")


def _topic_verify(args: argparse.Namespace) -> int:
    log = _log(args)
    names = [args.name] if args.name else log.topics()
    bad = 0
    results = {}
    for name in names:
        reports = log.storage.verify(name, rebuild_indexes=args.rebuild_indexes)
        results[name] = reports
        bad += sum(1 for r in reports if not r.ok)
    if args.json:
        print(
            json.dumps(
                {
                    name: [
                        {
                            "partition": r.partition,
                            "start": r.start,
                            "end": r.end,
                            "batches": r.batches,
                            "bytes": r.bytes,
                            "damage": [_damage_json(r.partition, d) for d in r.damage],
                            "skipped": [_damage_json(r.partition, d) for d in r.skipped],
                            "index_problems": list(r.index_problems),
                            "torn_tail_bytes": r.torn_tail,
                        }
                        for r in reports
                    ]
                    for name, reports in results.items()
                }
            )
        )
        return 1 if bad else 0
    for name, reports in results.items():
        batches = sum(r.batches for r in reports)
        size = sum(r.bytes for r in reports)
        state = "[green]ok[/green]" if all(r.ok for r in reports) else "[red]DAMAGED[/red]"
        out.print(f"{name}: {state}  {batches:,} batches, {size:,} bytes checked")
        for r in reports:
            for d in r.skipped:
                out.print(f"  partition {r.partition}: skipped as recorded: {d.describe()}")
            if r.torn_tail:
                out.print(
                    f"  partition {r.partition}: {r.torn_tail} bytes of an unfinished append "
                    "at the end (set aside by the next append)"
                )
        _print_damage(name, reports)
    return 1 if bad else 0


def _topic_skip(args: argparse.Namespace) -> int:
    config = _log(args).storage.skip(args.name, args.partition, args.start, args.end, args.reason)
    if args.json:
        print(json.dumps(config.to_dict()))
    else:
        out.print(
            f"partition {args.partition} of {args.name}: readers now read past offsets "
            f"{args.start}..{args.end - 1} where they are damaged"
        )
    return 0


def _topic_alter(args: argparse.Namespace) -> int:
    log = _log(args)
    before = log.topic(args.name)
    config = log.alter_partitions(args.name, args.partitions)
    if args.json:
        print(json.dumps(config.to_dict()))
    elif config.partitions == before.partitions:
        out.print(
            f"topic {config.name} has {config.partitions} partitions already; nothing changed"
        )
    else:
        out.print(f"topic {config.name}: {before.partitions} → {config.partitions} partitions")
        out.print(_placement_line(config.epochs[-1]))
    return 0


def _placement_line(epoch: Placement) -> str:
    from riverbed.log.log import REFRESH_S

    return (
        f"  placed by {epoch.partitions} from offsets {epoch.starts_text()} on (partition:offset; "
        f"producers follow within {REFRESH_S:g} s)"
    )


def _produce(args: argparse.Namespace) -> int:
    from riverbed.log import LogError
    from riverbed.log.errors import RecordRejectedError

    log = _log(args)
    producer = log.producer(args.topic)
    batch: list[Any] = []
    lines: list[int] = []  # the stdin line of each batched value
    count = 0
    tty = sys.stdin.isatty() is False and sys.stderr.isatty()
    progress = Progress(console=err, transient=True) if tty else None
    task = progress.add_task(f"producing to {args.topic}", total=None) if progress else None

    def send() -> int:
        """Send the batch; a value a typed topic refuses stops the run after the values
        before it are written, as a line that is not JSON does."""
        try:
            return len(producer.send_batch(batch, key_field=args.key_field))
        except RecordRejectedError as exc:
            sent = len(producer.send_batch(batch[: exc.index], key_field=args.key_field))
            what = f"field '{exc.field}'" if exc.field is not None else "the record"
            raise LogError(
                f"stdin line {lines[exc.index]}: topic '{args.topic}' refused {what} "
                f"{exc.reason}; "
                f"the {count + sent} records before it were produced"
            ) from None

    if progress:
        progress.start()
    try:
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            try:
                batch.append(json.loads(line))
                lines.append(n)
            except ValueError as exc:
                if batch:
                    count += send()
                raise LogError(
                    f"stdin line {n} is not JSON ({exc}): {line[:80]!r}; the {count} records "
                    "before it were produced"
                ) from None
            if len(batch) >= args.batch:
                count += send()
                batch, lines = [], []
                if progress and task is not None:
                    progress.update(task, completed=count)
        if batch:
            count += send()
    finally:
        if progress:
            progress.stop()
    if args.json:
        print(json.dumps({"topic": args.topic, "records": count}))
    else:
        err.print(f"produced {count} records to {args.topic}")
    return 0


def _json_default(value: object) -> object:
    """A typed topic's timestamps and dates as ISO text, its binary fields as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _record_json(record: Record) -> str:
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp.isoformat(),
            "key": record.key.decode("utf-8", "backslashreplace") if record.key else None,
            "value": record.value
            if not isinstance(record.value, bytes)
            else record.value.decode("utf-8", "backslashreplace"),
        },
        default=_json_default,
    )


def _consume(args: argparse.Namespace) -> int:
    log = _log(args)
    cp = _control(args)
    seen = 0
    idle_since = None
    with log.consumer(
        cp,
        args.group,
        args.topic,
        session_ttl=args.ttl,
        start_from="earliest" if args.from_beginning else "latest",
    ) as consumer:
        while True:
            records = consumer.poll(
                timeout=0.5,
                max_records=100 if args.max is None else max(1, min(100, args.max - seen)),
            )
            if not records:
                idle_since = idle_since or time.monotonic()
                if args.timeout is not None and time.monotonic() - idle_since >= args.timeout:
                    break
                continue
            idle_since = None
            for record in records:
                print(_record_json(record), flush=True)
                seen += 1
            if args.max is not None and seen >= args.max:
                break
        consumer.commit()
    cp.close()
    return 0


def _group_list(args: argparse.Namespace) -> int:
    from riverbed.log.group.consumer import list_groups

    cp = _control(args)
    for name in list_groups(cp):
        print(json.dumps({"group": name}) if args.json else name)
    cp.close()
    return 0


def _group_reset(args: argparse.Namespace) -> int:
    from riverbed.log.group.consumer import reset_offsets

    cp = _control(args)
    log = _log(args)
    try:
        new = reset_offsets(log, cp, args.name, args.to, args.topic)
    finally:
        cp.close()
        log.close()
    if args.json:
        print(json.dumps(new))
    else:
        out.print(f"group {args.name}: " + ", ".join(f"{tp} → {o}" for tp, o in new.items()))
    return 0


def _group_describe(args: argparse.Namespace) -> int:
    from riverbed.inspect import group_of

    cp = _control(args)
    log = _log(args)
    try:
        desc = group_of(log, cp, args.name)  # what the console's group page shows
    finally:
        cp.close()
        log.close()
    if args.json:
        print(json.dumps(desc))
        return 0
    out.print(
        f"group [bold]{desc['group']}[/bold]  generation {desc['generation']}  "
        f"leader {desc['leader'] or '-'}  members: {', '.join(desc['members']) or '-'}"
    )
    table = Table()
    for col in ("topic", "partition", "owner", "committed", "end", "lag"):
        table.add_column(col)
    for p in desc["partitions"]:
        table.add_row(
            p["topic"],
            str(p["partition"]),
            p["owner"] or "-",
            "-" if p["committed"] is None else str(p["committed"]),
            str(p["end"]),
            str(p["lag"]),
        )
    out.print(table)
    return 0
